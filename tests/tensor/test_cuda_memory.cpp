// The CUDA caching allocator, the pinned host allocator, streams, events and DeviceGuard.
// Tests that need a GPU skip themselves where none is visible; CudaWithoutGpu checks the opposite case.
#include <cstdlib>  // getenv
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/test_support.h"

#if defined(KILN_TEST_CUDA)
#include <cuda_runtime.h>  // cudaMemsetAsync: GPU work of a known length, independent of kiln's kernels

#include "kiln/tensor/cuda.h"
#include "kiln/tensor/owned_split.h"
#endif

namespace kiln {
namespace {

using kiln::testing::expect_error;

#if defined(KILN_TEST_CUDA)

constexpr int64_t kMiB = int64_t{1} << 20;

Tensor device_bytes(int64_t n) { return empty({n}, {.dtype = DType::UInt8, .device = Device::cuda(0)}); }

char* address(const Tensor& t) { return static_cast<char*>(t.data_ptr<void>()); }

// Queues `repeats` memsets of `buffer` on `stream`: long-running work that kiln's kernels do not take part in.
void busy(const Tensor& buffer, const cuda::Stream& stream, int repeats) {
  for (int i = 0; i < repeats; ++i) {
    ASSERT_EQ(cudaMemsetAsync(address(buffer), i & 0xff, static_cast<size_t>(buffer.nbytes()),
                              static_cast<cudaStream_t>(stream.handle())),
              cudaSuccess);
  }
}

class CudaMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
    cuda::synchronize(0);
    cuda::empty_cache();
  }
};

TEST_F(CudaMemory, ReusesAFreedBlockWithoutCudaMalloc) {
  char* first = nullptr;
  { first = address(device_bytes(4096)); }
  const int64_t mallocs = cuda::memory_stats(0).num_device_mallocs;
  Tensor again = device_bytes(4096);
  EXPECT_EQ(address(again), first);
  EXPECT_EQ(cuda::memory_stats(0).num_device_mallocs, mallocs);
}

TEST_F(CudaMemory, SteadyLoopDoesNotCallCudaMalloc) {
  const int64_t sizes[] = {100, 4000, 70000, 3 * kMiB, 17 * kMiB};
  int64_t after_first = -1;
  for (int iter = 0; iter < 1000; ++iter) {
    std::vector<Tensor> live;
    for (int64_t n : sizes) live.push_back(device_bytes(n));
    live.clear();
    if (iter == 0) after_first = cuda::memory_stats(0).num_device_mallocs;
  }
  EXPECT_EQ(cuda::memory_stats(0).num_device_mallocs, after_first);
}

TEST_F(CudaMemory, StatisticsAreExact) {
  const cuda::MemoryStats s0 = cuda::memory_stats(0);
  ASSERT_EQ(s0.allocated_bytes, 0) << "another test keeps CUDA tensors alive";
  ASSERT_EQ(s0.reserved_bytes, 0);
  cuda::reset_peak_memory_stats(0);
  {
    Tensor small = device_bytes(kMiB);      // small pool: one 2 MiB segment
    Tensor large = device_bytes(4 * kMiB);  // large pool: its own 4 MiB segment
    Tensor odd = device_bytes(1000);        // rounded to 1024, from the small segment's remainder
    const cuda::MemoryStats s = cuda::memory_stats(0);
    EXPECT_EQ(s.allocated_bytes, 5 * kMiB + 1024);
    EXPECT_EQ(s.reserved_bytes, 6 * kMiB);
    EXPECT_EQ(s.peak_allocated_bytes, 5 * kMiB + 1024);
    EXPECT_EQ(s.peak_reserved_bytes, 6 * kMiB);
    EXPECT_EQ(s.active_blocks, s0.active_blocks + 3);
    EXPECT_EQ(s.num_device_mallocs, s0.num_device_mallocs + 2);
    EXPECT_EQ(s.cached_blocks, 1);  // what is left of the small segment
  }
  const cuda::MemoryStats s = cuda::memory_stats(0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.reserved_bytes, 6 * kMiB);  // cached, not returned
  EXPECT_EQ(s.peak_allocated_bytes, 5 * kMiB + 1024);
  EXPECT_EQ(s.active_blocks, s0.active_blocks);
  EXPECT_EQ(s.cached_blocks, 2);  // one whole block per segment after coalescing
  cuda::reset_peak_memory_stats(0);
  EXPECT_EQ(cuda::memory_stats(0).peak_allocated_bytes, 0);
  EXPECT_EQ(cuda::memory_stats(0).peak_reserved_bytes, 6 * kMiB);
  const std::string summary = cuda::memory_summary(0);
  EXPECT_NE(summary.find("reserved"), std::string::npos) << summary;
  EXPECT_NE(summary.find("6.00"), std::string::npos) << summary;
}

