// The engine's offered gradient sums (Node::offered_buffers): a node that can add its input's gradient into the sum
// other nodes began for that input (as a convolution's backward-data pass does at a residual block's input) runs
// after those other contributors, whichever order the forward pass created the branches in. Values are
// hand-derived.
#include <gtest/gtest.h>

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

KILN_INSTANTIATE_BACKENDS(EngineOfferTest);

}  // namespace
}  // namespace kiln::testing
