// Gradients of copy and cast: to, cast, contiguous, clone and copy_. Values pass through unchanged,
// so hand-derived gradients are the output gradients, in the input's dtype and on its device.
#include <gtest/gtest.h>

#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

// Casts through 32 or 16 bits round the input; finite differences over a larger step are still exact
// for these linear functions, up to that rounding.
GradCheckOptions coarse() {
  GradCheckOptions o;
  o.gradcheck.eps = 1e-2;
  o.gradcheck.atol = 1e-3;
  return o;
}

TEST(CopyGrad, Gradchecks) {
  check_gradients([](const TensorList& in) { return TensorList{kiln::clone(in[0])}; }, {make_input({2, 3})});
  check_gradients([](const TensorList& in) { return TensorList{kiln::contiguous(in[0].transpose(0, 1))}; },
                  {make_input({2, 3})});
  check_gradients([](const TensorList& in) { return TensorList{kiln::cast(in[0], DType::Float32) * in[0]}; },
                  {make_input({2, 3})}, coarse());
  // A move to the CPU: on a GPU run the input lives on the GPU and the gradient must move back.
  check_gradients([](const TensorList& in) { return TensorList{kiln::to(in[0], Device::cpu()) * 2}; },
                  {make_input({3})});
  check_gradients([](const TensorList& in) { return TensorList{kiln::to(in[0], Device::cpu(), DType::Float32)}; },
                  {make_input({3})}, coarse());
  // copy_ into a buffer, src broadcast along dim 0: its gradient is summed over that dim.
  check_gradients(
      [](const TensorList& in) {
        Tensor buffer = kiln::zeros({2, 3}, {.dtype = DType::Float64, .device = in[0].device()});
        buffer.copy_(in[0]);
        return TensorList{buffer * buffer};
      },
      {make_input({3})});
}

class CopyGradTest : public BackendTest {};

TEST_P(CopyGradTest, ToAndCastGradientsKeepTheInputDtype) {
  Tensor x = make({1, 2, 3}, {3}, opts(DType::Float32)).requires_grad_();
  Tensor y = x.to(DType::Float64);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "ToBackward");
  (y * make({1, 10, 100}, {3}, opts(DType::Float64))).sum().backward();
  EXPECT_EQ(x.grad().dtype(), DType::Float32);
  EXPECT_EQ(x.grad().device(), dev());
  expect_values(x.grad(), {3}, {1, 10, 100});

  Tensor w = make({1, 2}, {2}, opts(DType::Float64)).requires_grad_();
  Tensor h = kiln::cast(w, DType::BFloat16);
  EXPECT_EQ(h.grad_fn()->name(), "CastBackward");
  EXPECT_EQ(h.dtype(), DType::BFloat16);
  (h * 4).sum().backward();
  EXPECT_EQ(w.grad().dtype(), DType::Float64);
  expect_values(w.grad(), {2}, {4, 4});
}

// x on the test device, its copy on the CPU: the gradient comes back to x's device.
TEST_P(CopyGradTest, ToAnotherDeviceMovesTheGradientBack) {
  Tensor x = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor c = kiln::to(x, Device::cpu(), DType::Float64);
  EXPECT_TRUE(c.is_cpu());
  (c * c).sum().backward();
  EXPECT_EQ(x.grad().device(), dev());
  EXPECT_EQ(x.grad().dtype(), DType::Float32);
  expect_values(x.grad(), {3}, {2, 4, 6});
}

TEST_P(CopyGradTest, NoOpCopiesReturnTheInputAndIntegerResultsRecordNothing) {
  Tensor x = make({1, 2, 3, 4}, {2, 2}, opts()).requires_grad_();
  EXPECT_TRUE(kiln::to(x, dev()).is_same(x));
  EXPECT_TRUE(kiln::cast(x, DType::Float32).is_same(x));
  EXPECT_TRUE(kiln::contiguous(x).is_same(x));
  EXPECT_TRUE(x.contiguous().is_leaf());
  Tensor i = kiln::cast(x, DType::Int64);
  EXPECT_FALSE(i.requires_grad());
  EXPECT_EQ(i.grad_fn(), nullptr);
  NoGradGuard no_grad;
  EXPECT_FALSE(kiln::clone(x).requires_grad());
}

