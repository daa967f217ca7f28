// kiln/data/distributed_env.cpp — rank and world size from the launcher's environment variables.
#include "kiln/data/distributed_env.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "kiln/tensor/error.h"

namespace kiln::data {

namespace {

struct Family {
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* launcher;
};

constexpr Family kFamilies[] = {
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPICH/Hydra"},
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM"},
};

// The variable as a non-negative int; nullopt when unset. Anything else than digits throws.
std::optional<int> read(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  const std::string s(v);
  bool digits = !s.empty() && s.size() <= 9;
  for (char c : s) digits = digits && c >= '0' && c <= '9';
  KILN_CHECK(digits, "distributed_env: environment variable ", name, "='", s,
             "' is not a non-negative integer; fix or unset it (the launcher sets it)");
  return std::stoi(s);
}

}  // namespace

DistributedEnv distributed_env() {
  for (const Family& f : kFamilies) {
    const std::optional<int> rank = read(f.rank);
    const std::optional<int> size = read(f.size);
    if (!rank && !size) continue;
    KILN_CHECK(rank && size, "distributed_env: ", rank ? f.rank : f.size, " is set but ", rank ? f.size : f.rank,
               " is not (", f.launcher, " sets both); set or unset both");
    KILN_CHECK(*size >= 1, "distributed_env: ", f.size, "=", *size, " must be at least 1");
    KILN_CHECK(*rank < *size, "distributed_env: ", f.rank, "=", *rank, " is not below ", f.size, "=", *size,
               "; ranks are 0..", *size - 1);
    const std::optional<int> local = read(f.local_rank);
    KILN_CHECK(!local || *local < *size, "distributed_env: ", f.local_rank, "=", *local, " is not below ", f.size,
               "=", *size);
    return {*rank, *size, local ? *local : *rank};
  }
  return {};
}

}  // namespace kiln::data
