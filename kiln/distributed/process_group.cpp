// kiln/distributed/process_group.cpp — what every backend shares: argument checks and sequence numbers, the
// messages of failures and timeouts, the single-process group, and barrier().
#include "kiln/distributed/process_group.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "kiln/distributed/detail/group_internal.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::dist {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "Sum";
    case ReduceOp::Average: return "Average";
    case ReduceOp::Max: return "Max";
    case ReduceOp::Min: return "Min";
  }
  return "?";
}

uint64_t ProcessGroup::begin(const char* what, const Tensor& t, Device device) {
  check_tensor(what, seq_, t, device);
  return seq_++;
}

void ProcessGroup::check_tensor(const char* what, uint64_t seq, const Tensor& t, Device device) const {
  KILN_CHECK_AS(DistributedError, t.defined(), "dist::", what, " #", seq, " on rank ", rank_,
                ": the tensor is undefined");
  KILN_CHECK_AS(DistributedError, t.device() == device, "dist::", what, " #", seq, " on rank ", rank_,
                ": the tensor is on ", t.device(), " but this ", backend(), " group works on ", device,
                "; move it there (or use dist::group(tensor.device()))");
  KILN_CHECK_AS(DistributedError, t.is_contiguous(), "dist::", what, " #", seq, " on rank ", rank_,
                ": the tensor (shape ", t.shape(), ", strides ", t.strides(),
                ") is not contiguous; collectives work in place on contiguous memory: pass t.contiguous() and ",
                "copy the result back");
}

void barrier() {
  const Env& e = env();
  if (e.world_size == 1) return;
#if defined(KILN_WITH_MPI)
  if (e.bootstrap == "mpi") {
    group(Device::cpu()).barrier();
    return;
  }
#endif
  KILN_CHECK(e.device().is_cuda(), "dist::barrier: rank ", e.rank, " has no GPU and no MPI; nothing to wait with");
  group(e.device()).barrier();
}

std::function<void(const Tensor& amaxes)> fp8_amax_reduction() {
  return [](const Tensor& amaxes) {
    if (env().world_size == 1) return;  // one process: its own amaxes are everyone's
    all_reduce(amaxes, ReduceOp::Max);
  };
}

namespace detail {

std::string describe(const char* what, uint64_t seq, const Tensor& t) {
  std::ostringstream s;
  s << what << " #" << seq << " of " << t.numel() << " " << dtype_name(t.dtype()) << " elements on " << t.device();
  return s.str();
}

std::string timeout_message(int rank, const std::string& backend, const std::string& collective,
                            std::chrono::milliseconds timeout) {
  std::ostringstream s;
  s << "kiln.dist: rank " << rank << ": " << collective << " (" << backend << ") did not finish within "
    << timeout.count() / 1000.0 << " s; the " << backend << " communicator is aborted. Another rank has probably "
    << "died, hung, or called a different collective (every rank must call the same collectives in the same "
    << "order). Raise the timeout with dist::InitOptions::timeout or KILN_DIST_TIMEOUT_S if the wait was expected.";
  return s.str();
}

void exit_after_timeout(const std::string& message) {
  std::fprintf(stderr, "%s\nkiln.dist: ending this process with exit code %d so that the launcher ends the job\n",
               message.c_str(), kTimeoutExitCode);
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(kTimeoutExitCode);
}

namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  void synchronize() override {}
  bool is_completed() override { return true; }
};

// World size 1: nothing to exchange. Checks stay, so that a program that runs on one process runs on many.
class SingleGroup final : public ProcessGroup {
 public:
  explicit SingleGroup(Device device) : ProcessGroup(0, 1), device_(device) {}
  std::string backend() const override { return "single"; }
  Device device() const override { return device_; }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp) override {
    begin("all_reduce", t, device_);
    return std::make_shared<DoneWork>();
  }
  WorkPtr broadcast_async(const Tensor& t, int root) override {
    begin("broadcast", t, device_);
    KILN_CHECK_AS(DistributedError, root == 0, "dist::broadcast: root ", root, " is not a rank (world size 1)");
    return std::make_shared<DoneWork>();
  }
  WorkPtr all_gather_async(const Tensor& out, const Tensor& input) override {
    check_tensor("all_gather", begin("all_gather", input, device_), out, device_);
    KILN_CHECK_AS(DistributedError, out.numel() == input.numel() && out.dtype() == input.dtype(),
                  "dist::all_gather: out has ", out.numel(), " ", dtype_name(out.dtype()), " elements; expected ",
                  input.numel(), " ", dtype_name(input.dtype()), " (world size 1 × the input's)");
    if (!out.is_same(input)) out.view(input.shape()).copy_(input);
    return std::make_shared<DoneWork>();
  }
  WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& input, ReduceOp) override {
    check_tensor("reduce_scatter", begin("reduce_scatter", input, device_), out, device_);
    KILN_CHECK_AS(DistributedError, out.numel() == input.numel() && out.dtype() == input.dtype(),
                  "dist::reduce_scatter: the input has ", input.numel(), " ", dtype_name(input.dtype()),
                  " elements; expected ", out.numel(), " ", dtype_name(out.dtype()), " (world size 1 × out's)");
    if (!out.is_same(input)) Tensor(out).copy_(input.view(out.shape()));
    return std::make_shared<DoneWork>();
  }
  void barrier() override {}

 private:
  Device device_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_single_group(Device device) { return std::make_unique<SingleGroup>(device); }

}  // namespace detail
}  // namespace kiln::dist
