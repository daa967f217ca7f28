// The engine: leaves and results, accumulation, retain_graph, version counters, hooks, grad mode,
// autograd::grad, and errors. Values are hand-derived.
#include <gtest/gtest.h>

#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class EngineTest : public BackendTest {};

TEST_P(EngineTest, LeafAndResultState) {
  Tensor a = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor b = make({4, 5, 6}, {3}, opts());
  EXPECT_TRUE(a.requires_grad());
  EXPECT_TRUE(a.is_leaf());
  EXPECT_FALSE(b.requires_grad());
  Tensor c = a * b;
  EXPECT_TRUE(c.requires_grad());
  EXPECT_FALSE(c.is_leaf());
  ASSERT_NE(c.grad_fn(), nullptr);
  EXPECT_EQ(c.grad_fn()->name(), "MulBackward");
  Tensor d = b * 2;
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.grad_fn(), nullptr);
  Tensor e = c.detach();
  EXPECT_FALSE(e.requires_grad());
  EXPECT_TRUE(e.is_alias_of(c));
}

// y = sum(a * b + a): dy/da = b + 1, dy/db = a.
TEST_P(EngineTest, BackwardAccumulatesWhereATensorFeedsSeveralOps) {
  Tensor a = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor b = make({4, 5, 6}, {3}, opts()).requires_grad_();
  Tensor y = (a * b + a).sum();
  y.backward();
  expect_values(a.grad(), {3}, {5, 6, 7});
  expect_values(b.grad(), {3}, {1, 2, 3});
  // A second graph accumulates into the same grad().
  (a * 2).sum().backward();
  expect_values(a.grad(), {3}, {7, 8, 9});
}

TEST_P(EngineTest, BroadcastGradientsAreSummedToTheInputShape) {
  Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts()).requires_grad_();
  Tensor b = make({10, 20, 30}, {3}, opts()).requires_grad_();
  Tensor s = make({2}, {}, opts()).requires_grad_();
  ((a * b) / s).sum().backward();
  expect_values(a.grad(), {2, 3}, {5, 10, 15, 5, 10, 15});
  expect_values(b.grad(), {3}, {2.5, 3.5, 4.5});
  // d/ds sum(a*b/s) = -sum(a*b)/s^2 = -(10+40+90+40+100+180)/4
  expect_values(s.grad(), {}, {-115});
}

TEST_P(EngineTest, NonScalarBackwardNeedsAGradient) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor y = a * 3;
  expect_error([&] { y.backward(); }, {"backward", "shape [2]", "one-element"});
  y.backward(make({1, 10}, {2}, opts()));
  expect_values(a.grad(), {2}, {3, 30});
}

TEST_P(EngineTest, BackwardOnATensorWithoutHistoryIsAnError) {
  Tensor a = make({1, 2}, {2}, opts());
  expect_error([&] { (a * 2).sum().backward(); }, {"does not require grad", "requires_grad_()"});
}

TEST_P(EngineTest, RetainGraphAllowsASecondBackwardAndFreedGraphsAreAnError) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor y = (a * a).sum();
  y.backward({}, /*retain_graph=*/true);
  y.backward();
  expect_values(a.grad(), {2}, {4, 8});
  expect_error([&] { y.backward(); }, {"MulBackward", "second time", "retain_graph=true"});
}

TEST_P(EngineTest, InPlaceChangeOfASavedTensorIsReportedAtBackward) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor b = make({3, 4}, {2}, opts());
  Tensor y = (a * b).sum();  // MulBackward saved b
  const uint64_t saved_version = b.version();
  b.add_(1.0);
  EXPECT_EQ(b.version(), saved_version + 1);
  expect_error([&] { y.backward(); },
               {"MulBackward", "modified in place", "version is " + std::to_string(saved_version + 1),
                "it was " + std::to_string(saved_version)});
}

TEST_P(EngineTest, NoGradGuardStopsRecordingPerThread) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(GradMode::is_enabled());
    Tensor y = a * 2;
    EXPECT_FALSE(y.requires_grad());
    {
      EnableGradGuard on;
      EXPECT_TRUE((a * 2).requires_grad());
    }
    bool other_thread_enabled = false;
    std::thread t([&] { other_thread_enabled = GradMode::is_enabled(); });
    t.join();
    EXPECT_TRUE(other_thread_enabled);
  }
  EXPECT_TRUE(GradMode::is_enabled());
  EXPECT_TRUE((a * 2).requires_grad());
}

TEST_P(EngineTest, GradReturnsGradientsWithoutTouchingGradFields) {
  Tensor x = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor w = make({2, 2, 2}, {3}, opts()).requires_grad_();
  Tensor h = x * w;
  Tensor y = (h * h).sum();
  TensorList g = autograd::grad({y}, {x, h});
  expect_values(g[0], {3}, {8, 16, 24});  // 2 h w = 2 x w^2
  expect_values(g[1], {3}, {4, 8, 12});   // 2 h
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  Tensor unused = make({1}, {1}, opts()).requires_grad_();
  Tensor y2 = (x * x).sum();
  expect_error([&] { autograd::grad({y2}, {unused}, {}, true); }, {"not used", "allow_unused"});
  TensorList g2 = autograd::grad({y2}, {unused}, {}, false, /*allow_unused=*/true);
  EXPECT_FALSE(g2[0].defined());
}

