// Gradients through in-place ops: a chain of in-place ops on a non-leaf against hand-derived values and
// the out-of-place chain, gradcheck of every in-place op, the errors (a leaf that requires grad, a view
// while recording, a saved tensor modified before backward), and in-place ops under NoGradGuard.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class InplaceGradTest : public BackendTest {};

// y = x * 2; y += b; y *= c; loss = sum(y) = sum((2x + b) c):
// d/dx = 2c, d/db = c, d/dc = 2x + b.
TEST_P(InplaceGradTest, ChainOnANonLeafMatchesHandDerivedValuesAndTheOutOfPlaceChain) {
  Tensor x = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor b = make({10, 20, 30}, {3}, opts()).requires_grad_();
  Tensor c = make({-1, 0.5, 2}, {3}, opts()).requires_grad_();
  Tensor y = x * 2;
  y.add_(b);
  EXPECT_EQ(y.grad_fn()->name(), "AddBackward");
  y.mul_(c);
  EXPECT_EQ(y.grad_fn()->name(), "MulBackward");
  EXPECT_FALSE(y.is_leaf());
  expect_values(y, {3}, {-12, 12, 72});
  y.sum().backward();
  expect_values(x.grad(), {3}, {-2, 1, 4});
  expect_values(b.grad(), {3}, {-1, 0.5, 2});
  expect_values(c.grad(), {3}, {12, 24, 36});

  Tensor x2 = x.detach().requires_grad_(), b2 = b.detach().requires_grad_(), c2 = c.detach().requires_grad_();
  ((x2 * 2 + b2) * c2).sum().backward();
  expect_values(x.grad(), {3}, values(x2.grad()));
  expect_values(b.grad(), {3}, values(b2.grad()));
  expect_values(c.grad(), {3}, values(c2.grad()));
}

// The operators go through the same recording.
TEST_P(InplaceGradTest, CompoundAssignmentOperatorsRecord) {
  Tensor x = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor d = make({4, 8}, {2}, opts()).requires_grad_();
  Tensor y = x * 1.0;
  y += x;  // 2x
  y -= 1;  // 2x - 1
  y *= 3;  // 6x - 3
  y /= d;  // (6x - 3) / d
  y.sum().backward();
  expect_values(x.grad(), {2}, {1.5, 0.75});             // 6 / d
  expect_values(d.grad(), {2}, {-3.0 / 16, -9.0 / 64});  // -(6x - 3) / d^2
}

// a.mul_(a): the factor saved for backward must be a's old value, not the overwritten one: d/dx (x^2) = 2x.
TEST_P(InplaceGradTest, MultiplyingByItself) {
  Tensor x = make({1.5, -2}, {2}, opts()).requires_grad_();
  Tensor y = x * 1.0;
  y.mul_(y);
  y.sum().backward();
  expect_values(x.grad(), {2}, {3, -4});
  Tensor z = make({2, 4}, {2}, opts()).requires_grad_();
  Tensor w = z * 1.0;
  w.div_(w);  // 1: zero gradient
  w.sum().backward();
  expect_values(z.grad(), {2}, {0, 0});
}

// A tensor that does not require grad becomes part of the graph when an operand does.
TEST_P(InplaceGradTest, OtherOperandRequiringGradMakesTheResultRecord) {
  Tensor acc = make({0, 0}, {2}, opts());
  Tensor b = make({1, 2}, {2}, opts()).requires_grad_();
  acc.add_(b, 3);
  EXPECT_TRUE(acc.requires_grad());
  EXPECT_EQ(acc.grad_fn()->name(), "AddBackward");
  acc.mul_(b);
  acc.sum().backward();  // acc = 3 b^2
  expect_values(b.grad(), {2}, {6, 12});
}

// fill_, uniform_, normal_: the old values get no gradient; the new tensor still takes part.
TEST_P(InplaceGradTest, OverwritingOpsCutTheOldHistory) {
  Tensor x = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor y = x * 2;
  kiln::uniform_(y, 1, 2);
  EXPECT_EQ(y.grad_fn()->name(), "UniformBackward");
  for (double v : values(y)) EXPECT_TRUE(v >= 1 && v < 2);
  (y * x).sum().backward();
  expect_values(x.grad(), {3}, values(y));  // only through the product, not through the old 2x

  Tensor u = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor f = u * 3;
  f.fill_(5);
  EXPECT_EQ(f.grad_fn()->name(), "FillBackward");
  expect_values(f, {2}, {5, 5});
  Tensor n = u * 3;
  kiln::normal_(n);
  EXPECT_EQ(n.grad_fn()->name(), "NormalBackward");
  (f + n + u).sum().backward();
  expect_values(u.grad(), {2}, {1, 1});
}

