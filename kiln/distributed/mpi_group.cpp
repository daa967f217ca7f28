// kiln/distributed/mpi_group.cpp — the MPI process group for CPU tensors (what CI's multi-process tests use), and
// the MPI bootstrap that NCCL groups meet through. Compiled to nothing without KILN_WITH_MPI.
//
// Collectives are MPI's non-blocking ones on a duplicate of MPI_COMM_WORLD (kiln's traffic never mixes with the
// program's own MPI calls); wait() polls MPI_Test until done or until the timeout. float16 and bfloat16 are
// reduced in float32 (MPI has no 16-bit float types); moved as 16-bit words where nothing is computed.
#if defined(KILN_WITH_MPI)

#include <mpi.h>

#include <chrono>
#include <climits>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>

#include "kiln/distributed/detail/group_internal.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::dist::detail {
namespace {

// MPI calls from several threads are serialised here unless MPI gave MPI_THREAD_MULTIPLE.
std::mutex& mpi_mutex() {
  static std::mutex m;
  return m;
}
bool& mpi_thread_multiple() {
  static bool multiple = false;
  return multiple;
}
struct MpiLock {
  MpiLock() {
    if (!mpi_thread_multiple()) mpi_mutex().lock();
  }
  ~MpiLock() {
    if (!mpi_thread_multiple()) mpi_mutex().unlock();
  }
};

// Throws unless MPI's rank and size in comm are those the launcher's variables gave; `where` starts the message.
void check_launcher_agrees(MPI_Comm comm, int expected_rank, int expected_size, std::string_view where) {
  int r = 0, n = 0;
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(comm, &n);
  KILN_CHECK_AS(DistributedError, r == expected_rank && n == expected_size, where, ": MPI says rank ", r, " of ", n,
                " but the launcher's variables say rank ", expected_rank, " of ", expected_size,
                "; start the job with one launcher (mpirun) and do not set RANK/WORLD_SIZE by hand");
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

#define KILN_MPI_CHECK(call, what)                                                                                  \
  do {                                                                                                              \
    const int kiln_rc_ = (call);                                                                                    \
    if (kiln_rc_ != MPI_SUCCESS) [[unlikely]]                                                                       \
      throw DistributedError(std::string("dist: ") + (what) + ": " #call " failed: " + mpi_error_string(kiln_rc_)); \
  } while (false)

// The MPI type a tensor travels as (16-bit floats: as 16-bit words, for collectives that compute nothing).
MPI_Datatype mpi_type(DType t, const std::string& what) {
  switch (t) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::UInt8: return MPI_UINT8_T;
    case DType::Bool: return MPI_C_BOOL;
    case DType::Float16:
    case DType::BFloat16: return MPI_UINT16_T;
    case DType::Float8_e4m3fn:
    case DType::Float8_e5m2:
      KILN_FAIL(what, ": collectives on ", dtype_name(t), " tensors are not supported (a storage-only dtype); cast to ",
                "bfloat16 or float32 first");
  }
  KILN_FAIL(what, ": dtype ", dtype_name(t), " is not supported by the MPI group");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Sum:
    case ReduceOp::Average: return MPI_SUM;
  }
  return MPI_SUM;
}

int count_of(const Tensor& t, const std::string& what) {
  KILN_CHECK_AS(DistributedError, t.numel() <= INT_MAX, what, ": ", t.numel(),
                " elements are more than one MPI call moves (2^31 - 1); split the tensor");
  return static_cast<int>(t.numel());
}

class MpiGroup;

class MpiWork final : public Work {
 public:
  MpiWork(MpiGroup& group, std::string what, MPI_Request request, std::function<void()> finish)
      : group_(group), what_(std::move(what)), request_(request), finish_(std::move(finish)) {}
  void wait() override;
  void synchronize() override { wait(); }
  bool is_completed() override;

