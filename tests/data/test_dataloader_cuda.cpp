// The DataLoader's device delivery: pinned collation, copies ahead on a copy stream, the consumer's stream
// waiting on the copy's event. Skips without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "kiln/data/dataloader.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using data::Batch;
using data::DataLoader;
using std::vector;

#define KILN_NEED_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible"

// Sample i: "x" of `width` float32 values, element j = i + j / width + u (u from the sample's rng); "y" = i.
class Rows : public data::Dataset {
 public:
  Rows(int64_t n, int64_t width) : n_(n), width_(width) {}
  int64_t size() const override { return n_; }
  data::Example get(int64_t i, data::SampleRng& rng) const override {
    Tensor x =
        internal::arange(width_, {.dtype = DType::Float32}) * (1.0 / double(width_)) + (double(i) + rng.uniform());
    return {{"x", x}, {"y", internal::scalar_tensor(i)}};
  }

 private:
  int64_t n_, width_;
};

vector<Batch> cpu_batches(std::shared_ptr<const data::Dataset> ds, data::DataLoaderOptions o, uint64_t epoch) {
  o.device.reset();
  o.pin_memory = false;
  DataLoader loader(std::move(ds), o);
  vector<Batch> out;
  for (Batch& b : loader.epoch(epoch)) out.push_back(b);
  return out;
}

TEST(CudaDataLoader, DeviceDeliveryEqualsCpuBatches) {
  KILN_NEED_GPU();
  auto ds = std::make_shared<Rows>(50, 1000);
  for (int workers : {0, 1, 4}) {
    data::DataLoaderOptions o{
        .batch_size = 8, .workers = workers, .shuffle = true, .seed = 3, .device = Device::cuda(0)};
    const vector<Batch> expect = cpu_batches(ds, o, 1);
    DataLoader loader(ds, o);
    size_t k = 0;
    for (Batch& b : loader.epoch(1)) {
      ASSERT_LT(k, expect.size());
      EXPECT_EQ(b.indices, expect[k].indices);
      for (const char* f : {"x", "y"}) {
        EXPECT_TRUE(b[f].is_cuda()) << f;
        EXPECT_EQ(b[f].device(), Device::cuda(0));
        EXPECT_TRUE(internal::equal(b[f].to(Device::cpu()), expect[k][f])) << "batch " << k << " field " << f;
      }
      ++k;
    }
    EXPECT_EQ(k, expect.size()) << workers << " workers";
  }
}

TEST(CudaDataLoader, PinMemoryCollatesIntoPinnedMemory) {
  KILN_NEED_GPU();
  auto ds = std::make_shared<Rows>(12, 64);
  DataLoader pinned(ds, {.batch_size = 4, .workers = 2, .pin_memory = true});
  DataLoader plain(ds, {.batch_size = 4, .workers = 2});
  const vector<Batch> expect = cpu_batches(ds, {.batch_size = 4}, 0);
  size_t k = 0;
  for (Batch& b : pinned.epoch(0)) {
    EXPECT_TRUE(b["x"].is_cpu());
    EXPECT_TRUE(b["x"].is_pinned());
    EXPECT_TRUE(b["y"].is_pinned());
    // Users who copy themselves: an async copy from the pinned batch on the current stream.
    Batch d = b.to(Device::cuda(0), /*non_blocking=*/true);
    EXPECT_TRUE(d["x"].is_cuda());
    EXPECT_TRUE(internal::equal(d["x"].to(Device::cpu()), expect[k]["x"]));
    ++k;
  }
  EXPECT_EQ(k, 3u);
  for (Batch& b : plain.epoch(0)) EXPECT_FALSE(b["x"].is_pinned());
}

// 64 MiB batches: the copy of the batch just handed out is typically still running when the consumer,
// on its own stream, reads it at once; the event wait must order the read after the copy.
TEST(CudaDataLoader, BatchReadAtOnceWhileItsCopyMayStillRun) {
  KILN_NEED_GPU();
  const int64_t width = int64_t{1} << 22;  // 16 MiB a sample
  auto ds = std::make_shared<Rows>(12, width);
  const vector<Batch> expect = cpu_batches(ds, {.batch_size = 4}, 0);
  for (int workers : {0, 3}) {
    cuda::Stream consumer = cuda::Stream::create(0);
    cuda::StreamGuard guard(consumer);  // batches are handed out to this stream
    DataLoader loader(ds, {.batch_size = 4, .workers = workers, .device = Device::cuda(0)});
    size_t k = 0;
    for (Batch& b : loader.epoch(0)) {
      Tensor doubled = b["x"] * 2.0;            // a kernel on the consumer stream, right away
      Tensor host = doubled.to(Device::cpu());  // and a copy back on it
      EXPECT_TRUE(internal::equal(host, expect[k]["x"] * 2.0)) << "batch " << k << ", " << workers << " workers";
      EXPECT_EQ(b["y"].to(Device::cpu()).to_vector<int64_t>(), expect[k].indices);
      ++k;
    }
    EXPECT_EQ(k, 3u);
  }
}

TEST(CudaDataLoader, EarlyBreakFreesDeviceMemoryAndThreads) {
  KILN_NEED_GPU();
  auto ds = std::make_shared<Rows>(64, 1 << 16);
  {
    DataLoader warm(ds, {.batch_size = 8, .workers = 2, .device = Device::cuda(0)});
    for (Batch& b : warm.epoch(0)) (void)b;
  }
  cuda::synchronize(0);
  const int threads = thread_count();
  const int64_t allocated = cuda::memory_stats(0).allocated_bytes;
  {
    DataLoader loader(ds, {.batch_size = 8, .workers = 4, .device = Device::cuda(0)});
    for (int epoch = 0; epoch < 3; ++epoch) {
      int n = 0;
      for (Batch& b : loader.epoch(epoch)) {
        EXPECT_TRUE(b["x"].is_cuda());
        if (++n == 2) break;  // batch 3 may be in flight to the device: dropped cleanly
      }
    }
  }
  cuda::synchronize(0);
  EXPECT_EQ(thread_count(), threads);
  EXPECT_EQ(cuda::memory_stats(0).allocated_bytes, allocated);
}

TEST(CudaDataLoader, DeliversToTheLastGpu) {
  KILN_NEED_GPU();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  const int last = cuda::device_count() - 1;
  auto ds = std::make_shared<Rows>(10, 32);
  const vector<Batch> expect = cpu_batches(ds, {.batch_size = 5}, 0);
  DataLoader loader(ds, {.batch_size = 5, .workers = 2, .device = Device::cuda(last)});
  size_t k = 0;
  for (Batch& b : loader.epoch(0)) {
    EXPECT_EQ(b["x"].device(), Device::cuda(last));
    EXPECT_TRUE(internal::equal(b["x"].to(Device::cpu()), expect[k++]["x"]));
  }
  EXPECT_EQ(cuda::current_device(), 0) << "the loader leaves the current device alone";
  expect_error([&] { DataLoader(ds, {.device = Device::cuda(last + 1)}); }, {"does not exist"});
}

}  // namespace
}  // namespace kiln::testing