TEST_F(CudaMemory, SplitsAndCoalesces) {
  char* whole = nullptr;
  { whole = address(device_bytes(8 * kMiB)); }
  const int64_t mallocs = cuda::memory_stats(0).num_device_mallocs;
  {
    Tensor a = device_bytes(4 * kMiB);
    Tensor b = device_bytes(4 * kMiB);
    EXPECT_EQ(address(a), whole);
    EXPECT_EQ(address(b), whole + 4 * kMiB);
  }
  Tensor full = device_bytes(8 * kMiB);  // the two halves merged back into one block
  EXPECT_EQ(address(full), whole);
  EXPECT_EQ(cuda::memory_stats(0).num_device_mallocs, mallocs);
}

TEST_F(CudaMemory, CrossStreamFreeWaitsForTheOtherStream) {
  cuda::Stream side = cuda::Stream::create(0);
  std::optional<Tensor> x = device_bytes(64 * kMiB);  // allocated on the default stream
  char* const x_ptr = address(*x);
  Tensor load = device_bytes(1024 * kMiB);
  busy(load, side, 400);  // about 0.2 s of memsets on the side stream
  busy(*x, side, 1);      // ... and then x is written there
  cuda::record_stream(*x, side);
  cuda::Event side_done;
  side_done.record(side);
  x.reset();  // freed while the side stream may still write it
  ASSERT_FALSE(side_done.query()) << "the side stream finished too fast for this test to mean anything";
  Tensor y = device_bytes(64 * kMiB);
  EXPECT_NE(address(y), x_ptr) << "a block still used by another stream was handed out";
  side.synchronize();
  Tensor z = device_bytes(64 * kMiB);  // now the block is free for the default stream again
  EXPECT_EQ(address(z), x_ptr);
}

// A piece of a split gradient (internal::split_owned) has a Storage that starts inside the allocator's block:
// recording a stream on it protects the whole block, which is freed when the last piece is.
TEST_F(CudaMemory, CrossStreamFreeOfAnOwnedPieceWaitsForTheOtherStream) {
  Tensor whole = empty({2, 32 * kMiB}, {.dtype = DType::UInt8, .device = Device::cuda(0)});
  char* const whole_ptr = address(whole);
  std::vector<Tensor> pieces = internal::split_owned(std::move(whole), {1, 1});
  ASSERT_EQ(pieces.size(), 2u);
  ASSERT_EQ(address(pieces[1]), whole_ptr + 32 * kMiB);
  ASSERT_NE(pieces[1].impl().storage(), pieces[0].impl().storage()) << "the pieces are views, not owned pieces";
  cuda::Stream side = cuda::Stream::create(0);
  Tensor load = device_bytes(1024 * kMiB);
  busy(load, side, 400);     // about 0.2 s of memsets on the side stream
  busy(pieces[1], side, 1);  // ... and then the second piece is written there
  cuda::record_stream(pieces[1], side);
  cuda::Event side_done;
  side_done.record(side);
  pieces.clear();  // the block is freed while the side stream may still write it
  ASSERT_FALSE(side_done.query()) << "the side stream finished too fast for this test to mean anything";
  Tensor y = device_bytes(64 * kMiB);
  EXPECT_NE(address(y), whole_ptr) << "a block still used by another stream was handed out";
  side.synchronize();
  Tensor z = device_bytes(64 * kMiB);
  EXPECT_EQ(address(z), whole_ptr);
}

