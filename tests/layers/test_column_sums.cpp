// autograd::offer_column_sums / take_column_sums: a gradient's column sums handed from the backward that wrote the
// gradient to the Linear before it, for its bias. The matching rules on their own, then through the graph: a node
// that offers marked sums (so that their use shows) before nn::linear (its one-node autocast path and its composed
// addmm), and before nn::linear_gelu_linear's second bias; and a gradient that gets a second contribution, which
// the offer must not reach.
#include <gtest/gtest.h>

#include <vector>

#include "kiln/autograd/autocast.h"
#include "kiln/autograd/column_sums.h"
#include "kiln/autograd/function.h"
#include "kiln/layers/functional.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class ColumnSumsTest : public BackendTest {};

TEST_P(ColumnSumsTest, AnOfferIsTakenOnceByItsGradientOrAReshapeOfIt) {
  const Tensor g = make(uniform(24, -1, 1, 1), {2, 3, 4}, opts());
  const Tensor sums = make({1, 2, 3, 4}, {4}, opts());
  autograd::offer_column_sums(g, sums);
  EXPECT_FALSE(autograd::take_column_sums(g.reshape({3, 8})).defined()) << "other columns";
  EXPECT_FALSE(autograd::take_column_sums(g.narrow(0, 0, 1)).defined()) << "part of it";
  EXPECT_FALSE(autograd::take_column_sums(g.clone()).defined()) << "a copy";
  const Tensor taken = autograd::take_column_sums(g.reshape({6, 4}));
  ASSERT_TRUE(taken.defined());
  expect_values(taken, {4}, {1, 2, 3, 4}, 0, 0);
  EXPECT_FALSE(autograd::take_column_sums(g).defined()) << "taken once";
}

TEST_P(ColumnSumsTest, AChangedOrTransposedGradientTakesNothing) {
  Tensor g = make(uniform(16, -1, 1, 2), {4, 4}, opts());
  autograd::offer_column_sums(g, zeros({4}, opts()));
  EXPECT_FALSE(autograd::take_column_sums(g.t()).defined()) << "transposed: the same memory, other columns";
  g.add_(1.0);
  EXPECT_FALSE(autograd::take_column_sums(g).defined()) << "changed in place since the offer";
  // Offers of another shape, dtype or device than the gradient's columns are not made.
  const Tensor h = make(uniform(16, -1, 1, 3), {4, 4}, opts());
  autograd::offer_column_sums(h, zeros({3}, opts()));
  autograd::offer_column_sums(h, zeros({4}, opts(DType::Float64)));
  EXPECT_FALSE(autograd::take_column_sums(h).defined());
}

TEST_P(ColumnSumsTest, OffersKeepNothingAliveAndTheOldestGoFirst) {
  {
    Tensor g = make(uniform(8, -1, 1, 4), {2, 4}, opts());
    autograd::offer_column_sums(g, zeros({4}, opts()));
  }  // g freed: its offer cannot match what comes next at its address
  const Tensor fresh = make(uniform(8, -1, 1, 5), {2, 4}, opts());
  EXPECT_FALSE(autograd::take_column_sums(fresh).defined());
  std::vector<Tensor> gs;
  for (int i = 0; i < 9; ++i) {
    gs.push_back(make(uniform(8, -1, 1, 10 + i), {2, 4}, opts()));
    autograd::offer_column_sums(gs.back(), full({4}, i, opts()));
  }
  EXPECT_FALSE(autograd::take_column_sums(gs[0]).defined()) << "the oldest of 9 dropped";
  for (int i = 1; i < 9; ++i) {
    const Tensor t = autograd::take_column_sums(gs[i]);
    ASSERT_TRUE(t.defined()) << i;
    expect_values(t, {4}, std::vector<double>(4, i), 0, 0);
  }
}