 private:
  MpiGroup& group_;
  std::string what_;
  MPI_Request request_;
  std::function<void()> finish_;  // runs once, after completion (averaging, copying back from float32)
  bool done_ = false;
};

class MpiGroup final : public ProcessGroup {
 public:
  explicit MpiGroup(const GroupConfig& config) : ProcessGroup(config.rank, config.size), config_(config) {
    MpiLock lock;
    KILN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "creating the MPI group");
    check_launcher_agrees(comm_, rank_, size_, "dist");
  }
  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !broken_) {
      MpiLock lock;
      MPI_Comm_free(&comm_);
    }
  }
  std::string backend() const override { return "mpi"; }
  Device device() const override { return Device::cpu(); }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    const uint64_t seq = begin("all_reduce", t, Device::cpu());
    const std::string what = describe("all_reduce", seq, t) + " (" + to_string(op) + ")";
    check_usable(what);
    check_reducible(t.dtype(), op, what);
    // 16-bit floats are reduced in float32 and copied back when done.
    const bool widen = t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16;
    Tensor buf = widen ? t.to(DType::Float32) : t;
    MPI_Request req;
    {
      MpiLock lock;
      KILN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf.data_ptr(), count_of(buf, what), mpi_type(buf.dtype(), what),
                                    mpi_op(op), comm_, &req),
                     what);
    }
    const int n = size_;
    return std::make_shared<MpiWork>(*this, what, req, [t = t.detach(), buf = buf.detach(), op, widen, n]() mutable {
      if (op == ReduceOp::Average) buf.div_(Scalar(static_cast<double>(n)));
      if (widen) t.copy_(buf);
    });
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    const uint64_t seq = begin("broadcast", t, Device::cpu());
    const std::string what = describe("broadcast", seq, t);
    check_usable(what);
    KILN_CHECK_AS(DistributedError, root >= 0 && root < size_, "dist::", what, ": root ", root, " is not a rank (0..",
                  size_ - 1, ")");
    MPI_Request req;
    {
      MpiLock lock;
      KILN_MPI_CHECK(MPI_Ibcast(t.data_ptr(), count_of(t, what), mpi_type(t.dtype(), what), root, comm_, &req), what);
    }
    return std::make_shared<MpiWork>(*this, what, req, [t] {});
  }

  WorkPtr all_gather_async(const Tensor& out, const Tensor& input) override {
    const uint64_t seq = begin("all_gather", input, Device::cpu());
    check_tensor("all_gather", seq, out, Device::cpu());
    const std::string what = describe("all_gather", seq, input);
    check_usable(what);
    KILN_CHECK_AS(DistributedError, out.dtype() == input.dtype() && out.numel() == input.numel() * size_,
                  "dist::", what, ": out has ", out.numel(), " ", dtype_name(out.dtype()),
                  " elements; it needs world size ", size_, " × ", input.numel(), " ", dtype_name(input.dtype()));
    const int n = count_of(input, what);
    const MPI_Datatype type = mpi_type(input.dtype(), what);
    MPI_Request req;
    {
      MpiLock lock;
      KILN_MPI_CHECK(MPI_Iallgather(input.data_ptr(), n, type, out.data_ptr(), n, type, comm_, &req), what);
    }
    return std::make_shared<MpiWork>(*this, what, req, [out, input] {});
  }

  WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& input, ReduceOp op) override {
    const uint64_t seq = begin("reduce_scatter", input, Device::cpu());
    check_tensor("reduce_scatter", seq, out, Device::cpu());
    const std::string what = describe("reduce_scatter", seq, input) + " (" + to_string(op) + ")";
    check_usable(what);
    check_reducible(input.dtype(), op, what);
    KILN_CHECK_AS(DistributedError, out.dtype() == input.dtype() && input.numel() == out.numel() * size_,
                  "dist::", what, ": the input has ", input.numel(), " ", dtype_name(input.dtype()),
                  " elements; it needs world size ", size_, " × out's ", out.numel(), " ", dtype_name(out.dtype()));
    const bool widen = input.dtype() == DType::Float16 || input.dtype() == DType::BFloat16;
    Tensor in = widen ? input.to(DType::Float32) : input;
    Tensor res = widen ? internal::empty(out.shape(), {.dtype = DType::Float32}) : out;
    MPI_Request req;
    {
      MpiLock lock;
      KILN_MPI_CHECK(MPI_Ireduce_scatter_block(in.data_ptr(), res.data_ptr(), count_of(res, what),
                                               mpi_type(res.dtype(), what), mpi_op(op), comm_, &req),
                     what);
    }
    const int n = size_;
    return std::make_shared<MpiWork>(*this, what, req, [out = out.detach(), in, res, op, widen, n]() mutable {
      if (op == ReduceOp::Average) res.div_(Scalar(static_cast<double>(n)));
      if (widen) out.copy_(res);
    });
  }

  void barrier() override {
    const std::string what = "barrier #" + std::to_string(seq_++);
    check_usable(what);
    MPI_Request req;
    {
      MpiLock lock;
      KILN_MPI_CHECK(MPI_Ibarrier(comm_, &req), what);
    }
    MpiWork(*this, what, req, nullptr).wait();
  }

  // Polls `req` until it completes; the timeout ends the job (OnTimeout::Exit) or throws (Throw).
  void wait_for(MPI_Request& req, const std::string& what) {
    check_usable(what);
    const auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(1);
    for (;;) {
      int flag = 0;
      {
        MpiLock lock;
        KILN_MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), what);
      }
      if (flag) return;
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (waited >= config_.timeout) {
        const std::string message = timeout_message(rank_, "mpi", what, config_.timeout);
        broken_ = true;
        broken_message_ = message;
        if (config_.on_timeout == OnTimeout::Exit) {
          std::fprintf(stderr, "%s\nkiln.dist: aborting the MPI job (exit code %d)\n", message.c_str(),
                       kTimeoutExitCode);
          std::fflush(stderr);
          MPI_Abort(MPI_COMM_WORLD, kTimeoutExitCode);
          exit_after_timeout(message);  // MPI_Abort does not return; this is in case it does
        }
        throw TimeoutError(message);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

 private:
  void check_usable(const std::string& what) const {
    KILN_CHECK_AS(DistributedError, !broken_, "dist::", what, " on rank ", rank_,
                  ": the MPI group is unusable after an earlier timeout (", broken_message_, ")");
  }
  static void check_reducible(DType t, ReduceOp op, const std::string& what) {
    KILN_CHECK_AS(DistributedError, t != DType::Bool, "dist::", what, ": bool tensors cannot be reduced; convert to ",
                  "uint8 or int32 first");
    KILN_CHECK_AS(DistributedError, op != ReduceOp::Average || is_floating_point(t), "dist::", what,
                  ": Average needs a floating-point tensor, not ", dtype_name(t), "; use Sum and divide");
  }

  GroupConfig config_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool broken_ = false;
  std::string broken_message_;
};

