// kiln/distributed/environment.h — joining a multi-process job: rank, world size, the GPU of this process.
//
//   auto env = kiln::dist::init();          // single process, or one rank of `mpirun -np N` / torchrun / srun
//   Device dev = env.device();              // cuda:<local rank> when a GPU is there, else cpu
//   if (env.is_main()) std::cout << "training on " << env.world_size << " processes\n";
//
// init() reads the launcher's variables (data::distributed_env(): Open MPI, MPICH/Hydra, RANK/WORLD_SIZE,
// Slurm), makes the local rank's GPU current, and sets up the bootstrap that process groups use to meet:
// MPI when kiln is built with MPI and the job was started by an MPI launcher (or Slurm), otherwise a TCP
// rendezvous at MASTER_ADDR:MASTER_PORT (rank 0 listens). Without any launcher it is a single process
// (world size 1) and every collective is a no-op. Calling init() again returns the same environment.
// MPI is finalized and communicators are destroyed at exit (or by finalize()).
#pragma once

#include <chrono>
#include <string>

#include "kiln/tensor/device.h"
#include "kiln/tensor/error.h"

namespace kiln::dist {

// A collective or bootstrap failure: the message names the rank, the collective and its sequence number.
class DistributedError : public Error {
 public:
  // Constructs from a message, as kiln::Error.
  using Error::Error;
};
// A collective that did not finish within the timeout.
class TimeoutError : public DistributedError {
 public:
  using DistributedError::DistributedError;
};

// What happens when a collective does not finish within the timeout.
enum class OnTimeout {
  Exit,   // print the error, abort the communicator and end the process with kTimeoutExitCode, so that
          // mpirun (or torchrun, srun) ends the whole job instead of leaving the other ranks hanging
  Throw,  // abort the communicator and raise TimeoutError from the waiting call (the group is unusable after)
};
// The exit status of a process that OnTimeout::Exit ends.
constexpr int kTimeoutExitCode = 3;

// How the ranks of a job find one another in dist::init() (InitOptions::bootstrap).
enum class Bootstrap {
  Auto,  // MPI when built with it and started by an MPI launcher or Slurm; else TCP
  Mpi,   // through MPI (kiln built with it)
  Tcp,   // MASTER_ADDR / MASTER_PORT (rank 0 listens there)
};

// How dist::init() bootstraps (MPI, TCP, or chosen from the launcher), how long a collective may wait and what a
// timeout does, and whether ranks use GPUs.
struct InitOptions {
  // Longest wait for any one collective (and for the bootstrap to meet). KILN_DIST_TIMEOUT_S overrides it.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  OnTimeout on_timeout = OnTimeout::Exit;  // what a timeout does (the default ends the process)
  Bootstrap bootstrap = Bootstrap::Auto;   // how the ranks meet
  bool use_gpu = true;                     // device() is cuda:<local rank> when GPUs are visible
};

// This process's place in the job (rank, world size, local rank) and its device, as dist::init() returns it.
struct Env {
  int rank = 0;                    // 0 .. world_size - 1
  int world_size = 1;              // processes in the job
  int local_rank = 0;              // this process's index on its node
  int local_world_size = 1;        // processes on this node, as the launcher reports it
  std::string launcher{};          // "none", "Open MPI", "MPICH/Hydra", "torchrun", "SLURM"
  std::string bootstrap{};         // "none", "mpi", "tcp"
  Device device_ = Device::cpu();  // what device() returns

  // cuda:<local_rank % GPU count> when use_gpu and GPUs are visible (made current by init()), else the CPU.
  Device device() const { return device_; }
  // Whether this is rank 0 (the process that usually logs and saves).
  bool is_main() const { return rank == 0; }
  // Whether the job has more than one process.
  bool distributed() const { return world_size > 1; }
};

// Joins the job (idempotent: later calls return the first result; options are read once).
const Env& init(const InitOptions& options = {});
bool is_initialized();  // whether init() has succeeded (and finalize() not run since)
// The environment of init(); calls init() with default options when it was not called yet.
const Env& env();
// env().rank (calls init() if needed).
inline int rank() { return env().rank; }
// env().world_size (calls init() if needed).
inline int world_size() { return env().world_size; }
// Destroys every process group and finalizes MPI (also done at exit). Collectives are errors afterwards.
void finalize();

// The options init() was given (after KILN_DIST_TIMEOUT_S).
const InitOptions& init_options();

}  // namespace kiln::dist
