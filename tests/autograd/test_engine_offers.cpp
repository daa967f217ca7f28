// The engine's offered gradient sums (Node::offered_buffers): a node that can add its input's gradient into the sum
// other nodes began for that input (as a convolution's backward-data pass does at a residual block's input) runs
// after those other contributors, whichever order the forward pass created the branches in. Values are
// hand-derived. A custom autograd::Function takes part through kAddsIntoGradientSums and Context::gradient_sum.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/autograd/function.h"  // autograd::Function, kAddsIntoGradientSums
#include "kiln/autograd/node.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

// y = 3 x, whose backward adds 3 dy into the offered sum for x where there is one (and returns that sum, as
// node.h describes), and records whether it was offered one.
struct TripleBackward final : autograd::Node {
  bool* offered = nullptr;
  std::string_view name() const override { return "TripleBackward"; }
  bool accepts_gradient_buffers() const override { return true; }
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    Tensor g = internal::mul(grads[0], 3.0);
    Tensor sum = offered_buffers().empty() ? Tensor() : offered_buffers()[0];
    *offered = sum.defined();
    if (!sum.defined()) return {g};
    internal::add_(sum, g);
    return {sum};
  }
};

Tensor triple(const Tensor& x, bool* offered) {
  Tensor y = internal::mul(x, 3.0);
  auto node = autograd::make_node<TripleBackward>(x);
  node->offered = offered;
  autograd::set_history(y, node);
  return y;
}

class EngineOfferTest : public BackendTest {};

// x feeds the triple and a plain branch (x * 2, then + 1: two nodes); the triple is offered the plain branch's
// gradient for x with the triple created first and with it created last, with x a leaf and with x the result of
// another op.
TEST_P(EngineOfferTest, TheAccumulatingNodeRunsAfterTheOtherBranchInBothOrders) {
  const Tensor gy = make({1, 10, 100}, {3}, opts()), gz = make({5, 6, 7}, {3}, opts());
  const std::vector<double> want_x = {3 * 1 + 2 * 5, 3 * 10 + 2 * 6, 3 * 100 + 2 * 7};
  for (bool leaf : {true, false}) {
    for (bool triple_first : {true, false}) {
      SCOPED_TRACE(std::string(leaf ? "x a leaf" : "x a result") + (triple_first ? ", triple first" : ", triple last"));
      Tensor w = make({0.5, 1, 2}, {3}, opts()).requires_grad_();
      const Tensor x = leaf ? w : w * 1.5;
      bool offered = false;
      Tensor y, z;
      if (triple_first) {
        y = triple(x, &offered);
        z = x * 2.0 + 1.0;
      } else {
        z = x * 2.0 + 1.0;
        y = triple(x, &offered);
      }
      autograd::backward({y, z}, {gy, gz});
      EXPECT_TRUE(offered) << "the triple ran before the plain branch's gradient for x had arrived";
      std::vector<double> want = want_x;
      if (!leaf)
        for (double& v : want) v *= 1.5;
      expect_values(w.grad(), {3}, want);
    }
  }
}

// Two accumulating nodes on one input and nothing else: neither waits for the other forever; the second to run is
// offered the first's gradient.
TEST_P(EngineOfferTest, TwoAccumulatingNodesOnOneInputBothRun) {
  Tensor x = make({1, 2}, {2}, opts()).requires_grad_();
  bool offered_a = false, offered_b = false;
  const Tensor a = triple(x, &offered_a), b = triple(x, &offered_b);
  autograd::backward({a, b}, {make({1, 1}, {2}, opts()), make({10, 10}, {2}, opts())});
  EXPECT_NE(offered_a, offered_b);
  expect_values(x.grad(), {2}, {33, 33});
}

// y = 3 x whose backward adds 3 g into the gradient sum the engine offers for x (kAddsIntoGradientSums), counting the
// calls that found one; Plain is the same function without the declaration.
struct TripleAddingIn : autograd::Function<TripleAddingIn> {
  static constexpr bool kAddsIntoGradientSums = true;
  static inline int added_in = 0, ran = 0;
  static Tensor forward(autograd::Context&, const Tensor& x) { return x * 3.0; }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& g) {
    ++ran;
    const Tensor& sum = ctx.gradient_sum(0);
    if (!sum.defined()) return {g[0] * 3.0};
    ++added_in;
    Tensor into = sum;
    into.add_(g[0] * 3.0);
    return {sum};
  }
};
struct TriplePlain : autograd::Function<TriplePlain> {
  static Tensor forward(autograd::Context&, const Tensor& x) { return x * 3.0; }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& g) {
    EXPECT_FALSE(ctx.gradient_sum(0).defined());
    return {g[0] * 3.0};
  }
};

// h = 2 r feeds sin and a function that adds into gradient sums: that function runs after sin's backward, finds
// sin's gradient of h begun and adds its own into it; r's gradient is 2 (cos(h) w + 3 v) as without it. With h used
// by the function alone, or by a function without the declaration, nothing is offered.
TEST_P(EngineOfferTest, AFunctionAddsItsGradientIntoTheSumOthersBegan) {
  const std::vector<double> rv = {0.5, -1, 2}, wv = {1, 2, -1}, vv = {0.25, -0.5, 1};
  std::vector<double> want;
  for (size_t i = 0; i < rv.size(); ++i) want.push_back(2 * (std::cos(2 * rv[i]) * wv[i] + 3 * vv[i]));
  const Tensor w = make(wv, {3}, opts()), v = make(vv, {3}, opts());
  for (const bool function_first : {true, false}) {
    SCOPED_TRACE(function_first ? "the function used first" : "sin used first");
    TripleAddingIn::added_in = TripleAddingIn::ran = 0;
    Tensor r = make(rv, {3}, opts()).requires_grad_();
    const Tensor h = r * 2.0;
    Tensor loss = function_first ? (TripleAddingIn::apply(h) * v).sum() + (h.sin() * w).sum()
                                 : (h.sin() * w).sum() + (TripleAddingIn::apply(h) * v).sum();
    loss.backward();
    expect_values(r.grad(), {3}, want, 1e-5);
    EXPECT_EQ(TripleAddingIn::ran, 1);
    EXPECT_EQ(TripleAddingIn::added_in, 1);
  }
  TripleAddingIn::added_in = 0;
  Tensor r = make(rv, {3}, opts()).requires_grad_();
  (TripleAddingIn::apply(r * 2.0) * v).sum().backward();
  EXPECT_EQ(TripleAddingIn::added_in, 0);
  expect_values(r.grad(), {3}, {6 * vv[0], 6 * vv[1], 6 * vv[2]});
  Tensor r2 = make(rv, {3}, opts()).requires_grad_();
  const Tensor h2 = r2 * 2.0;
  ((TriplePlain::apply(h2) * v).sum() + (h2.sin() * w).sum()).backward();
  expect_values(r2.grad(), {3}, want, 1e-5);
}

KILN_INSTANTIATE_BACKENDS(EngineOfferTest);

}  // namespace
}  // namespace kiln::testing