void MpiWork::wait() {
  if (done_) return;
  group_.wait_for(request_, what_);
  done_ = true;
  if (finish_) std::exchange(finish_, nullptr)();
}

bool MpiWork::is_completed() {
  if (done_) return true;
  int flag = 0;
  {
    MpiLock lock;
    KILN_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), what_);
  }
  if (flag) {
    done_ = true;
    if (finish_) std::exchange(finish_, nullptr)();
  }
  return done_;
}

// The NCCL unique id travels by MPI_Bcast over a duplicate of MPI_COMM_WORLD.
class MpiRendezvous final : public Rendezvous {
 public:
  MpiRendezvous() {
    MpiLock lock;
    KILN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "the MPI bootstrap");
  }
  ~MpiRendezvous() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MpiLock lock;
      MPI_Comm_free(&comm_);
    }
  }
  void broadcast(void* data, size_t n, int root) override {
    KILN_CHECK(n <= INT_MAX, "dist: bootstrap broadcast of ", n, " bytes is too large");
    MpiLock lock;
    KILN_MPI_CHECK(MPI_Bcast(data, static_cast<int>(n), MPI_BYTE, root, comm_), "the MPI bootstrap's broadcast");
  }
  void barrier() override {
    MpiLock lock;
    KILN_MPI_CHECK(MPI_Barrier(comm_), "the MPI bootstrap's barrier");
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_mpi_group(const GroupConfig& config) { return std::make_unique<MpiGroup>(config); }
std::unique_ptr<Rendezvous> make_mpi_rendezvous() { return std::make_unique<MpiRendezvous>(); }

bool mpi_init(int expected_rank, int expected_size) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  bool owned = false;
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    KILN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "dist::init");
    owned = true;
  } else {
    MPI_Query_thread(&provided);
  }
  mpi_thread_multiple() = provided == MPI_THREAD_MULTIPLE;
  check_launcher_agrees(MPI_COMM_WORLD, expected_rank, expected_size, "dist::init");
  return owned;
}

void mpi_finalize() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

}  // namespace kiln::dist::detail

#endif  // KILN_WITH_MPI