TEST_P(EngineTest, TensorHooksCanReplaceGradients) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor h = a * 3;
  std::vector<double> seen;
  h.register_hook([&](const Tensor& g) {
    seen = values(g);
    return g * 10;
  });
  uint64_t leaf_hook = a.register_hook([](const Tensor& g) { return g + 1; });
  h.sum().backward();
  EXPECT_EQ(seen, (std::vector<double>{1, 1}));
  expect_values(a.grad(), {2}, {31, 31});  // (1 * 10) * 3, then + 1 at the leaf
  a.remove_hook(leaf_hook);
  a.mutable_grad() = Tensor();
  (a * 3).sum().backward();
  expect_values(a.grad(), {2}, {3, 3});
}

TEST_P(EngineTest, PostAccumulateHooksSeeTheAccumulatedGradient) {
  Tensor w = make({1, 2}, {2}, opts()).requires_grad_();
  std::vector<std::vector<double>> calls;
  w.register_post_accumulate_grad_hook([&](const Tensor& leaf) { calls.push_back(values(leaf.grad())); });
  (w * w).sum().backward();
  (w * 3).sum().backward();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0], (std::vector<double>{2, 4}));
  EXPECT_EQ(calls[1], (std::vector<double>{5, 7}));
  Tensor h = w * 2;
  expect_error([&] { h.register_post_accumulate_grad_hook([](const Tensor&) {}); }, {"only leaves"});
}

// A leaf's gradient that arrives as a view whose base is gone (a reshape of the sums a node wrote, as a bias's is)
// becomes .grad without a copy: .grad holds the very memory the node wrote, as a tensor of its own (not a view), so
// in-place updates of it are allowed.
TEST_P(EngineTest, ALeafKeepsAViewGradientWhoseBaseIsGone) {
  Tensor b = make({1, 1, 1, 1}, {4}, opts()).requires_grad_();
  Tensor row = b.reshape({1, 4});
  const void* written = nullptr;
  row.register_hook([&](const Tensor& g) {
    written = g.data_ptr();
    return Tensor();
  });
  (row * make({1, 2, 3, 4}, {1, 4}, opts())).sum().backward();
  ASSERT_NE(written, nullptr);
  EXPECT_EQ(b.grad().data_ptr(), written);
  EXPECT_FALSE(b.grad().impl().is_view());
  expect_values(b.grad(), {4}, {1, 2, 3, 4});
  b.mutable_grad().mul_(2);
  expect_values(b.grad(), {4}, {2, 4, 6, 8});
}

// Gradients that are views of one tensor (the pieces of a concatenation's gradient) each get memory of their own:
// an in-place change of one leaf's .grad leaves the other's alone.
TEST_P(EngineTest, LeavesSharingAGradientsMemoryGetCopies) {
  Tensor a = make({1, 1}, {2}, opts()).requires_grad_();
  Tensor b = make({1, 1}, {2}, opts()).requires_grad_();
  (cat({a, b}, 0) * make({1, 2, 3, 4}, {4}, opts())).sum().backward();
  expect_values(a.grad(), {2}, {1, 2});
  expect_values(b.grad(), {2}, {3, 4});
  a.mutable_grad().zero_();
  expect_values(b.grad(), {2}, {3, 4});
}

TEST_P(EngineTest, RetainGradKeepsNonLeafGradients) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor h = a * 3;
  h.retain_grad();
  (h * h).sum().backward();
  expect_values(h.grad(), {2}, {6, 12});
  expect_values(a.grad(), {2}, {18, 36});
}

TEST_P(EngineTest, InPlaceOnALeafThatRequiresGradIsAnError) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  expect_error([&] { a.add_(1.0); }, {"add_", "leaf that requires grad", "NoGradGuard"});
  {
    NoGradGuard no_grad;
    a.add_(1.0);  // as optimizers do
  }
  expect_values(a, {2}, {2, 3});
}

TEST_P(EngineTest, GradientOfAGradientIsKeptSeparate) {
  // Two leaves receive the same incoming gradient tensor (add passes it through); an in-place update of
  // one grad must not change the other.
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor b = make({3, 4}, {2}, opts()).requires_grad_();
  (a + b).backward(make({1, 1}, {2}, opts()));
  {
    NoGradGuard no_grad;
    a.mutable_grad().mul_(5.0);
  }
  expect_values(a.grad(), {2}, {5, 5});
  expect_values(b.grad(), {2}, {1, 1});
}

// A custom function: forward y = x^3 (saved x), backward 3 x^2 g.
struct Cube : autograd::Function<Cube> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, double scale) {
    ctx.save_for_backward({x});
    ctx.set("scale", scale);
    EXPECT_FALSE(GradMode::is_enabled());
    return x * x * x * scale;
  }
  static TensorList backward(autograd::Context& ctx, const TensorList& g) {
    Tensor x = ctx.saved()[0];
    return {g[0] * x * x * (3 * ctx.get<double>("scale"))};
  }
};

TEST_P(EngineTest, CustomFunctions) {
  Tensor x = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor y = Cube::apply(x, 2.0);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_NE(y.grad_fn()->name().find("Cube"), std::string_view::npos);
  y.sum().backward();
  expect_values(x.grad(), {2}, {6, 24});
  if (dev().is_cpu()) {
    check_gradients([](const TensorList& in) { return TensorList{Cube::apply(in[0], 1.5)}; }, {make_input({3})});
  }
}

KILN_INSTANTIATE_BACKENDS(EngineTest);

}  // namespace
}  // namespace kiln::testing
