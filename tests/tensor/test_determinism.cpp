// Deterministic mode (kiln/tensor/determinism.h): the switch itself, and the CUDA scatter-add that replaces
// atomics while it is on (scatter_add, index_add), and the ordered scatter. The GPU results are compared with the CPU
// backend, which adds duplicates one after another in index order: in float32 and float64 the deterministic GPU path
// adds in that same order and precision, so it must give the CPU's bits exactly; 16-bit floats accumulate in float and
// round once, checked against a float64 reference. Two runs must give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kiln/tensor/cuda.h"
#include "kiln/tensor/determinism.h"
#include "kiln/tensor/generator.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using kiln::testing::expect_error;

TEST(Determinism, SwitchRoundTripsAndIsSeenByOtherThreads) {
  const bool before = deterministic();
  set_deterministic(true);
  EXPECT_TRUE(deterministic());
  bool seen = false;
  std::thread([&] { seen = deterministic(); }).join();
  EXPECT_TRUE(seen);
  std::thread([] { set_deterministic(false); }).join();
  EXPECT_FALSE(deterministic());
  set_deterministic(before);
}

TEST(Determinism, GuardRestoresThePreviousValue) {
  const bool before = deterministic();
  set_deterministic(false);
  {
    DeterministicGuard on(true);
    EXPECT_TRUE(deterministic());
    {
      DeterministicGuard off(false);
      EXPECT_FALSE(deterministic());
    }
    EXPECT_TRUE(deterministic());
  }
  EXPECT_FALSE(deterministic());
  set_deterministic(before);
}

std::string bytes_of(const Tensor& t) {
  const Tensor c = t.cpu().contiguous();
  return {static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.nbytes())};
}

class CudaDeterministicScatter : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
    previous_ = deterministic();
    set_deterministic(true);
  }
  void TearDown() override {
    if (cuda::is_available()) set_deterministic(previous_);
  }
  bool previous_ = false;
};

const Device kGpu = Device::cuda(0);

// An embedding-backward-like index_add: 4096 rows of 64 values summed into 16 rows (about 256 per row).
struct IndexAddCase {
  Tensor base, index, src;  // CPU: (16, 64), (4096,) Int64, (4096, 64)
  explicit IndexAddCase(DType dtype) {
    Generator gen(123);
    base = internal::randn({16, 64}, {.dtype = DType::Float32}, &gen).to(dtype);
    index = internal::randint(0, 16, {4096}, {.dtype = DType::Int64}, &gen);
    src = internal::randn({4096, 64}, {.dtype = DType::Float32}, &gen).to(dtype);
  }
  Tensor on_gpu() const { return internal::index_add(base.to(kGpu), 0, index.to(kGpu), src.to(kGpu)); }
};

TEST_F(CudaDeterministicScatter, IndexAddFloat32EqualsTheCpuBitsAndRepeats) {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const IndexAddCase c(dtype);
    const Tensor cpu = internal::index_add(c.base, 0, c.index, c.src);
    const Tensor first = c.on_gpu();
    const Tensor second = c.on_gpu();
    EXPECT_EQ(bytes_of(first), bytes_of(second));
    EXPECT_EQ(bytes_of(first), bytes_of(cpu)) << "not summed in index order";
  }
}

TEST_F(CudaDeterministicScatter, IndexAddHalfTypesMatchAFloat64Reference) {
  for (DType dtype : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const IndexAddCase c(dtype);
    // The same 16-bit inputs, summed in float64.
    const std::vector<double> ref =
        internal::index_add(c.base.to(DType::Float64), 0, c.index, c.src.to(DType::Float64)).to_vector<double>();
    const Tensor first = c.on_gpu();
    EXPECT_EQ(bytes_of(first), bytes_of(c.on_gpu()));
    const std::vector<double> got = first.to(DType::Float64).cpu().to_vector<double>();
    ASSERT_EQ(got.size(), ref.size());
    // Float accumulation of ~256 terms of size ~1, then one rounding to the 16-bit type.
    const double unit = dtype == DType::Float16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_NEAR(got[i], ref[i], unit * std::abs(ref[i]) + 1e-3) << "element " << i;
    }
  }
}

