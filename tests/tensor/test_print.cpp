// Printing: PyTorch's layout of values, then shape, dtype and device.
#include "support/test_support.h"

namespace kiln {
namespace {

TEST(Print, FloatsIntsBoolsAndMetadata) {
  Tensor x = testing::make({0.1, -2, 3.5, 4}, {2, 2});
  EXPECT_EQ(x.str(),
            "tensor([[ 0.1000, -2.0000],\n        [ 3.5000,  4.0000]], shape=[2, 2], dtype=float32, device=cpu)");
  EXPECT_EQ(testing::make({1, 2, 3}, {3}).str(), "tensor([1., 2., 3.], shape=[3], dtype=float32, device=cpu)");
  EXPECT_EQ(from_vector<int64_t>({1, -20, 300}, {3}).str(),
            "tensor([  1, -20, 300], shape=[3], dtype=int64, device=cpu)");
  EXPECT_EQ(from_vector<bool>({true, false}, {2}).str(), "tensor([ true, false], shape=[2], dtype=bool, device=cpu)");
  EXPECT_EQ(full({}, 2.5, {.dtype = DType::Float64}).str(), "tensor(2.5000, shape=[], dtype=float64, device=cpu)");
  EXPECT_EQ(zeros({0, 3}).str(), "tensor([], shape=[0, 3], dtype=float32, device=cpu)");
  EXPECT_EQ(Tensor().str(), "tensor(undefined)");
}

TEST(Print, ScientificForWideRanges) {
  EXPECT_EQ(testing::make({1e-5, 1.0}, {2}, {.dtype = DType::Float64}).str(),
            "tensor([1.0000e-05, 1.0000e+00], shape=[2], dtype=float64, device=cpu)");
}

TEST(Print, SummarisesLargeTensors) {
  const std::string s = arange(2000).str();
  EXPECT_EQ(s, "tensor([   0,    1,    2, ..., 1997, 1998, 1999], shape=[2000], dtype=int64, device=cpu)");
}

TEST(Print, NonContiguousPrintsLogicalOrder) {
  Tensor x = from_vector<int32_t>({1, 2, 3, 4}, {2, 2}).t();
  EXPECT_EQ(x.str(), "tensor([[1, 3],\n        [2, 4]], shape=[2, 2], dtype=int32, device=cpu)");
}

}  // namespace
}  // namespace kiln
