// kiln/distributed/environment.cpp — init(): the launcher's variables, the GPU of the local rank, the bootstrap
// (MPI or TCP), and the registry of world groups that group(device) hands out.
#include "kiln/distributed/environment.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "kiln/data/distributed_env.h"
#include "kiln/distributed/detail/group_internal.h"
#include "kiln/distributed/process_group.h"
#include "kiln/tensor/cuda.h"

namespace kiln::dist {
namespace {

struct Launcher {
  const char* name;
  const char* size_var;        // set by this launcher (the same order as data::distributed_env)
  const char* local_size_var;  // processes on this node
  bool mpi;                    // processes started by it can call MPI_Init
};
constexpr Launcher kLaunchers[] = {
    {"Open MPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", true},
    {"MPICH/Hydra", "PMI_SIZE", "MPI_LOCALNRANKS", true},
    {"torchrun", "WORLD_SIZE", "LOCAL_WORLD_SIZE", false},
    {"SLURM", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", true},
};

std::optional<int> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  // Slurm writes "2(x3)" for 3 nodes of 2 tasks: the leading number is this node's.
  if (end == v || x < 0 || x > (1 << 30)) return std::nullopt;
  return static_cast<int>(x);
}

struct State {
  std::mutex mutex;
  bool initialized = false;
  bool finalized = false;
  bool mpi_owned = false;  // kiln called MPI_Init, so kiln finalizes
  Env env;
  InitOptions options;
  std::unique_ptr<detail::Rendezvous> rendezvous;
  // World groups by device: -1 = cpu, else the CUDA index.
  std::map<int, std::unique_ptr<ProcessGroup>> groups;
};

State& state() {
  static State* s = new State;  // never destroyed: finalize() at exit releases what it holds
  return *s;
}

void finalize_at_exit() { finalize(); }

std::chrono::milliseconds timeout_from_env(std::chrono::milliseconds fallback) {
  const char* v = std::getenv("KILN_DIST_TIMEOUT_S");
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  KILN_CHECK(end != v && *end == '\0' && s > 0, "dist::init: KILN_DIST_TIMEOUT_S='", v,
             "' is not a positive number of seconds; fix or unset it");
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
}

// Sets up the bootstrap for a job of several processes.
void start_bootstrap(State& s, const Launcher* launcher) {
  Bootstrap how = s.options.bootstrap;
#if defined(KILN_WITH_MPI)
  if (how == Bootstrap::Auto) how = (launcher != nullptr && launcher->mpi) ? Bootstrap::Mpi : Bootstrap::Tcp;
#else
  KILN_CHECK(how != Bootstrap::Mpi, "dist::init: Bootstrap::Mpi asked for, but this kiln was built without MPI ",
             "(KILN_MPI=OFF); rebuild with -DKILN_MPI=ON, or use the TCP bootstrap (MASTER_ADDR, MASTER_PORT)");
  if (how == Bootstrap::Auto) how = Bootstrap::Tcp;
#endif
  const Env& e = s.env;
  if (how == Bootstrap::Mpi) {
#if defined(KILN_WITH_MPI)
    s.mpi_owned = detail::mpi_init(e.rank, e.world_size);
    s.rendezvous = detail::make_mpi_rendezvous();
    s.env.bootstrap = "mpi";
#endif
    return;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  const std::optional<int> port = env_int("MASTER_PORT");
  KILN_CHECK(addr != nullptr && *addr != '\0' && port && *port > 0 && *port < 65536, "dist::init: rank ", e.rank,
             " of ", e.world_size, " (", e.launcher, ") needs MASTER_ADDR and MASTER_PORT for the TCP bootstrap",
             " (got MASTER_ADDR=", addr ? addr : "<unset>", ", MASTER_PORT=",
             std::getenv("MASTER_PORT") ? std::getenv("MASTER_PORT") : "<unset>",
             "); set them to rank 0's host and a free port, e.g. MASTER_ADDR=127.0.0.1 MASTER_PORT=29500",
#if defined(KILN_WITH_MPI)
             ", or start the job with mpirun"
#else
             " (this kiln was built without MPI)"
#endif
  );
  s.rendezvous = detail::make_tcp_rendezvous(addr, *port, e.rank, e.world_size, s.options.timeout);
  s.env.bootstrap = "tcp";
}

}  // namespace

const Env& init(const InitOptions& options) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (s.initialized) return s.env;
  KILN_CHECK(!s.finalized, "dist::init: called after dist::finalize(); a process joins a job once");
  s.options = options;
  s.options.timeout = timeout_from_env(options.timeout);
  KILN_CHECK(s.options.timeout.count() > 0, "dist::init: the timeout must be positive");

