// kiln/distributed/detail/group_internal.h — what the process-group backends share (internal, not installed).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "kiln/distributed/process_group.h"

namespace kiln::dist::detail {

// How the processes of the job first meet: moves a few bytes from one rank to all (the NCCL unique id).
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // data (n bytes) of `root` is copied into every rank's data.
  virtual void broadcast(void* data, size_t n, int root) = 0;
  virtual void barrier() = 0;
};

struct GroupConfig {
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{600000};
  OnTimeout on_timeout = OnTimeout::Exit;
};

// The bootstrap init() set up (MPI or TCP); throws when world size is 1 (nothing to meet).
Rendezvous& rendezvous();
GroupConfig group_config();

// Backends. make_nccl_group: the group of CUDA device `device` (compiled with KILN_WITH_NCCL);
// make_mpi_group: MPI_COMM_WORLD for CPU tensors (KILN_WITH_MPI).
std::unique_ptr<ProcessGroup> make_nccl_group(const GroupConfig& config, Rendezvous& rendezvous, int device);
std::unique_ptr<ProcessGroup> make_mpi_group(const GroupConfig& config);
std::unique_ptr<ProcessGroup> make_single_group(Device device);
// The TCP rendezvous: rank 0 listens on addr:port, the others connect (retrying until timeout).
std::unique_ptr<Rendezvous> make_tcp_rendezvous(const std::string& addr, int port, int rank, int size,
                                                std::chrono::milliseconds timeout);
std::unique_ptr<Rendezvous> make_mpi_rendezvous();  // KILN_WITH_MPI; MPI initialised by init()
// KILN_WITH_MPI: initialises MPI (thread support MULTIPLE when available) unless the program already did, and
// checks that MPI's rank and size are the launcher's; returns whether kiln initialised it.
bool mpi_init(int expected_rank, int expected_size);
void mpi_finalize();  // MPI_Finalize, when MPI is initialised and not finalized yet

// "all_reduce #12 (Sum) of 1048576 float32 elements on cuda:0" — for error messages.
std::string describe(const char* what, uint64_t seq, const Tensor& t);
// The message of a timeout, naming the rank, the collective and the timeout it exceeded (the configured one).
std::string timeout_message(int rank, const std::string& backend, const std::string& collective,
                            std::chrono::milliseconds timeout);
// OnTimeout::Exit: prints the message to stderr and ends the process with kTimeoutExitCode.
[[noreturn]] void exit_after_timeout(const std::string& message);

}  // namespace kiln::dist::detail