// A tensor used on a stream whose last handle went before the tensor (a group's or a loader's stream): freeing
// it records an event on that stream, which must still be valid then; streams are pooled, not destroyed.
TEST_F(CudaMemory, FreeAfterTheRecordedStreamIsGone) {
  std::optional<Tensor> x = device_bytes(8 * kMiB);
  void* handle = nullptr;
  {
    cuda::Stream side = cuda::Stream::create(0);
    handle = side.handle();
    busy(*x, side, 1);
    cuda::record_stream(*x, side);
  }
  x.reset();  // records on the side stream (gone as a Stream, alive in the pool)
  cuda::synchronize(0);
  Tensor y = device_bytes(8 * kMiB);
  cuda::synchronize(0);
  cuda::Stream again = cuda::Stream::create(0);
  EXPECT_EQ(again.handle(), handle);  // the pool hands the same stream out again
}

TEST_F(CudaMemory, BlocksStayWithTheirStream) {
  cuda::Stream other = cuda::Stream::create(0);
  char* on_default = nullptr;
  { on_default = address(device_bytes(64 * kMiB)); }
  cuda::StreamGuard guard(other);
  Tensor t = device_bytes(64 * kMiB);
  EXPECT_NE(address(t), on_default);
}

TEST_F(CudaMemory, OutOfMemoryExplainsAndRecovers) {
  const int64_t ooms = cuda::memory_stats(0).num_ooms;
  try {
    (void)device_bytes(int64_t{1} << 50);  // 1 PiB
    FAIL() << "1 PiB was allocated";
  } catch (const OutOfMemoryError& e) {
    const std::string message = e.what();
    for (const char* fragment : {"1.00 PiB", "total", "free", "empty_cache", "batch size"})
      EXPECT_NE(message.find(fragment), std::string::npos) << fragment << " missing from: " << message;
  }
  EXPECT_EQ(cuda::memory_stats(0).num_ooms, ooms + 1);
  Tensor t = device_bytes(kMiB);
  EXPECT_NE(address(t), nullptr);
}

TEST_F(CudaMemory, EmptyCacheReturnsEverythingUnused) {
  { Tensor a = device_bytes(3 * kMiB), b = device_bytes(1000), c = device_bytes(40 * kMiB); }
  EXPECT_GT(cuda::memory_stats(0).reserved_bytes, 0);
  cuda::empty_cache();
  const cuda::MemoryStats s = cuda::memory_stats(0);
  ASSERT_EQ(s.allocated_bytes, 0) << "another test keeps CUDA tensors alive";
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(s.cached_blocks, 0);
  EXPECT_EQ(s.num_device_frees, s.num_device_mallocs);
}

TEST_F(CudaMemory, EmptyCacheKeepsSegmentsInUse) {
  Tensor kept = device_bytes(1000);
  { Tensor gone = device_bytes(1000); }
  cuda::empty_cache();
  EXPECT_EQ(cuda::memory_stats(0).reserved_bytes, 2 * kMiB);  // the segment `kept` lives in
}

TEST_F(CudaMemory, ZeroBytesAllocateNothing) {
  const int64_t mallocs = cuda::memory_stats(0).num_device_mallocs;
  Tensor t = device_bytes(0);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(cuda::memory_stats(0).num_device_mallocs, mallocs);
}

TEST_F(CudaMemory, PinnedHostMemoryIsReused) {
  void* first = nullptr;
  {
    Tensor p = empty({1 << 20}, {.dtype = DType::UInt8, .pinned_memory = true});
    EXPECT_TRUE(p.device().is_cpu());
    first = p.data_ptr<void>();
    static_cast<unsigned char*>(first)[12345] = 7;  // host memory: writable from the CPU
  }
  cuda::synchronize(0);  // the event recorded at free has completed
  Tensor again = empty({1 << 20}, {.dtype = DType::UInt8, .pinned_memory = true});
  EXPECT_EQ(again.data_ptr<void>(), first);
  unsigned int flags = 0;
  EXPECT_EQ(cudaHostGetFlags(&flags, again.data_ptr<void>()), cudaSuccess) << "not page-locked memory";
}