  const data::DistributedEnv de = data::distributed_env();  // throws on malformed variables
  Env& e = s.env;
  e.rank = de.rank;
  e.world_size = de.world_size;
  e.local_rank = de.local_rank;
  e.launcher = "none";
  e.bootstrap = "none";
  const Launcher* launcher = nullptr;
  if (de.world_size > 1 || std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
      std::getenv("WORLD_SIZE") || std::getenv("SLURM_NTASKS")) {
    for (const Launcher& l : kLaunchers) {
      if (env_int(l.size_var)) {
        launcher = &l;
        break;
      }
    }
  }
  if (launcher != nullptr) {
    e.launcher = launcher->name;
    e.local_world_size = env_int(launcher->local_size_var).value_or(e.world_size);
  }
  e.local_world_size = std::max(e.local_world_size, e.local_rank + 1);

  if (options.use_gpu && cuda::device_count() > 0) {
    const int n = cuda::device_count();
    // One GPU per process on the node; more processes than GPUs share them round robin (NCCL refuses
    // two ranks on one GPU, which the NCCL group then reports).
    const int gpu = e.local_rank % n;
    cuda::set_device(gpu);
    e.device_ = Device::cuda(gpu);
  }
  if (e.world_size > 1) start_bootstrap(s, launcher);
  s.initialized = true;
  static bool registered = false;
  if (!registered) {
    std::atexit(finalize_at_exit);
    registered = true;
  }
  return e;
}

bool is_initialized() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.initialized;
}

const Env& env() {
  {
    State& s = state();
    std::lock_guard lock(s.mutex);
    if (s.initialized) return s.env;
  }
  return init();
}

const InitOptions& init_options() {
  env();
  return state().options;
}

void finalize() {
  State& s = state();
  std::unique_lock lock(s.mutex);
  if (!s.initialized) return;
  // NCCL communicators first (their destruction may still talk to peers), then the bootstrap, then MPI.
  auto groups = std::move(s.groups);
  auto rendezvous = std::move(s.rendezvous);
  s.initialized = false;
  s.finalized = true;
  lock.unlock();
  groups.clear();
  rendezvous.reset();
#if defined(KILN_WITH_MPI)
  if (s.mpi_owned) detail::mpi_finalize();
#endif
}

ProcessGroup& group(Device device) {
  const Env& e = env();
  State& s = state();
  std::lock_guard lock(s.mutex);
  KILN_CHECK(s.initialized, "dist::group: dist::finalize() was called; no collectives after it");
  const int key = device.is_cuda() ? device.index() : -1;
  auto it = s.groups.find(key);
  if (it != s.groups.end()) return *it->second;
  std::unique_ptr<ProcessGroup> g;
  if (e.world_size == 1) {
    g = detail::make_single_group(device);
  } else if (device.is_cuda()) {
#if defined(KILN_WITH_NCCL)
    KILN_CHECK(device == e.device(), "dist::group: rank ", e.rank, " uses ", e.device(),
               " (its local rank's GPU); collectives on ", device, " are not supported: move the tensor to ",
               e.device());
    g = detail::make_nccl_group(detail::group_config(), *s.rendezvous, device.index());
#else
    KILN_FAIL("dist::group: collectives on ", device, " need NCCL, and this kiln was built without CUDA");
#endif
  } else {
#if defined(KILN_WITH_MPI)
    KILN_CHECK(e.bootstrap == "mpi", "dist::group: collectives on CPU tensors use MPI, but rank ", e.rank,
               " joined through ", e.bootstrap, " (", e.launcher, "); start the job with mpirun, or move the ",
               "tensors to the GPU (NCCL)");
    g = detail::make_mpi_group(detail::group_config());
#else
    KILN_FAIL("dist::group: collectives on CPU tensors need MPI, and this kiln was built without it ",
              "(KILN_MPI=OFF); rebuild with -DKILN_MPI=ON and start the job with mpirun, or use GPU tensors");
#endif
  }
  return *s.groups.emplace(key, std::move(g)).first->second;
}

namespace detail {

Rendezvous& rendezvous() {
  State& s = state();
  KILN_CHECK(s.rendezvous != nullptr, "dist: no bootstrap: the job has one process, or dist::init() was not called");
  return *s.rendezvous;
}

GroupConfig group_config() {
  State& s = state();
  return {s.env.rank, s.env.world_size, s.options.timeout, s.options.on_timeout};
}

}  // namespace detail
}  // namespace kiln::dist