// y = x, whose backward passes g on and offers `marks` as g's column sums: what a layer norm's backward offers, but
// marked, so that a bias gradient equal to the marks shows that the Linear took the offer.
struct OfferingIdentity : autograd::Function<OfferingIdentity> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, const Tensor& marks) {
    ctx.set("marks", marks);
    return x.clone();
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const Tensor g = grads[0].contiguous();
    autograd::offer_column_sums(g, ctx.get<Tensor>("marks"));
    return {g, Tensor()};
  }
};

TEST_P(ColumnSumsTest, TheLinearBeforeTakesTheOfferForItsBias) {
  const int64_t rows = 6, in = 8, out = 4;
  const Tensor marks = make({100, 200, 300, 400}, {out}, opts());
  const Tensor gy = make(uniform(rows * out, -1, 1, 21), {2, 3, out}, opts());
  for (const bool autocast_on : {true, false}) {
    SCOPED_TRACE(autocast_on ? "autocast: the one-node Linear" : "float32: addmm");
    Tensor x = make(uniform(rows * in, -1, 1, 20), {2, 3, in}, opts()).requires_grad_();
    Tensor w = make(uniform(out * in, -1, 1, 22), {out, in}, opts()).requires_grad_();
    Tensor b = make(uniform(out, -1, 1, 23), {out}, opts()).requires_grad_();
    Tensor y;
    {
      std::optional<autocast::Guard> on;
      if (autocast_on) on.emplace(dev().type(), DType::BFloat16);
      const Tensor h = x * 1.0;  // a float32 activation with a node, as a layer norm's output
      y = OfferingIdentity::apply(nn::linear(h, w, b), marks);
    }
    y.backward(gy.to(y.dtype()));
    ASSERT_TRUE(b.grad().defined());
    expect_values(b.grad(), {out}, {100, 200, 300, 400}, 0, 0);
    ASSERT_TRUE(w.grad().defined());
  }
  {  // the MLP's second bias
    SCOPED_TRACE("linear_gelu_linear");
    Tensor x = make(uniform(rows * in, -1, 1, 30), {2, 3, in}, opts()).requires_grad_();
    Tensor w1 = make(uniform(16 * in, -1, 1, 31), {16, in}, opts()).requires_grad_();
    Tensor b1 = make(uniform(16, -1, 1, 32), {16}, opts()).requires_grad_();
    Tensor w2 = make(uniform(out * 16, -1, 1, 33), {out, 16}, opts()).requires_grad_();
    Tensor b2 = make(uniform(out, -1, 1, 34), {out}, opts()).requires_grad_();
    const Tensor y = OfferingIdentity::apply(nn::linear_gelu_linear(x * 1.0, w1, b1, w2, b2), marks);
    y.backward(gy);
    expect_values(b2.grad(), {out}, {100, 200, 300, 400}, 0, 0);
    ASSERT_TRUE(b1.grad().defined());
  }
}

// The Linear's output also feeds a second use, so its gradient is the sum of two: the offer made for one of them does
// not reach the Linear, whose bias gradient is the sum's columns.
TEST_P(ColumnSumsTest, AGradientWithASecondContributionIgnoresTheOffer) {
  const int64_t rows = 6, in = 8, out = 4;
  Tensor x = make(uniform(rows * in, -1, 1, 40), {rows, in}, opts()).requires_grad_();
  Tensor w = make(uniform(out * in, -1, 1, 41), {out, in}, opts()).requires_grad_();
  Tensor b = make(uniform(out, -1, 1, 42), {out}, opts()).requires_grad_();
  const Tensor gy = make(uniform(rows * out, -1, 1, 43), {rows, out}, opts());
  const Tensor y = nn::linear(x, w, b);
  const Tensor z = OfferingIdentity::apply(y, zeros({out}, opts())) + y * 2.0;
  z.backward(gy);
  const std::vector<double> g = values(gy);
  std::vector<double> want(out, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t o = 0; o < out; ++o) want[o] += 3.0 * g[i * out + o];
  }
  expect_values(b.grad(), {out}, want, 1e-6, 1e-6);
}

KILN_INSTANTIATE_BACKENDS(ColumnSumsTest);

}  // namespace
}  // namespace kiln::testing