TEST_F(CudaMemory, LargePinnedBlocksAreHugePageMappingsRegisteredWithCuda) {
  // 80 MiB: at least the 32 MiB from which the pinned allocator takes a huge-page block (2 MiB-aligned, advised as
  // huge pages: kiln/tensor/huge_pages.h) and registers it, where the devices read registered memory at its host
  // address.
  int host_pointers = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&host_pointers, cudaDevAttrCanUseHostPointerForRegisteredMem, 0), cudaSuccess);
  const int64_t n = 20 * kMiB;
  void* first = nullptr;
  void* second = nullptr;
  {
    Tensor pinned = empty({n}, {.dtype = DType::Int32, .pinned_memory = true});
    first = pinned.data_ptr<void>();
    EXPECT_TRUE(pinned.is_pinned());
    unsigned int flags = 0;
    EXPECT_EQ(cudaHostGetFlags(&flags, first), cudaSuccess) << "not page-locked memory";
    if (host_pointers != 0) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (2 * kMiB), 0u) << "not a 2 MiB-aligned mapping";
    }
    pinned.copy_(arange(n, {.dtype = DType::Int32}));
    Tensor back = empty({n}, {.dtype = DType::Int32, .pinned_memory = true});
    second = back.data_ptr<void>();
    {
      Tensor dev = pinned.to(Device::cuda(0), /*non_blocking=*/true);
      dev.add_(1);
      back.copy_(dev, /*non_blocking=*/true);
    }
    cuda::synchronize(0);
    const int32_t* p = back.data_ptr<int32_t>();
    for (int64_t i = 0; i < n; i += 65'537) ASSERT_EQ(p[i], static_cast<int32_t>(i + 1)) << i;
  }
  cuda::synchronize(0);
  Tensor again = empty({n}, {.dtype = DType::Int32, .pinned_memory = true});
  EXPECT_TRUE(again.data_ptr<void>() == first || again.data_ptr<void>() == second) << "a freed block is not reused";
}

TEST_F(CudaMemory, PinMemoryAndNonBlockingCopiesRoundTrip) {
  const int64_t n = 1 << 22;
  Tensor host = arange(n, {.dtype = DType::Float32});
  EXPECT_FALSE(host.is_pinned());
  Tensor pinned = host.pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_TRUE(pinned.pin_memory().is_same(pinned));
  cuda::Stream side = cuda::Stream::create(0);
  Tensor back;
  {
    cuda::StreamGuard guard(side);
    Tensor dev = pinned.to(Device::cuda(0), /*non_blocking=*/true);
    dev.mul_(2);
    back = empty({n}, {.dtype = DType::Float32, .pinned_memory = true});
    back.copy_(dev, /*non_blocking=*/true);
  }
  side.synchronize();
  const float* p = back.data_ptr<float>();
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(p[i], 2.0f * static_cast<float>(i)) << i;
  testing::expect_error([&] { zeros({2}, {.device = Device::cuda(0)}).pin_memory(); },
                        {"pin_memory", "only CPU tensors", "cuda:0"});
}

TEST(CudaPeer, CopiesBetweenTwoGpus) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  Tensor host = arange(1 << 20, {.dtype = DType::Float32}).reshape({1024, 1024});
  Tensor a = host.to(Device::cuda(0));
  Tensor b = a.to(Device::cuda(1));  // contiguous: a peer copy
  EXPECT_EQ(b.device(), Device::cuda(1));
  EXPECT_TRUE(equal(b.cpu(), host));
  Tensor t = a.t().to(Device::cuda(1), DType::Float64);  // strided and cast on the way
  EXPECT_TRUE(equal(t.cpu(), host.t().to(DType::Float64)));
  Tensor back = zeros({1024, 1024}, {.device = Device::cuda(0)});
  back.copy_(b, /*non_blocking=*/true);
  cuda::synchronize(0);
  cuda::synchronize(1);
  EXPECT_TRUE(equal(back.cpu(), host));
}

TEST_F(CudaMemory, StreamsAndCurrentStream) {
  const cuda::Stream def = cuda::Stream::default_stream(0);
  EXPECT_EQ(def.handle(), nullptr);
  EXPECT_EQ(cuda::current_stream(0), def);
  cuda::Stream s = cuda::Stream::create(0);
  cuda::Stream high = cuda::Stream::create(0, /*high_priority=*/true);
  EXPECT_NE(s.handle(), nullptr);
  EXPECT_FALSE(s == high);
  {
    cuda::StreamGuard guard(s);
    EXPECT_EQ(cuda::current_stream(0), s);
    // The current stream is per thread: another thread still sees the default stream.
    bool other_thread_default = false;
    std::thread([&] { other_thread_default = cuda::current_stream(0) == def; }).join();
    EXPECT_TRUE(other_thread_default);
  }
  EXPECT_EQ(cuda::current_stream(0), def);
  s.synchronize();
  EXPECT_TRUE(s.query());
  expect_error([] { cuda::Stream::create(cuda::device_count()); }, {"does not exist"});
}