TEST_P(CopyGradTest, CloneAndContiguousPassTheGradientThrough) {
  Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts()).requires_grad_();
  Tensor c = kiln::clone(x);
  EXPECT_EQ(c.grad_fn()->name(), "CloneBackward");
  EXPECT_FALSE(c.is_alias_of(x));
  Tensor t = kiln::contiguous(x.transpose(0, 1));  // (3, 2), a copy
  EXPECT_EQ(t.grad_fn()->name(), "ContiguousBackward");
  EXPECT_TRUE(t.is_contiguous());
  // d/dx [sum(c * 2) + sum(t * x^T)] = 2 + 2 x (t holds x^T's values)
  ((c * 2).sum() + (t * x.transpose(0, 1)).sum()).backward();
  expect_values(x.grad(), {2, 3}, {4, 6, 8, 10, 12, 14});
}

// A buffer that does not require grad, copied into: it now requires grad, and its gradient goes to src.
TEST_P(CopyGradTest, CopyIntoABufferPassesTheGradientToSrc) {
  Tensor src = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor buffer = zeros({2, 3}, opts());
  EXPECT_FALSE(buffer.requires_grad());
  buffer.copy_(src);  // src broadcast over 2 rows
  EXPECT_TRUE(buffer.requires_grad());
  EXPECT_FALSE(buffer.is_leaf());
  EXPECT_EQ(buffer.grad_fn()->name(), "CopyBackward");
  (buffer * make({1, 2, 3, 4, 5, 6}, {2, 3}, opts())).sum().backward();
  expect_values(src.grad(), {3}, {5, 7, 9});

  // A Float64 src into a Float32 buffer: src's gradient is Float64.
  Tensor s64 = make({1, 2}, {2}, opts(DType::Float64)).requires_grad_();
  Tensor b32 = zeros({2}, opts(DType::Float32));
  b32.copy_(s64);
  (b32 * 3).sum().backward();
  EXPECT_EQ(s64.grad().dtype(), DType::Float64);
  expect_values(s64.grad(), {2}, {3, 3});
}

// The overwritten values' history gets no gradient; a src without grad leaves a node with no edges.
TEST_P(CopyGradTest, CopyOverwritesTheDestinationsHistory) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor src = make({5, 6}, {2}, opts()).requires_grad_();
  Tensor dst = a * 2;
  dst.copy_(src);
  expect_values(dst, {2}, {5, 6});
  (dst * 3).sum().backward();
  expect_values(src.grad(), {2}, {3, 3});
  EXPECT_FALSE(a.grad().defined());

  Tensor dst2 = a * 2;
  dst2.copy_(make({7, 8}, {2}, opts()));
  EXPECT_EQ(dst2.grad_fn()->name(), "CopyBackward");
  EXPECT_TRUE(dst2.grad_fn()->next_edges().empty() || !dst2.grad_fn()->next_edges()[0].valid());
}

TEST_P(CopyGradTest, CopyErrors) {
  Tensor leaf = zeros({2}, opts()).requires_grad_();
  Tensor src = ones({2}, opts());
  expect_error([&] { leaf.copy_(src); }, {"copy_", "leaf that requires grad", "NoGradGuard"});
  // Under NoGradGuard the same copy is allowed (how optimizers and initialisers write parameters).
  {
    NoGradGuard no_grad;
    leaf.copy_(src);
  }
  expect_values(leaf, {2}, {1, 1});
  EXPECT_TRUE(leaf.is_leaf());

  Tensor buffer = zeros({2, 2}, opts());
  Tensor row = buffer.select(0, 0);
  Tensor grad_src = ones({2}, opts()).requires_grad_();
  expect_error([&] { row.copy_(grad_src); }, {"copy_", "view"});
}

KILN_INSTANTIATE_BACKENDS(CopyGradTest);

}  // namespace
}  // namespace kiln::testing
