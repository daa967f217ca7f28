// One rank of a job started without mpirun, torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT set by run_tcp_test.sh): joins through the TCP rendezvous, then all-reduces on its GPU through NCCL
// when every rank has one, and otherwise shows that CPU collectives ask for MPI. Prints what it saw.
#include <cstdio>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

int main() {
  try {
    const dist::Env& env = dist::init({.timeout = std::chrono::seconds(30)});
    std::printf("rank %d of %d: launcher %s, bootstrap %s, device %s\n", env.rank, env.world_size, env.launcher.c_str(),
                env.bootstrap.c_str(), env.device().is_cuda() ? "cuda" : "cpu");
    if (env.device().is_cuda() && cuda::device_count() >= env.local_world_size) {
      Tensor t = internal::full({1000}, env.rank + 1.0, {.device = env.device()});
      dist::all_reduce(t);
      std::printf("rank %d: nccl all_reduce gave %.0f\n", env.rank, t.sum().item<double>());
    } else {
      try {
        Tensor t = internal::ones({4});
        dist::all_reduce(t);
        std::printf("rank %d: cpu all_reduce ran without MPI (unexpected)\n", env.rank);
        return 1;
      } catch (const Error& e) {
        std::printf("rank %d: cpu all_reduce refused: %s\n", env.rank, e.what());
      }
    }
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