TEST_P(InplaceGradTest, UnaryInPlaceOps) {
  Tensor x = make({-1, 0, 4}, {3}, opts()).requires_grad_();
  Tensor y = x * 1.0;
  y.relu_();
  EXPECT_EQ(y.grad_fn()->name(), "ReluBackward");
  (y * y).sum().backward();  // 2 relu(x) relu'(x)
  expect_values(x.grad(), {3}, {0, 0, 8});

  Tensor p = make({0.25, 4}, {2}, opts()).requires_grad_();
  Tensor r = p * 1.0;
  r.sqrt_();
  EXPECT_EQ(r.grad_fn()->name(), "SqrtBackward");
  r.sum().backward();
  expect_values(p.grad(), {2}, {1, 0.25});

  Tensor z = make({0, 1}, {2}, opts()).requires_grad_();
  Tensor e = z * 1.0;
  e.neg_();
  EXPECT_EQ(e.grad_fn()->name(), "NegBackward");
  e.exp_();  // exp(-z)
  EXPECT_EQ(e.grad_fn()->name(), "ExpBackward");
  e.sum().backward();
  expect_values(z.grad(), {2}, {-1, -std::exp(-1.0)});
}

TEST_P(InplaceGradTest, ClampAndMaskedFillInPlace) {
  Tensor x = make({-2, -1, 0, 1, 2}, {5}, opts()).requires_grad_();
  Tensor y = x * 1.0;
  y.clamp_(-1, 1);
  EXPECT_EQ(y.grad_fn()->name(), "ClampBackward");
  y.masked_fill_(make({0, 0, 1, 0, 0}, {5}, opts(DType::Bool)), 7);
  EXPECT_EQ(y.grad_fn()->name(), "MaskedFillBackward");
  expect_values(y, {5}, {-1, -1, 7, 1, 1});
  y.sum().backward();
  expect_values(x.grad(), {5}, {0, 1, 0, 1, 0});  // the clamp's mask uses x before the write
}

// ---------------------------------------------------------------- errors
TEST_P(InplaceGradTest, InPlaceOnALeafThatRequiresGradNamesTheOp) {
  Tensor a = make({1, 4}, {2}, opts()).requires_grad_();
  Tensor b = make({1, 2}, {2}, opts());
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"add_", [&] { a.add_(b); }},
      {"sub_", [&] { a.sub_(1); }},
      {"mul_", [&] { a.mul_(b); }},
      {"div_", [&] { a.div_(2); }},
      {"clamp_", [&] { a.clamp_(0, 1); }},
      {"relu_", [&] { a.relu_(); }},
      {"neg_", [&] { a.neg_(); }},
      {"exp_", [&] { a.exp_(); }},
      {"sqrt_", [&] { a.sqrt_(); }},
      {"masked_fill_",
       [&] {
         a.masked_fill_(make({1, 0}, {2}, opts(DType::Bool)), 0);
       }},
      {"fill_", [&] { a.fill_(0); }},
      {"uniform_", [&] { kiln::uniform_(a); }},
      {"normal_", [&] { kiln::normal_(a); }},
  };
  for (const auto& [op, fn] : cases) {
    SCOPED_TRACE(op);
    expect_error(fn, {op, "leaf that requires grad"});
  }
  expect_values(a, {2}, {1, 4});  // nothing was written
}

TEST_P(InplaceGradTest, InPlaceOnAViewWhileRecordingIsAnError) {
  Tensor base = make({1, 2, 3, 4}, {2, 2}, opts());
  Tensor row = base.select(0, 1);
  ASSERT_TRUE(row.impl().is_view());
  Tensor b = make({1, 1}, {2}, opts()).requires_grad_();
  expect_error([&] { row.add_(b); }, {"add_", "view"});
  expect_error([&] { row.mul_(b); }, {"mul_", "view"});
  // Without recording (no operand requires grad, or under NoGradGuard) writing into a view is fine.
  row.add_(make({1, 1}, {2}, opts()));
  {
    NoGradGuard no_grad;
    row.add_(b);
  }
  expect_values(base, {2, 2}, {1, 2, 5, 6});
}

// y = exp(x) saves y; modifying y before backward is reported by ExpBackward.
TEST_P(InplaceGradTest, ModifyingASavedTensorIsReportedAtBackward) {
  Tensor x = make({0, 1}, {2}, opts()).requires_grad_();
  Tensor y = kiln::exp(x);
  y.add_(1);  // allowed (a non-leaf), but ExpBackward's saved result is now stale
  expect_error([&] { y.sum().backward(); }, {"ExpBackward", "modified in place"});

  Tensor h = x * 2;
  Tensor z = h * h;  // MulBackward saves h
  h.mul_(3);
  expect_error([&] { z.sum().backward(); }, {"MulBackward", "modified in place"});

  // relu_ saves its result: a second in-place op on the same tensor makes it stale.
  Tensor r = x * 1.0;
  r.relu_();
  r.mul_(2);
  expect_error([&] { r.sum().backward(); }, {"ReluBackward", "modified in place"});
}

