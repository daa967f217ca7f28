// tests/distributed/test_nccl_cuda.cpp — the NCCL process group (kiln/distributed/cuda/nccl_group.cpp) in one
// process on cuda:0: a world of one rank, made through detail::make_nccl_group with an in-process rendezvous.
// Values of every collective and reduce op, argument checks, stream ordering of Work::wait(), and the watchdog
// (a collective stuck behind long GPU work times out: TimeoutError, or the process ends with kTimeoutExitCode).
// The multi-rank values are checked under mpirun (test_mpi_*); these need only one GPU. Skips without a GPU.
#include <gtest/gtest.h>

#ifdef KILN_TEST_CUDA

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "kiln/distributed/detail/group_internal.h"
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

namespace kiln::dist::detail {
namespace {

using namespace std::chrono_literals;
using kiln::testing::expect_error;
using kiln::testing::expect_values;
using kiln::testing::make;

#define KILN_REQUIRE_GPU() \
  if (cuda::device_count() < 1) GTEST_SKIP() << "no GPU visible"

const Device kGpu = Device::cuda(0);

// A world of one: there is nobody to send the NCCL id to.
class LocalRendezvous final : public Rendezvous {
 public:
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
};

std::unique_ptr<ProcessGroup> make_group(std::chrono::milliseconds timeout = 60s,
                                         OnTimeout on_timeout = OnTimeout::Throw) {
  LocalRendezvous r;
  return make_nccl_group({.rank = 0, .size = 1, .timeout = timeout, .on_timeout = on_timeout}, r, 0);
}

TensorOptions on_gpu(DType dtype = DType::Float32) { return {.dtype = dtype, .device = kGpu}; }

// A world of two whose rank 1 never comes (it died before the group was made): creating the group gives up
// after the timeout (at least 20 s for a creation) with TimeoutError, instead of waiting forever in NCCL's setup.
TEST(CudaNcclGroup, CreationTimesOutWhenARankNeverJoins) {
  KILN_REQUIRE_GPU();
  LocalRendezvous r;  // rank 0 keeps its id: nobody receives it
  const auto start = std::chrono::steady_clock::now();
  expect_error([&] { make_nccl_group({.rank = 0, .size = 2, .timeout = 2s, .on_timeout = OnTimeout::Throw}, r, 0); },
               {"rank 0", "creating the NCCL group of 2 ranks", "did not finish within 20 s", "not every rank joined"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
  auto g = make_group();  // a group made afterwards works
  Tensor t = internal::ones({3}, on_gpu());
  g->all_reduce(t);
  EXPECT_EQ(t.sum().item<double>(), 3.0);
}

TEST(CudaNcclGroup, AllReduceEveryOpAndDtype) {
  KILN_REQUIRE_GPU();
  auto g = make_group();
  EXPECT_EQ(g->backend(), "nccl");
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->size(), 1);
  // One rank: the reduction over ranks of x is x itself, for every op (Average divides the sum by 1).
  // Values exact in bfloat16; int64 values beyond 2^53 would show a float round trip.
  const std::vector<double> floats = {1.5, -2, 3, 0.25, -0.125, 96};
  const std::vector<double> ints = {3, -2, 7, 0, 123456789, -1};
  uint64_t seq = g->sequence_number();
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Int64}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average, ReduceOp::Max, ReduceOp::Min}) {
      SCOPED_TRACE(::testing::Message() << dtype << " " << to_string(op));
      const auto& v = dtype == DType::Int64 ? ints : floats;
      Tensor t = make(v, {2, 3}, on_gpu(dtype));
      g->all_reduce(t, op);
      expect_values(t, {2, 3}, v, 0, 0);
      EXPECT_EQ(g->sequence_number(), ++seq);
    }
  }
  // The other dtypes NCCL takes.
  for (DType dtype : {DType::Float64, DType::Float16, DType::Int32, DType::UInt8}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    Tensor t = make({1, 2, 250}, {3}, on_gpu(dtype));
    g->all_reduce(t, ReduceOp::Sum);
    expect_values(t, {3}, {1, 2, 250}, 0, 0);
  }
  // Empty tensors are fine (nothing moves).
  Tensor empty = internal::zeros({0}, on_gpu());
  g->all_reduce(empty);
  EXPECT_EQ(empty.numel(), 0);
}

