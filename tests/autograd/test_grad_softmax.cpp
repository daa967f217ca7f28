// Gradients of softmax and log_softmax: gradcheck in float64 along each dim, on strided inputs and on
// 0-d tensors; hand-derived values; the saved result's version check; autocast.
#include <gtest/gtest.h>

#include <cmath>

#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class SoftmaxGradTest : public BackendTest {};

TEST(SoftmaxGrad, Gradcheck) {
  for (bool log : {false, true}) {
    SCOPED_TRACE(log ? "log_softmax" : "softmax");
    auto along = [log](int64_t dim) {
      return [log, dim](const TensorList& in) {
        return TensorList{log ? kiln::log_softmax(in[0], dim) : kiln::softmax(in[0], dim)};
      };
    };
    check_gradients(along(-1), {make_input({3, 4}, -2, 2)});
    check_gradients(along(0), {make_input({3, 4}, -2, 2)});
    check_gradients(along(1), {make_input({2, 3, 2}, -2, 2)});
    check_gradients(along(-1), {non_contiguous(make_input({3, 4}, -2, 2).detach()).requires_grad_()});
    check_gradients(along(0), {make_input({}, -2, 2)});
  }
}

TEST_P(SoftmaxGradTest, SoftmaxValues) {
  // y = softmax([0, 0]) = [1/2, 1/2]; with g = [1, 0]: y * (g - sum(g y)) = [1/4, -1/4].
  // y = softmax([0, ln 3]) = [1/4, 3/4]; with g = [2, 2] the gradient is 0 (softmax sums to a constant).
  Tensor a = make({0, 0, 0, std::log(3.0)}, {2, 2}, opts()).requires_grad_();
  Tensor y = kiln::softmax(a, -1);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "SoftmaxBackward");
  y.backward(make({1, 0, 2, 2}, {2, 2}, opts()));
  expect_values(a.grad(), {2, 2}, {0.25, -0.25, 0, 0}, -1, 1e-6);
}

TEST_P(SoftmaxGradTest, LogSoftmaxValues) {
  // y = log_softmax([0, ln 3]) along dim 0; g = [1, 0]: g - softmax * sum(g) = [1 - 1/4, -3/4].
  Tensor a = make({0, std::log(3.0)}, {2, 1}, opts()).requires_grad_();
  Tensor y = kiln::log_softmax(a, 0);
  EXPECT_EQ(y.grad_fn()->name(), "LogSoftmaxBackward");
  y.backward(make({1, 0}, {2, 1}, opts()));
  expect_values(a.grad(), {2, 1}, {0.75, -0.75});
}

TEST_P(SoftmaxGradTest, SavesItsResultWithAVersionCheck) {
  Tensor a = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor y = kiln::softmax(a, 0);
  {
    NoGradGuard no_grad;
    y.mul_(2.0);
  }
  expect_error([&] { y.sum().backward(); }, {"SoftmaxBackward", "modified in place"});
  // The input itself is not saved: changing it after the forward does not matter.
  Tensor b = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor h = b * 1.0;
  Tensor z = kiln::log_softmax(h, 0);
  {
    NoGradGuard no_grad;
    h.add_(5.0);
  }
  z.backward(make({1, 0, 0}, {3}, opts()));
  EXPECT_TRUE(b.grad().defined());
}

TEST_P(SoftmaxGradTest, BadDimIsReportedByTheForward) {
  Tensor a = make({1, 2, 3}, {3}, opts()).requires_grad_();
  expect_error([&] { kiln::softmax(a, 1); }, {"softmax", "dim"});
  expect_error([&] { kiln::log_softmax(a, -2); }, {"log_softmax", "dim"});
}

TEST_P(SoftmaxGradTest, AutocastComputesInFloat32) {
  // Policy Float32: a bfloat16 input is computed in float32 (the cast's own gradient belongs to `to`).
  Tensor h = make({0, 1, 2, 3}, {2, 2}, opts(DType::BFloat16));
  {
    autocast::Guard cast(dev().type(), DType::BFloat16);
    EXPECT_EQ(kiln::softmax(h, 1).dtype(), DType::Float32);
    EXPECT_EQ(kiln::log_softmax(h, 0).dtype(), DType::Float32);
  }
  // A float32 input stays float32 and records as usual.
  Tensor a = make({0, 1, 2, 3}, {2, 2}, opts()).requires_grad_();
  Tensor y;
  {
    autocast::Guard cast(dev().type(), DType::BFloat16);
    y = kiln::softmax(a, 1);
  }
  EXPECT_EQ(y.dtype(), DType::Float32);
  EXPECT_EQ(y.grad_fn()->name(), "SoftmaxBackward");
  y.backward(make({1, 0, 0, 1}, {2, 2}, opts()));
  // softmax([0, 1]) = [s, 1 - s], s = 1 / (1 + e); gradient for g = [1, 0]: [s (1 - s), -s (1 - s)].
  const double s = 1 / (1 + std::exp(1.0)), d = s * (1 - s);
  expect_values(a.grad(), {2, 2}, {d, -d, -d, d});
}

KILN_INSTANTIATE_BACKENDS(SoftmaxGradTest);

}  // namespace
}  // namespace kiln::testing
