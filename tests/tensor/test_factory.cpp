// Factories: shapes, dtypes, values, memory formats, and their errors.
#include <cmath>

#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::expect_values;

class FactoryTest : public testing::BackendTest {};

TEST_P(FactoryTest, ZerosOnesFullInEveryDType) {
  for (DType dt : {DType::Bool, DType::UInt8, DType::Int32, DType::Int64, DType::Float16, DType::BFloat16,
                   DType::Float32, DType::Float64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor z = zeros({2, 3}, opts(dt));
    EXPECT_EQ(z.dtype(), dt);
    EXPECT_EQ(z.device(), dev());
    expect_values(z, {2, 3}, std::vector<double>(6, 0.0));
    expect_values(ones({4}, opts(dt)), {4}, std::vector<double>(4, 1.0));
    const double v = dt == DType::Bool ? 1.0 : 3.0;
    expect_values(full({2, 2}, v, opts(dt)), {2, 2}, std::vector<double>(4, v));
  }
}

TEST_P(FactoryTest, DefaultsAndInferredDTypes) {
  EXPECT_EQ(zeros({1}, {.device = dev()}).dtype(), DType::Float32);
  EXPECT_EQ(full({1}, 2, {.device = dev()}).dtype(), DType::Int64);
  EXPECT_EQ(full({1}, 2.5, {.device = dev()}).dtype(), DType::Float32);
  EXPECT_EQ(full({1}, true, {.device = dev()}).dtype(), DType::Bool);
  EXPECT_EQ(arange(5, {.device = dev()}).dtype(), DType::Int64);
  EXPECT_EQ(arange(0, 1.0, 0.25, {.device = dev()}).dtype(), DType::Float32);
}

TEST_P(FactoryTest, ZeroSizeAndZeroDim) {
  Tensor e = zeros({0, 3}, opts());
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.shape(), (Shape{0, 3}));
  Tensor s = full({}, 7.5, opts(DType::Float64));
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<double>(), 7.5);
  EXPECT_EQ(scalar_tensor(3, {.device = dev()}).item<int64_t>(), 3);
}

TEST_P(FactoryTest, ArangeMatchesPythonRanges) {
  expect_values(arange(5, {.device = dev()}), {5}, {0, 1, 2, 3, 4});
  expect_values(arange(2, 11, 3, {.device = dev()}), {3}, {2, 5, 8});
  expect_values(arange(5, 0, -2, {.device = dev()}), {3}, {5, 3, 1});
  expect_values(arange(0.0, 1.0, 0.25, opts(DType::Float64)), {4}, {0, 0.25, 0.5, 0.75});
  expect_values(arange(1.0, 2.05, 0.5, opts(DType::Float32)), {3}, {1.0, 1.5, 2.0});
  EXPECT_EQ(arange(3, 3, 1, {.device = dev()}).numel(), 0);
  expect_error([&] { arange(0, 5, 0, {.device = dev()}); }, {"arange", "step must be nonzero"});
  expect_error([&] { arange(0, 5, -1, {.device = dev()}); }, {"arange", "same sign"});
}

TEST_P(FactoryTest, LinspaceIsSymmetricAndExactAtEnds) {
  expect_values(linspace(0, 1, 5, opts(DType::Float64)), {5}, {0, 0.25, 0.5, 0.75, 1});
  expect_values(linspace(-1, 1, 3, opts()), {3}, {-1, 0, 1});
  expect_values(linspace(2, 3, 1, opts()), {1}, {2});
  EXPECT_EQ(linspace(0, 1, 0, opts()).numel(), 0);
  // The last element is exactly `end` even when the step is not exact in binary.
  EXPECT_EQ(linspace(0, 0.3, 4, opts(DType::Float64)).to_vector<double>()[3], 0.3);
  expect_error([&] { linspace(0, 1, -1, opts()); }, {"linspace", "non-negative"});
}

TEST_P(FactoryTest, Eye) {
  expect_values(eye(3, {}, opts()), {3, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1});
  expect_values(eye(2, 3, opts(DType::Int32)), {2, 3}, {1, 0, 0, 0, 1, 0});
  expect_values(eye(3, 2, opts()), {3, 2}, {1, 0, 0, 1, 0, 0});
  EXPECT_EQ(eye(0, {}, opts()).numel(), 0);
}

TEST_P(FactoryTest, FromVectorRoundTripsEveryType) {
  Tensor a = from_vector<int32_t>({1, -2, 3, 4, 5, 6}, {2, 3}, dev());
  EXPECT_EQ(a.dtype(), DType::Int32);
  EXPECT_EQ(a.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, 4, 5, 6}));
  Tensor b = from_vector<bool>({true, false, true}, {3}, dev());
  EXPECT_EQ(b.to_vector<bool>(), (std::vector<bool>{true, false, true}));
  Tensor h = from_vector<Half>({Half(1.5f), Half(-2.0f)}, {2}, dev());
  expect_values(h, {2}, {1.5, -2.0});
  expect_error([&] { from_vector<float>({1, 2, 3}, {2, 2}, dev()); }, {"from_vector", "3 values", "[2, 2]"});
}

TEST_P(FactoryTest, ChannelsLastLayout) {
  Tensor x = empty({2, 3, 4, 5}, {.device = dev(), .memory_format = MemoryFormat::ChannelsLast});
  EXPECT_EQ(x.strides(), (Strides{60, 1, 15, 3}));
  EXPECT_TRUE(x.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_FALSE(x.is_contiguous());
  EXPECT_EQ(x.suggest_memory_format(), MemoryFormat::ChannelsLast);
  Tensor like = zeros_like(x);
  EXPECT_EQ(like.strides(), x.strides());
  expect_error(
      [&] {
        empty({2, 3}, {.device = dev(), .memory_format = MemoryFormat::ChannelsLast});
      },
      {"ChannelsLast", "4-D", "[2, 3]"});
}

TEST_P(FactoryTest, LikeFactoriesKeepShapeDeviceAndDType) {
  Tensor x = zeros({2, 5}, opts(DType::Float64));
  Tensor o = ones_like(x);
  EXPECT_EQ(o.shape(), x.shape());
  EXPECT_EQ(o.dtype(), DType::Float64);
  EXPECT_EQ(o.device(), dev());
  expect_values(full_like(x, 2, DType::Int32), {2, 5}, std::vector<double>(10, 2));
  EXPECT_EQ(full_like(x, 2, DType::Int32).dtype(), DType::Int32);
}

TEST_P(FactoryTest, BadShapesAreClearErrors) {
  expect_error([&] { zeros({2, -1}, opts()); }, {"negative size", "[2, -1]"});
  expect_error([&] { empty_strided({2, 2}, {1}, opts()); }, {"empty_strided", "different lengths"});
}

KILN_INSTANTIATE_BACKENDS(FactoryTest);

TEST(Factory, PinnedMemoryNeedsCuda) {
  expect_error([] { empty({4}, {.device = Device::cuda(0), .pinned_memory = true}); }, {"pinned", "host memory"});
}

TEST(Factory, CudaTensorsNeedTheCudaBackend) {
  if (testing::test_devices().size() > 1) GTEST_SKIP() << "a GPU is visible";
  expect_error([] { zeros({2}, {.device = Device::cuda(0)}); }, {"CUDA"});
}

}  // namespace
}  // namespace kiln