TEST_F(CudaDeterministicScatter, ScatterAddAlongAnInnerDimOfAStridedSource) {
  Generator gen(7);
  const Tensor base = internal::randn({8, 5, 6}, {}, &gen);
  const Tensor index = internal::randint(0, 5, {8, 300, 6}, {.dtype = DType::Int64}, &gen);
  // src larger than index and transposed: the kernel reads the leading (8, 300, 6) block through strides.
  const Tensor src = internal::transpose(internal::randn({8, 7, 301}, {}, &gen), 1, 2);  // (8, 301, 7)
  const Tensor cpu = internal::scatter_add(base, 1, index, src);
  const Tensor gpu = internal::scatter_add(base.to(kGpu), 1, index.to(kGpu), src.to(kGpu));
  EXPECT_EQ(bytes_of(gpu), bytes_of(cpu));
  EXPECT_EQ(bytes_of(gpu), bytes_of(internal::scatter_add(base.to(kGpu), 1, index.to(kGpu), src.to(kGpu))));
}

TEST_F(CudaDeterministicScatter, InPlaceScatterAddOnAViewWritesOnlyTheView) {
  // out is a column slice of a larger tensor (offset and strides): the other columns stay as they were.
  Tensor full_cpu = internal::zeros({10, 4});
  Tensor full_gpu = internal::zeros({10, 4}, {.device = kGpu});
  const Tensor index = internal::from_vector<int64_t>({3, 3, 9, 0, 3}, {5, 1});
  const Tensor src = internal::from_vector<float>({1.f, 2.f, 4.f, 8.f, 16.f}, {5, 1});
  Tensor view_cpu = internal::slice(full_cpu, 1, 2, 3);
  Tensor view_gpu = internal::slice(full_gpu, 1, 2, 3);
  internal::scatter_add_(view_cpu, 0, index, src);
  internal::scatter_add_(view_gpu, 0, index.to(kGpu), src.to(kGpu));
  EXPECT_EQ(bytes_of(full_gpu), bytes_of(full_cpu));
  EXPECT_EQ(full_gpu.cpu().to_vector<float>()[3 * 4 + 2], 19.f);
}

TEST_F(CudaDeterministicScatter, ScatterWithDuplicatesKeepsTheLastInIndexOrder) {
  Generator gen(5);
  const Tensor base = internal::zeros({6, 33});
  const Tensor index = internal::randint(0, 6, {500, 33}, {.dtype = DType::Int64}, &gen);  // ~83 writers per target
  const Tensor src = internal::randn({500, 33}, {}, &gen);
  const Tensor cpu = internal::scatter(base, 0, index, src);
  const Tensor gpu = internal::scatter(base.to(kGpu), 0, index.to(kGpu), src.to(kGpu));
  EXPECT_EQ(bytes_of(gpu), bytes_of(cpu));
  // Scalar source (a stride-0 view) and a 16-bit dtype go through the same path.
  const Tensor half = internal::scatter(base.to(DType::Float16).to(kGpu), 0, index.to(kGpu), 2.5);
  EXPECT_EQ(bytes_of(half), bytes_of(internal::scatter(base.to(DType::Float16), 0, index, 2.5)));
}

TEST_F(CudaDeterministicScatter, IntegerScatterAddStillExact) {
  const Tensor index = internal::from_vector<int64_t>({1, 1, 0, 1}, {4});
  const Tensor src = internal::from_vector<int64_t>({5, 6, 7, 8}, {4});
  const Tensor gpu = internal::index_add(internal::zeros({2}, {.dtype = DType::Int64, .device = kGpu}), 0,
                                         index.to(kGpu), src.to(kGpu));
  EXPECT_EQ(gpu.cpu().to_vector<int64_t>(), (std::vector<int64_t>{7, 19}));
}

TEST_F(CudaDeterministicScatter, OutOfRangeIndexThrowsAndWritesNothingElsewhere) {
  Tensor out = internal::zeros({4}, {.device = kGpu});
  const Tensor index = internal::from_vector<int64_t>({1, 4, 2}, {3}).to(kGpu);
  const Tensor src = internal::from_vector<float>({1.f, 2.f, 3.f}, {3}).to(kGpu);
  expect_error([&] { internal::scatter_add_(out, 0, index, src).cpu(); }, {"scatter_add", "index 4 is out of range"});
  const std::vector<float> got = out.cpu().to_vector<float>();
  EXPECT_EQ(got[0], 0.f);
  EXPECT_EQ(got[3], 0.f);
}

}  // namespace
}  // namespace kiln
