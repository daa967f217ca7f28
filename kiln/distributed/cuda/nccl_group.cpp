// kiln/distributed/cuda/nccl_group.cpp — the NCCL process group for CUDA tensors (make_nccl_group).
//
// Collectives run on a high-priority communication stream of the device, so they overlap with compute.
// Each one: an event on the caller's current stream that the communication stream waits for (the collective
// reads what was queued before it, e.g. the gradients of backward), the NCCL call, record_stream for every
// tensor (the caching allocator must not reuse their memory before the collective is done), and an end event
// that Work::wait() makes the caller's current stream wait for: no host synchronisation anywhere.
//
// A watchdog thread polls the end events of the collectives in flight and NCCL's asynchronous error. A
// collective older than the timeout (or an NCCL error) aborts the communicator, then either ends the process
// (OnTimeout::Exit, so that the launcher ends the whole job instead of leaving the other ranks hanging) or
// makes every later call on the group, and every wait on its Work, throw (OnTimeout::Throw).
#if defined(KILN_WITH_NCCL)

#include <cuda_runtime.h>  // cudaStream_t
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "kiln/distributed/detail/group_internal.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/trace.h"  // a trace range per collective

namespace kiln::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;
using kiln::detail::str_cat;

constexpr auto kWatchdogInterval = std::chrono::milliseconds(50);
// How long an abort waits for an NCCL call in flight on the caller's thread to return (it aborts anyway after:
// a call stuck in NCCL is what the abort unblocks).
constexpr auto kAbortLockWait = std::chrono::seconds(2);
// OnTimeout::Exit: the longest wait for ncclCommAbort before ending the process regardless.
constexpr auto kExitAbortGrace = std::chrono::seconds(10);
constexpr auto kMaxPollSleep = std::chrono::microseconds(500);
// Creating a communicator is not a collective: it takes NCCL a second or more (more on many nodes), so it gets at
// least this long, whatever short timeout the collectives have.
constexpr auto kMinCreationTimeout = std::chrono::milliseconds(20000);

const char* nccl_hint(ncclResult_t r) {
  switch (r) {
    case ncclSystemError:
    case ncclRemoteError:
      return "; a peer has probably died or the network failed. Set NCCL_DEBUG=WARN for NCCL's own diagnosis "
             "(and NCCL_SOCKET_IFNAME if the hosts have several network interfaces)";
    case ncclInvalidUsage:
    case ncclInvalidArgument:
      return "; every rank must call the same collectives, with the same sizes and dtypes, in the same order "
             "(NCCL_DEBUG=WARN says more)";
    case ncclUnhandledCudaError: return "; a CUDA call inside NCCL failed (out of memory?); NCCL_DEBUG=WARN says more";
    default: return "; set NCCL_DEBUG=WARN for NCCL's own diagnosis";
  }
}

[[noreturn]] void throw_nccl_error(ncclResult_t r, const char* call, const std::string& what, ncclComm_t comm,
                                   int rank) {
  const char* last = ncclGetLastError(comm);
  throw DistributedError(str_cat("dist: rank ", rank, ": ", what, ": ", call, " failed: ", ncclGetErrorString(r),
                                 last != nullptr && *last != '\0' ? str_cat(" (", last, ")") : std::string(),
                                 nccl_hint(r)));
}

#define KILN_NCCL_CHECK(call, what, comm, rank)              \
  do {                                                       \
    const ncclResult_t kiln_nccl_ = (call);                  \
    if (kiln_nccl_ != ncclSuccess) [[unlikely]]              \
      throw_nccl_error(kiln_nccl_, #call, what, comm, rank); \
  } while (false)

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Average: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

// The group's failure, shared with its Work handles (which may outlive the group). The first failure wins.
struct Failure {
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::string message;
  bool timeout = false;

  void set(std::string m, bool is_timeout) {
    std::lock_guard lock(mutex);
    if (failed.load()) return;
    message = std::move(m);
    timeout = is_timeout;
    failed.store(true, std::memory_order_release);
  }
  void check() {
    if (!failed.load(std::memory_order_acquire)) return;
    std::lock_guard lock(mutex);
    if (timeout) throw TimeoutError(message);
    throw DistributedError(message);
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Failure> failure, std::shared_ptr<cuda::Event> done, int device)
      : failure_(std::move(failure)), done_(std::move(done)), device_(device) {}

  void wait() override {
    failure_->check();
    done_->wait(cuda::current_stream(device_));  // the GPU waits; the host goes on
  }
  // Polls instead of cudaEventSynchronize, so that a failure found by the watchdog ends the wait too.
  void synchronize() override {
    auto pause = std::chrono::microseconds(2);
    for (;;) {
      failure_->check();
      if (done_->query()) break;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::duration_cast<std::chrono::microseconds>(kMaxPollSleep));
    }
    failure_->check();  // finished because the communicator was aborted: the result is not valid
  }
  // A failed collective counts as completed, so that polling loops end and wait() reports the failure.
  bool is_completed() override { return failure_->failed.load() || done_->query(); }

 private:
  std::shared_ptr<Failure> failure_;
  std::shared_ptr<cuda::Event> done_;
  int device_;
};

