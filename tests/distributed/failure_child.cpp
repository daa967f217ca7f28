// A 2-rank job that fails on purpose (run by run_failure_test.sh under mpirun -np 2):
//   hang_exit   rank 1 never joins an all_reduce; rank 0's times out (1 s) and ends the process, and mpirun the job
//   hang_throw  the same with OnTimeout::Throw: rank 0 catches TimeoutError, prints it and exits 0; rank 1 gives up
//   kill        rank 1 is killed (SIGKILL) before the all_reduce; the job must still end
// Every rank prints what it does, so the driver can check the messages.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: failure_child hang_exit|hang_throw|kill\n");
    return 2;
  }
  const std::string mode = argv[1];
  const bool on_gpu = std::getenv("KILN_FAILURE_GPU") != nullptr;
  const dist::Env& env =
      dist::init({.timeout = std::chrono::milliseconds(1000),
                  .on_timeout = mode == "hang_throw" ? dist::OnTimeout::Throw : dist::OnTimeout::Exit,
                  .use_gpu = on_gpu});
  const Device dev = env.device();
  Tensor t = internal::ones({1024}, {.device = dev});
  dist::all_reduce(t);  // #0: everyone joins
  std::printf("rank %d: first all_reduce gave %.0f\n", env.rank, t.sum().item<double>());
  std::fflush(stdout);
  if (env.rank == 1) {
    if (mode == "kill") std::raise(SIGKILL);
    // Hangs: stays away from collective #1 for longer than rank 0's timeout.
    std::this_thread::sleep_for(std::chrono::seconds(mode == "hang_throw" ? 4 : 60));
    std::printf("rank 1: giving up\n");
    std::fflush(stdout);
    std::_Exit(0);  // finalize would wait for rank 0's aborted collective
  }
  try {
    dist::all_reduce(t);  // #1: rank 1 never comes
    if (dev.is_cuda()) cuda::synchronize();
    std::printf("rank 0: second all_reduce returned (unexpected)\n");
    return 1;
  } catch (const dist::TimeoutError& e) {
    std::printf("rank 0 caught TimeoutError: %s\n", e.what());
    std::fflush(stdout);
    std::_Exit(0);
  }
}
