// How long graph nodes live: a graph that is dropped without backward frees every node (no node owns the output
// that owns it), and autograd::grad keeps the nodes it captures at alive while it runs. Memory errors here show
// up under the sanitizers (scripts/sanitize.sh) too; these tests see them without one.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autograd/autograd_meta.h"  // get_meta: the leaf's weak reference to its accumulator
#include "kiln/autograd/node.h"           // Node
#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class GraphLifetimeTest : public BackendTest {};

struct OutputOp {
  std::string name;
  std::function<Tensor(const Tensor&)> fn;
};

// Every op whose backward node keeps its own forward output.
std::vector<OutputOp> ops_that_save_their_output() {
  return {
      {"softmax", [](const Tensor& a) { return softmax(a, 1); }},
      {"log_softmax", [](const Tensor& a) { return log_softmax(a, 1); }},
      {"amax", [](const Tensor& a) { return amax(a, {1}); }},
      {"max", [](const Tensor& a) { return max(a); }},
      {"min", [](const Tensor& a) { return min(a); }},
      {"std", [](const Tensor& a) { return std(a, {1}); }},
      {"norm2", [](const Tensor& a) { return norm(a, 2, {1}); }},
      {"norm3", [](const Tensor& a) { return norm(a, 3, {1}); }},
      {"norm_inf", [](const Tensor& a) { return norm(a, INFINITY, {1}); }},
      {"logsumexp", [](const Tensor& a) { return logsumexp(a, {1}); }},
      {"exp", [](const Tensor& a) { return exp(a); }},
      {"sqrt", [](const Tensor& a) { return sqrt(a); }},
      {"pow_scalar_base", [](const Tensor& a) { return pow(2.0, a); }},
      {"pow", [](const Tensor& a) { return pow(a, a); }},
  };
}

Tensor input(const TensorOptions& o) { return make({0.5, 1.5, 2.0, 0.25, 3.0, 1.0}, {2, 3}, o).requires_grad_(); }

// A forward under grad mode whose result is dropped without backward frees the graph.
TEST_P(GraphLifetimeTest, GraphDroppedWithoutBackwardIsFreed) {
  for (const OutputOp& op : ops_that_save_their_output()) {
    Tensor a = input(opts());
    std::weak_ptr<autograd::Node> node;
    {
      Tensor out = op.fn(a);
      ASSERT_NE(out.grad_fn(), nullptr) << op.name;
      node = out.grad_fn();
    }
    EXPECT_TRUE(node.expired()) << op.name << ": its backward node outlives the dropped graph";
  }
}

// The same after a backward that kept the graph (retain_graph), and after a backward that failed half-way.
TEST_P(GraphLifetimeTest, GraphKeptByRetainGraphOrAFailedBackwardIsFreed) {
  for (const OutputOp& op : ops_that_save_their_output()) {
    Tensor a = input(opts());
    std::weak_ptr<autograd::Node> node;
    {
      Tensor out = op.fn(a);
      node = out.grad_fn();
      out.sum().backward({}, /*retain_graph=*/true);
    }
    EXPECT_TRUE(node.expired()) << op.name << " after backward(retain_graph=true)";
    a.mutable_grad() = Tensor();

    {
      Tensor out = op.fn(a);
      node = out.grad_fn();
      Tensor y = out * 2;
      y.register_hook([](const Tensor&) -> Tensor { throw Error("a hook that fails"); });
      EXPECT_THROW(y.sum().backward(), Error) << op.name;
    }
    EXPECT_TRUE(node.expired()) << op.name << " after a backward that threw";
  }
}

// autograd::grad for a leaf that is not in the graph yet makes the leaf's accumulator, which the leaf holds only
// weakly: grad keeps it alive until it has run (it used to be freed before backward read it).
TEST_P(GraphLifetimeTest, GradKeepsTheCapturedAccumulatorAlive) {
  Tensor x = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor unused = make({4}, {1}, opts()).requires_grad_();
  Tensor h = x * x;
  int hook_runs = 0;
  bool accumulator_alive = false;
  h.register_hook([&](const Tensor&) {
    ++hook_runs;
    const autograd::AutogradMeta* m = autograd::get_meta(unused);
    accumulator_alive = m != nullptr && !m->grad_accumulator.expired();
    return Tensor();
  });
  TensorList g = autograd::grad({h.sum()}, {unused, x}, {}, /*retain_graph=*/true, /*allow_unused=*/true);
  EXPECT_EQ(hook_runs, 1);
  EXPECT_TRUE(accumulator_alive);
  EXPECT_FALSE(g[0].defined());
  expect_values(g[1], {3}, {2, 4, 6});  // 2 x
  expect_error([&] { autograd::grad({h.sum()}, {x, unused}); }, {"input 1", "not used", "allow_unused"});
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(unused.grad().defined());
}

// Many unused leaves captured at once, mixed with used ones: each gets its own answer.
TEST_P(GraphLifetimeTest, GradWithManyUnusedLeavesAnswersEachInput) {
  std::vector<Tensor> leaves;
  for (int i = 0; i < 16; ++i) leaves.push_back(make({double(i + 1)}, {1}, opts()).requires_grad_());
  Tensor y = leaves[3] * leaves[3] + leaves[11] * 5;  // dy/d3 = 2 * 4 = 8, dy/d11 = 5
  TensorList g = autograd::grad({y.sum()}, leaves, {}, /*retain_graph=*/true, /*allow_unused=*/true);
  ASSERT_EQ(g.size(), leaves.size());
  for (size_t i = 0; i < g.size(); ++i) {
    if (i == 3) expect_values(g[i], {1}, {8});
    else if (i == 11) expect_values(g[i], {1}, {5});
    else EXPECT_FALSE(g[i].defined()) << "input " << i;
  }
  expect_error([&] { autograd::grad({y.sum()}, leaves); }, {"input 0", "not used"});
}

KILN_INSTANTIATE_BACKENDS(GraphLifetimeTest);

}  // namespace
}  // namespace kiln::testing