TEST_F(CudaMemory, EventsRecordWaitAndTime) {
  cuda::Stream s = cuda::Stream::create(0);
  cuda::Event start(/*enable_timing=*/true), end(/*enable_timing=*/true);
  EXPECT_TRUE(start.query());  // nothing recorded, nothing pending
  expect_error([&] { start.synchronize(); }, {"never recorded"});
  expect_error([&] { start.wait(s); }, {"never recorded"});
  expect_error([&] { (void)start.elapsed_ms(end); }, {"recorded"});

  Tensor buffer = device_bytes(256 * kMiB);
  start.record(s);
  busy(buffer, s, 20);
  end.record(s);
  // The default stream waits for s on the GPU: work queued there after this runs after the memsets.
  cuda::Event handoff;
  handoff.record(s);
  handoff.wait(cuda::Stream::default_stream(0));
  cuda::synchronize(0);
  EXPECT_TRUE(end.query());
  EXPECT_TRUE(handoff.query());
  EXPECT_GT(start.elapsed_ms(end), 0.0f);
  expect_error([&] { (void)handoff.elapsed_ms(end); }, {"enable_timing"});

  cuda::Event current;
  current.record();  // on the current stream of the current device
  current.synchronize();
  EXPECT_TRUE(current.query());
}

// The value `name` had in the environment the process started with (/proc/self/environ, which setenv does not
// change), or nothing where it was not set.
std::optional<std::string> initial_environment(const std::string& name) {
  std::ifstream in("/proc/self/environ", std::ios::binary);
  const std::string prefix = name + "=";
  for (std::string entry; std::getline(in, entry, '\0');) {
    if (entry.rfind(prefix, 0) == 0) return entry.substr(prefix.size());
  }
  return std::nullopt;
}

// kiln asks CUDA for 32 hardware work queues per GPU (kiln/tensor/cuda/device.cpp) when the library loads, unless the
// environment the process started with already named a number. Needs no GPU: it is the environment before any context.
TEST(CudaQueues, AskForThirtyTwoUnlessTheEnvironmentSaidHowMany) {
  const char* now = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  ASSERT_NE(now, nullptr) << "kiln left CUDA_DEVICE_MAX_CONNECTIONS unset";
  EXPECT_EQ(std::string(now), initial_environment("CUDA_DEVICE_MAX_CONNECTIONS").value_or("32"));
}

TEST_F(CudaMemory, CudaDeviceGuard) {
  cuda::set_device(0);
  {
    cuda::DeviceGuard guard(0);
    EXPECT_EQ(cuda::current_device(), 0);
  }
  if (cuda::device_count() > 1) {
    {
      cuda::DeviceGuard guard(1);
      EXPECT_EQ(cuda::current_device(), 1);
    }
    EXPECT_EQ(cuda::current_device(), 0);
  }
  expect_error([] { cuda::DeviceGuard guard(cuda::device_count()); }, {"does not exist"});
  EXPECT_EQ(cuda::current_device(), 0);
}

// The other side: a machine without a GPU (CI) must say so clearly, not crash.
TEST(CudaWithoutGpu, SaysNoDeviceIsVisible) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  EXPECT_FALSE(cuda::is_available());
  expect_error([] { (void)zeros({2}, {.device = Device::cuda(0)}); }, {"0 CUDA device(s) are visible"});
  expect_error([] { (void)cuda::memory_stats(0); }, {"no CUDA device"});
  expect_error([] { (void)cuda::current_stream(0); }, {"no CUDA device"});
  expect_error([] { (void)cuda::Stream::create(0); }, {"no CUDA device"});
  EXPECT_FALSE(ones({2}).is_pinned());
  expect_error([] { (void)ones({2}).pin_memory(); }, {"pinned host memory needs a GPU"});
}

#else  // a build without the CUDA backend

TEST(CudaWithoutGpu, SaysTheBuildHasNoCuda) {
  expect_error([] { (void)zeros({2}, {.device = Device::cuda(0)}); }, {"no CUDA backend"});
  EXPECT_FALSE(ones({2}).is_pinned());
  expect_error([] { (void)ones({2}).pin_memory(); }, {"pinned host memory needs a GPU"});
}

#endif

}  // namespace
}  // namespace kiln