int checked_device(int device) {
  const int n = cuda::device_count();
  KILN_CHECK_AS(DistributedError, device >= 0 && device < n, "dist: the NCCL group needs GPU cuda:", device, ", but ",
                n, " GPU(s) are visible (check CUDA_VISIBLE_DEVICES and the local rank)");
  return device;
}

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(const GroupConfig& config, Rendezvous& rendezvous, int device)
      : ProcessGroup(config.rank, config.size),
        config_(config),
        device_(checked_device(device)),
        failure_(std::make_shared<Failure>()),
        stream_(cuda::Stream::create(device_, /*high_priority=*/true)) {
    KILN_CHECK_AS(DistributedError, size_ >= 1 && rank_ >= 0 && rank_ < size_, "dist: rank ", rank_,
                  " is not in a world of size ", size_);
    // Rank 0 makes the id; a failure travels too, so that the others report it instead of waiting for an id.
    struct {
      int32_t ok = 1;
      ncclUniqueId id{};
    } boot;
    std::string error;
    if (rank_ == 0) {
      const ncclResult_t r = ncclGetUniqueId(&boot.id);
      if (r != ncclSuccess) {
        boot.ok = 0;
        error = str_cat("ncclGetUniqueId failed: ", ncclGetErrorString(r), nccl_hint(r));
      }
    }
    rendezvous.broadcast(&boot, sizeof boot, 0);
    KILN_CHECK_AS(DistributedError, boot.ok == 1, "dist: rank ", rank_, ": creating the NCCL group failed: ",
                  rank_ == 0 ? error : "rank 0 could not create the NCCL id; see rank 0's error");
    {
      // A non-blocking communicator: its creation can be abandoned when a rank never comes (it died, or hangs
      // before its first collective), where ncclCommInitRank would wait forever. Every NCCL call on it may then
      // return ncclInProgress, which settle() waits out.
      cuda::DeviceGuard guard(device_);  // NCCL binds the communicator to the current device
      ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
      nccl_config.blocking = 0;
      const std::string what = str_cat("creating the NCCL group of ", size_, " ranks on cuda:", device_);
      const ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, boot.id, rank_, &nccl_config);
      if (r != ncclSuccess && r != ncclInProgress) throw_nccl_error(r, "ncclCommInitRankConfig", what, comm_, rank_);
      const auto limit = std::max<std::chrono::milliseconds>(config_.timeout, kMinCreationTimeout);
      if (!settle(r, Clock::now() + limit)) {
        (void)ncclCommAbort(comm_);
        const std::string message = timeout_message(rank_, "nccl",
                                                    what +
                                                        " (not every rank joined: a rank died, was not started, or is "
                                                        "stuck before its first collective)",
                                                    limit);
        if (config_.on_timeout == OnTimeout::Exit) exit_after_timeout(message);
        throw TimeoutError(message);
      }
      ncclResult_t state = ncclSuccess;
      (void)ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess) throw_nccl_error(state, "ncclCommInitRankConfig", what, comm_, rank_);
    }
    watchdog_ = std::thread([this] { watch(); });
  }

  // Never throws: stops the watchdog, then frees the communicator.
  ~NcclGroup() override {
    {
      std::lock_guard lock(watch_mutex_);
      stop_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (aborted_.load()) return;  // ncclCommAbort has freed it
    try {
      // ncclCommDestroy waits for the collectives in flight: give them the timeout, then abort instead.
      const auto deadline = Clock::now() + config_.timeout;
      bool idle = stream_.query();
      while (!idle && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        idle = stream_.query();
      }
      cuda::DeviceGuard guard(device_);
      // Non-blocking: finalize (flushes, then reports ncclInProgress until the peers are done), then destroy.
      if (idle && settle(ncclCommFinalize(comm_), Clock::now() + config_.timeout)) {
        (void)ncclCommDestroy(comm_);
      } else {
        (void)ncclCommAbort(comm_);
      }
    } catch (...) {
      // CUDA is unusable (e.g. the runtime is already shut down at process exit): NCCL could not free anything
      // either, and calling it now could crash. The process is ending; leave the communicator.
    }
  }

  std::string backend() const override { return "nccl"; }
  Device device() const override { return dev(); }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    const ncclDataType_t type = check("all_reduce", t);
    const uint64_t seq = begin("all_reduce", t, dev());
    return launch("all_reduce", "ncclAllReduce", seq, t, {t}, [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), count(t), type, nccl_op(op), comm_, s);
    });
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    const ncclDataType_t type = check("broadcast", t);
    KILN_CHECK_AS(DistributedError, root >= 0 && root < size_, "dist::broadcast #", seq_, " on rank ", rank_, ": root ",
                  root, " is not a rank of this world of size ", size_);
    const uint64_t seq = begin("broadcast", t, dev());
    return launch("broadcast", "ncclBroadcast", seq, t, {t}, [&](cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), count(t), type, root, comm_, s);
    });
  }

  // (size, *input.shape) <- input of every rank
  WorkPtr all_gather_async(const Tensor& out, const Tensor& input) override {
    const ncclDataType_t type = check("all_gather", input);
    check_second("all_gather", out, input, /*gather=*/true);
    const uint64_t seq = begin("all_gather", input, dev());
    return launch("all_gather", "ncclAllGather", seq, input, {out, input}, [&](cudaStream_t s) {
      return ncclAllGather(input.data_ptr(), out.data_ptr(), count(input), type, comm_, s);
    });
  }

  // out <- reduction over ranks of block rank() of input (size, *out.shape)
  WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& input, ReduceOp op) override {
    const ncclDataType_t type = check("reduce_scatter", input);
    check_second("reduce_scatter", out, input, /*gather=*/false);
    const uint64_t seq = begin("reduce_scatter", input, dev());
    return launch("reduce_scatter", "ncclReduceScatter", seq, input, {out, input}, [&](cudaStream_t s) {
      return ncclReduceScatter(input.data_ptr(), out.data_ptr(), count(out), type, nccl_op(op), comm_, s);
    });
  }

  // An all-reduce of one float that the host waits for: NCCL has no barrier of its own.
  void barrier() override {
    const Tensor token = internal::zeros({1}, {.dtype = DType::Float32, .device = dev()});
    check("barrier", token);
    const uint64_t seq = begin("barrier", token, dev());
    launch("barrier", "ncclAllReduce", seq, token, {token}, [&](cudaStream_t s) {
      return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm_, s);
    })->synchronize();
  }

 private:
  struct Pending {
    std::string description;
    std::shared_ptr<cuda::Event> done;
    Clock::time_point start;
  };

  Device dev() const { return Device::cuda(device_); }

  // Waits while the non-blocking communicator reports ncclInProgress for the call that returned `r`. Returns
  // false when `deadline` passed first; true otherwise (the call's outcome is then ncclCommGetAsyncError's).
  bool settle(ncclResult_t r, Clock::time_point deadline) {
    auto pause = std::chrono::microseconds(1);
    while (r == ncclInProgress) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::duration_cast<std::chrono::microseconds>(kMaxPollSleep));
      const ncclResult_t got = ncclCommGetAsyncError(comm_, &r);
      if (got != ncclSuccess) r = got;
    }
    return true;
  }
  static size_t count(const Tensor& t) { return static_cast<size_t>(t.numel()); }

  // Checks the (first) tensor before begin() numbers the collective, so a refused call uses no number.
  ncclDataType_t check(const char* what, const Tensor& t) {
    failure_->check();  // an aborted group takes no more work
    check_tensor(what, seq_, t, dev());
    switch (t.dtype()) {
      case DType::Float32: return ncclFloat32;
      case DType::Float64: return ncclFloat64;
      case DType::Float16: return ncclFloat16;
      case DType::BFloat16: return ncclBfloat16;
      case DType::Int32: return ncclInt32;
      case DType::Int64: return ncclInt64;
      case DType::UInt8: return ncclUint8;
      case DType::Float8_e4m3fn:
      case DType::Float8_e5m2:
        throw DistributedError(str_cat("dist::", what, " #", seq_, " on rank ", rank_, ": collectives on ", t.dtype(),
                                       " tensors are not supported (a storage-only dtype); cast to ",
                                       "bfloat16 or float32 first"));
      case DType::Bool: break;
    }
    throw DistributedError(str_cat("dist::", what, " #", seq_, " on rank ", rank_, ": NCCL has no bool type; ",
                                   "convert the tensor (t.to(DType::UInt8)), run the collective, and convert back ",
                                   "(Max of 0/1 values is a logical or, Min a logical and)"));
  }

  // all_gather (gather = true): out must hold size() blocks of the input; reduce_scatter: the input size() blocks
  // of out. Same dtype, and the two overlap only in NCCL's in-place layout (the block is block rank() of the big).
  void check_second(const char* what, const Tensor& out, const Tensor& input, bool gather) {
    check_tensor(what, seq_, out, dev());
    KILN_CHECK_AS(DistributedError, out.dtype() == input.dtype(), "dist::", what, " #", seq_, " on rank ", rank_,
                  ": out is ", dtype_name(out.dtype()), " but the input is ", dtype_name(input.dtype()),
                  "; use one dtype");
    const Tensor& big = gather ? out : input;
    const Tensor& block = gather ? input : out;
    KILN_CHECK_AS(DistributedError, big.numel() == block.numel() * size_, "dist::", what, " #", seq_, " on rank ",
                  rank_, ": ", gather ? "out" : "the input", " has ", big.numel(), " elements; expected ",
                  block.numel() * size_, " (world size ", size_, " x the ", block.numel(), " of ",
                  gather ? "the input" : "out", "), e.g. of shape (", size_, ", *", gather ? "input" : "out",
                  ".shape)");
    const auto* b = static_cast<const char*>(big.data_ptr());
    const auto* k = static_cast<const char*>(block.data_ptr());
    const size_t block_bytes = block.nbytes();
    const bool overlap = block_bytes > 0 && k < b + big.nbytes() && b < k + block_bytes;
    KILN_CHECK_AS(DistributedError, !overlap || k == b + static_cast<size_t>(rank_) * block_bytes, "dist::", what, " #",
                  seq_, " on rank ", rank_, ": out and the input overlap; use separate tensors, or (in place) ",
                  gather ? "the input as block rank() of out" : "out as block rank() of the input");
  }

  // The steps every collective shares (see the top of the file); nccl_call(stream) issues the NCCL call.
  template <typename NcclCall>
  WorkPtr launch(const char* what, const char* call, uint64_t seq, const Tensor& described,
                 std::initializer_list<Tensor> tensors, NcclCall&& nccl_call) {
    std::string description = describe(what, seq, described);
    cuda::DeviceGuard guard(device_);
    std::unique_lock<std::timed_mutex> lock(issue_mutex_);  // the watchdog must not abort mid-call if it can wait
    failure_->check();
    ready_.record(cuda::current_stream(device_));
    ready_.wait(stream_);  // captures this record: ready_ can be recorded again by the next collective
    const auto start = Clock::now();
    {
      std::lock_guard watch_lock(watch_mutex_);
      in_call_ = description;
      in_call_since_ = start;
    }
    // Empty tensors (the same on every rank, as shapes must be) move nothing: no NCCL call, whose pointer checks
    // could refuse their null data.
    ncclResult_t r = ncclSuccess;
    if (described.numel() > 0) {
      // The trace range (for the profiler, NVTX) is timed on the communication stream, where the collective runs.
      cuda::StreamGuard on_comm(stream_);
      trace::Scope range(trace::Kind::Op, call, Device::cuda(device_), {&described});
      r = nccl_call(static_cast<cudaStream_t>(stream_.handle()));
    }
    if (r == ncclInProgress) {             // being enqueued (a first collective also connects the peers); the watchdog
      settle(r, start + config_.timeout);  // aborts a call stuck past the timeout, which ends this wait too
      r = ncclSuccess;
      (void)ncclCommGetAsyncError(comm_, &r);
    }
    {
      std::lock_guard watch_lock(watch_mutex_);
      in_call_.clear();
    }
    if (r != ncclSuccess) {
      failure_->check();  // aborted under our feet: report the watchdog's reason, not the symptom
      throw_nccl_error(r, call, description, comm_, rank_);
    }
    for (const Tensor& t : tensors) cuda::record_stream(t, stream_);
    auto done = std::make_shared<cuda::Event>();
    done->record(stream_);
    {
      std::lock_guard watch_lock(watch_mutex_);
      pending_.push_back({std::move(description), done, start});
    }
    return std::make_shared<NcclWork>(failure_, std::move(done), device_);
  }

  // ---- the watchdog ----

  void watch() {
    try {
      cuda::set_device(device_);  // this thread's queries go to the group's device
    } catch (...) {
    }
    std::unique_lock lock(watch_mutex_);
    while (!stop_) {
      watch_cv_.wait_for(lock, kWatchdogInterval, [this] { return stop_; });
      if (stop_) return;
      std::string problem;
      bool is_timeout = false;
      try {
        // Collectives finish in order on the one communication stream: the finished ones leave from the front.
        while (!pending_.empty() && pending_.front().done->query()) pending_.pop_front();
        ncclResult_t async = ncclSuccess;
        const ncclResult_t got = ncclCommGetAsyncError(comm_, &async);
        if (got != ncclSuccess) async = got;
        const auto now = Clock::now();
        if (async != ncclSuccess && async != ncclInProgress) {
          const char* last = ncclGetLastError(comm_);
          problem = str_cat("kiln.dist: rank ", rank_, ": NCCL reported an error: ", ncclGetErrorString(async),
                            last != nullptr && *last != '\0' ? str_cat(" (", last, ")") : std::string(),
                            pending_.empty() ? std::string() : str_cat(", during ", pending_.front().description),
                            "; the nccl communicator is aborted", nccl_hint(async));
        } else if (!pending_.empty() && now - pending_.front().start > config_.timeout) {
          problem = timeout_message(rank_, "nccl", pending_.front().description, config_.timeout);
          is_timeout = true;
        } else if (!in_call_.empty() && now - in_call_since_ > config_.timeout) {
          problem = timeout_message(rank_, "nccl", in_call_ + " (stuck in the NCCL call)", config_.timeout);
          is_timeout = true;
        }
      } catch (const std::exception& e) {  // a CUDA error: the device is unusable, the collectives with it
        problem = str_cat("kiln.dist: rank ", rank_, ": the NCCL watchdog could not check ",
                          pending_.empty() ? std::string("the collectives") : pending_.front().description, ": ",
                          e.what(), "; the nccl communicator is aborted");
      }
      if (problem.empty()) continue;
      lock.unlock();  // the caller's thread may be waiting to register a collective
      fail(problem, is_timeout);
      return;  // nothing left to watch
    }
  }

  // Runs on the watchdog thread. The failure is recorded first, so that waits end even if the abort is slow.
  void fail(const std::string& message, bool is_timeout) {
    failure_->set(message + (config_.on_timeout == OnTimeout::Throw
                                 ? "; this NCCL group is unusable from now on (create a new job)"
                                 : ""),
                  is_timeout);
    std::unique_lock<std::timed_mutex> lock(issue_mutex_, std::defer_lock);
    (void)lock.try_lock_for(kAbortLockWait);  // an NCCL call in flight uses comm_; a stuck one is what we unblock
    aborted_.store(true);
    if (config_.on_timeout == OnTimeout::Throw) {
      (void)ncclCommAbort(comm_);
      return;
    }
    // Exit: a hung abort must not keep the process (and so the job) alive; give it a bounded time.
    auto finished = std::make_shared<std::atomic<bool>>(false);
    try {
      std::thread([comm = comm_, finished] {
        (void)ncclCommAbort(comm);
        finished->store(true);
      }).detach();
    } catch (const std::exception&) {  // no thread to spare: end the process without the abort
      finished->store(true);
    }
    const auto until = Clock::now() + kExitAbortGrace;
    while (!finished->load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    exit_after_timeout(message);
  }

  const GroupConfig config_;
  const int device_;
  std::shared_ptr<Failure> failure_;
  // The communication stream. Streams are pooled, never destroyed (cuda.h): the caching allocator may still record
  // on it for tensors freed after this group is gone.
  cuda::Stream stream_;
  cuda::Event ready_;  // "the caller's stream got here", recorded anew by each collective
  ncclComm_t comm_ = nullptr;
  std::timed_mutex issue_mutex_;  // held by the caller's thread around NCCL calls, by the watchdog to abort
  std::atomic<bool> aborted_{false};

  // Guarded by watch_mutex_: what the watchdog watches.
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stop_ = false;
  std::deque<Pending> pending_;
  std::string in_call_;  // the collective inside its NCCL call now, if any
  Clock::time_point in_call_since_;
  std::thread watchdog_;  // last: started when everything above exists
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(const GroupConfig& config, Rendezvous& rendezvous, int device) {
  return std::make_unique<NcclGroup>(config, rendezvous, device);
}

}  // namespace kiln::dist::detail

#endif  // KILN_WITH_NCCL