TEST(CudaNcclGroup, CollectivesShowInTheProfilerOnTheirStream) {
  KILN_REQUIRE_GPU();
  auto g = make_group();
  Tensor t = internal::ones({1 << 20}, on_gpu());
  profiler::Profile prof;
  Tensor u = t * 2;  // on the current stream
  g->all_reduce(u);
  prof.stop();
  const profiler::Event* mul = nullptr;
  const profiler::Event* nccl = nullptr;
  for (const profiler::Event& e : prof.result().events()) {
    if (e.name == "mul") mul = &e;
    if (e.name == "ncclAllReduce") nccl = &e;
  }
  ASSERT_NE(mul, nullptr);
  ASSERT_NE(nccl, nullptr) << "no ncclAllReduce range";
  EXPECT_EQ(nccl->shapes, "[1048576] f32");
  EXPECT_EQ(nccl->gpu_device, 0);
  EXPECT_NE(nccl->gpu_stream, mul->gpu_stream) << "timed on the caller's stream, not the communication stream";
  EXPECT_GE(nccl->gpu_begin_ns, mul->gpu_end_ns) << "the collective waits for the op that made its input";
  EXPECT_EQ(u.sum().item<double>(), 2.0 * (1 << 20));
}

TEST(CudaNcclGroup, AllGatherReduceScatterBroadcast) {
  KILN_REQUIRE_GPU();
  auto g = make_group();
  Tensor input = make({1, 2, 3}, {3}, on_gpu());
  Tensor out = internal::full({1, 3}, -1.0, on_gpu());
  g->all_gather(out, input);
  expect_values(out, {1, 3}, {1, 2, 3}, 0, 0);
  Tensor big = make({4, 5, 6, 7}, {4}, on_gpu(DType::BFloat16));
  Tensor part = internal::zeros({2, 2}, on_gpu(DType::BFloat16));
  g->reduce_scatter(part, big, ReduceOp::Max);
  expect_values(part, {2, 2}, {4, 5, 6, 7}, 0, 0);
  Tensor b = make({9, 8, 7}, {3}, on_gpu(DType::Int64));
  g->broadcast(b, 0);
  expect_values(b, {3}, {9, 8, 7}, 0, 0);
  // In place: the input is block rank() of out (here, all of it).
  Tensor same = make({5, 6}, {2}, on_gpu());
  g->all_gather(same, same);
  expect_values(same, {2}, {5, 6}, 0, 0);
}

TEST(CudaNcclGroup, BadArgumentsAreRefused) {
  KILN_REQUIRE_GPU();
  auto g = make_group();
  const uint64_t seq = g->sequence_number();
  Tensor nc = kiln::testing::non_contiguous(internal::ones({4, 4}, on_gpu()));
  ASSERT_FALSE(nc.is_contiguous());
  expect_error([&] { g->all_reduce(nc); }, {"all_reduce", "not contiguous"});
  expect_error([&] { g->all_reduce(internal::ones({4}, {.dtype = DType::Float32})); }, {"all_reduce", "cpu", "cuda:0"});
  expect_error([&] { g->all_reduce(internal::ones({4}, on_gpu(DType::Bool))); }, {"all_reduce", "bool", "UInt8"});
  expect_error([&] { g->all_reduce(Tensor()); }, {"all_reduce", "undefined"});
  expect_error([&] { g->broadcast(internal::ones({2}, on_gpu()), 1); }, {"broadcast", "root 1", "not a rank"});
  expect_error([&] { g->all_gather(internal::ones({4}, on_gpu()), internal::ones({2}, on_gpu())); },
               {"all_gather", "4 elements", "expected 2"});
  expect_error([&] { g->all_gather(internal::ones({2}, on_gpu(DType::Int32)), internal::ones({2}, on_gpu())); },
               {"all_gather", "int32", "float32"});
  expect_error([&] { g->reduce_scatter(internal::ones({3}, on_gpu()), internal::ones({2}, on_gpu())); },
               {"reduce_scatter", "2 elements", "expected 3"});
  expect_error([&] { g->all_gather(internal::ones({2}, on_gpu()), nc); }, {"all_gather", "not contiguous"});
  // Refused calls take no sequence number, so the ranks' numbering stays aligned.
  EXPECT_EQ(g->sequence_number(), seq);
  // The group still works after them.
  Tensor t = make({1, 2}, {2}, on_gpu());
  g->all_reduce(t);
  expect_values(t, {2}, {1, 2}, 0, 0);
}