// Optimizer-style updates: in-place ops on leaves that require grad are fine under NoGradGuard and
// record nothing.
TEST_P(InplaceGradTest, InPlaceOnLeavesUnderNoGradGuard) {
  Tensor w = make({1, -2, 3}, {3}, opts()).requires_grad_();
  Tensor g = make({1, 1, 1}, {3}, opts()).requires_grad_();
  {
    NoGradGuard no_grad;
    w.sub_(g, 0.5);   // 0.5, -2.5, 2.5
    w.mul_(2);        // 1, -5, 5
    w.clamp_(-4, 4);  // 1, -4, 4
    w.relu_();        // 1, 0, 4
    w.add_(1);        // 2, 1, 5
    w.div_(g);
    w.masked_fill_(make({0, 1, 0}, {3}, opts(DType::Bool)), 9);  // 2, 9, 5
  }
  EXPECT_TRUE(w.is_leaf());
  EXPECT_EQ(w.grad_fn(), nullptr);
  expect_values(w, {3}, {2, 9, 5});
  {
    NoGradGuard no_grad;
    w.fill_(0.5);
  }
  (w * 2).sum().backward();
  expect_values(w.grad(), {3}, {2, 2, 2});
}

KILN_INSTANTIATE_BACKENDS(InplaceGradTest);

// ---------------------------------------------------------------- gradcheck of every in-place op
// Each starts from a non-leaf copy of input 0 (x * 1), as in-place ops on leaves that require grad are errors.
using InplaceFn = std::function<void(Tensor&, const TensorList&)>;

void check_inplace(const InplaceFn& op, const TensorList& inputs) {
  check_gradients(
      [&op](const TensorList& in) {
        Tensor y = in[0] * 1.0;
        op(y, in);
        return TensorList{y};
      },
      inputs);
}

TEST(InplaceGradcheckTest, Arithmetic) {
  const TensorList ab = {make_input({3, 4}, -1, 1, 1), make_input({4}, 0.5, 2, 2)};  // b broadcasts
  check_inplace([](Tensor& y, const TensorList& in) { y.add_(in[1], 1.5); }, ab);
  check_inplace([](Tensor& y, const TensorList& in) { y.sub_(in[1], 0.5); }, ab);
  check_inplace([](Tensor& y, const TensorList& in) { y.mul_(in[1]); }, ab);
  check_inplace([](Tensor& y, const TensorList& in) { y.div_(in[1]); }, ab);
  // Only the other operand requires grad.
  const TensorList b_only = {make_input({3, 4}, -1, 1, 3).detach(), make_input({3, 4}, 0.5, 2, 4)};
  check_inplace([](Tensor& y, const TensorList& in) { y.mul_(in[1]); }, b_only);
  check_inplace([](Tensor& y, const TensorList& in) { y.div_(in[1]); }, b_only);
  const TensorList x = {make_input({2, 3}, 0.5, 2, 5)};
  check_inplace([](Tensor& y, const TensorList&) { y.add_(2); }, x);
  check_inplace([](Tensor& y, const TensorList&) { y.sub_(2); }, x);
  check_inplace([](Tensor& y, const TensorList&) { y.mul_(-3); }, x);
  check_inplace([](Tensor& y, const TensorList&) { y.div_(4); }, x);
}

TEST(InplaceGradcheckTest, UnaryAndMasks) {
  check_inplace([](Tensor& y, const TensorList&) { y.relu_(); }, {make_input({3, 4})});
  check_inplace([](Tensor& y, const TensorList&) { y.neg_(); }, {make_input({3, 4})});
  check_inplace([](Tensor& y, const TensorList&) { y.exp_(); }, {make_input({3, 4})});
  check_inplace([](Tensor& y, const TensorList&) { y.sqrt_(); }, {make_input({3, 4}, 0.5, 2)});
  check_inplace([](Tensor& y, const TensorList&) { y.clamp_(-0.5, 0.5); }, {make_input({3, 4})});
  check_inplace([](Tensor& y, const TensorList&) { y.clamp_(std::nullopt, 0.2); }, {make_input({3, 4})});
  check_inplace(
      [](Tensor& y, const TensorList&) {
        y.masked_fill_(make({1, 0, 0, 1}, {4}, {.dtype = DType::Bool, .device = y.device()}), 3);
      },
      {make_input({3, 4})});
  check_inplace([](Tensor& y, const TensorList&) { y.fill_(2); }, {make_input({3})});
  // Two in-place ops in a row on a strided non-leaf.
  check_inplace(
      [](Tensor& y, const TensorList& in) {
        y.mul_(in[1]);
        y.exp_();
      },
      {non_contiguous(make_input({2, 3}).detach()).requires_grad_(), make_input({3}, -1, 1, 9)});
}

}  // namespace
}  // namespace kiln::testing