// wait() makes the caller's current stream wait for the collective, and the collective waits for what that
// stream queued before it: large tensors and fresh values each round, so a missing wait would show.
TEST(CudaNcclGroup, WaitOrdersWorkOnTheCurrentStream) {
  KILN_REQUIRE_GPU();
  auto g = make_group();
  const int64_t n = int64_t{1} << 24;  // 64 MB of float32
  for (bool own_stream : {false, true}) {
    SCOPED_TRACE(own_stream ? "on a created stream" : "on the default stream");
    cuda::Stream s = own_stream ? cuda::Stream::create(0) : cuda::Stream::default_stream(0);
    cuda::StreamGuard guard(s);
    Tensor input = internal::zeros({n}, on_gpu());
    Tensor out = internal::zeros({1, n}, on_gpu());
    for (int round = 1; round <= 3; ++round) {
      input.fill_(round);  // queued on the current stream, before the collective
      auto work = g->all_gather_async(out, input);
      work->wait();
      internal::add_(out, 1.0);  // queued after wait(): must see the gathered values
      Tensor expected = internal::full({1, n}, round + 1.0, on_gpu());
      EXPECT_TRUE(internal::equal(out, expected)) << "round " << round;
    }
    // In place, as DataParallel uses it.
    Tensor t = internal::ones({n}, on_gpu());
    auto work = g->all_reduce_async(t);
    work->wait();
    internal::add_(t, 1.0);
    EXPECT_TRUE(internal::equal(t, internal::full({n}, 2.0, on_gpu())));
  }
}

TEST(CudaNcclGroup, SynchronizeBarrierAndWorkOutlivingTheGroup) {
  KILN_REQUIRE_GPU();
  auto g = make_group();
  Tensor t = internal::full({1000}, 3.0, on_gpu());
  auto work = g->all_reduce_async(t, ReduceOp::Average);
  work->synchronize();
  EXPECT_TRUE(work->is_completed());
  const uint64_t seq = g->sequence_number();
  g->barrier();
  EXPECT_EQ(g->sequence_number(), seq + 1);
  auto last = g->all_reduce_async(t);
  g.reset();  // waits for the collective, frees the communicator
  last->synchronize();
  EXPECT_TRUE(last->is_completed());
  expect_values(t.view({1, 1000}).narrow(1, 0, 2), {1, 2}, {3, 3}, 0, 0);
}

// Queues seconds of GPU work on the current stream: a collective issued after it cannot start in time.
void stall_current_stream() {
  cuda::set_allow_tf32(false);  // full float32: ~0.1 s per product on an H200
  Tensor a = internal::ones({16384, 16384}, on_gpu());
  for (int i = 0; i < 64; ++i) Tensor c = internal::matmul(a, a);
}

// The watchdog aborts a collective stuck past the timeout. Run in a fresh child process (death-test style
// "threadsafe": the binary is executed again), because the aborted communicator's queued kernel must not run
// in a process that other tests use.
TEST(CudaNcclDeathTest, TimeoutThrowsWithOnTimeoutThrow) {
  KILN_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    auto g = make_group(200ms, OnTimeout::Throw);
    Tensor t = internal::ones({16}, on_gpu());
    g->all_reduce(t);
    cuda::synchronize(0);  // NCCL's first-use setup is done before the stall
    cuda::Stream busy = cuda::Stream::create(0);
    cuda::StreamGuard guard(busy);
    stall_current_stream();
    const auto start = std::chrono::steady_clock::now();
    auto work = g->all_reduce_async(t);
    if (work->is_completed()) std::_Exit(10);  // cannot have run yet: the stream is busy for seconds
    try {
      work->synchronize();
      std::fprintf(stderr, "synchronize returned without an error\n");
      std::_Exit(11);
    } catch (const TimeoutError& e) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "caught after %.2f s: %s\n", waited, e.what());
      if (std::strstr(e.what(), "all_reduce #1") == nullptr || std::strstr(e.what(), "nccl") == nullptr) std::_Exit(12);
      if (waited > 5.0) std::_Exit(13);
    }
    // Everything on the aborted group reports the failure from now on.
    try {
      g->all_reduce_async(t);
      std::_Exit(14);
    } catch (const TimeoutError&) {
    }
    try {
      work->wait();
      std::_Exit(15);
    } catch (const TimeoutError&) {
    }
    if (!work->is_completed()) std::_Exit(16);
    std::fprintf(stderr, "timeout reported everywhere\n");
    std::_Exit(0);  // no destructors: the GPU still holds the stalled work
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "timeout reported everywhere");
}

TEST(CudaNcclDeathTest, TimeoutEndsTheProcessWithOnTimeoutExit) {
  KILN_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    auto g = make_group(200ms, OnTimeout::Exit);
    Tensor t = internal::ones({16}, on_gpu());
    g->all_reduce(t);
    cuda::synchronize(0);
    cuda::Stream busy = cuda::Stream::create(0);
    cuda::StreamGuard guard(busy);
    stall_current_stream();
    g->all_reduce_async(t);
    std::this_thread::sleep_for(20s);  // the watchdog ends the process long before
    std::fprintf(stderr, "the watchdog did not end the process\n");
    std::_Exit(1);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(kTimeoutExitCode), "all_reduce #1 .*did not finish within");
}

}  // namespace
}  // namespace kiln::dist::detail

#endif  // KILN_TEST_CUDA
