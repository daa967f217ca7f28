// Gradients of the binary elementwise ops (add, sub, mul, div, remainder, maximum, minimum, where,
// masked_fill, lerp): gradcheck with broadcasting and strided operands, hand-derived values (ties of
// maximum/minimum split half and half, the condition of where gets no gradient), and node names.
#include <gtest/gtest.h>

#include <functional>

#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

Tensor strided_input(const Shape& shape, double lo, double hi, uint64_t seed = 7) {
  Tensor t = non_contiguous(make_input(shape, lo, hi, seed).detach());
  EXPECT_FALSE(t.is_contiguous());
  return t.requires_grad_();
}

// A CPU bool mask with the given pattern (row-major).
Tensor mask_of(const std::vector<double>& pattern, const Shape& shape) {
  return make(pattern, shape, {.dtype = DType::Bool});
}

using BinaryFn = std::function<Tensor(const Tensor&, const Tensor&)>;

// gradcheck of fn(a, b) with equal shapes, broadcasting both ways, strided operands, and one side only.
void check_binary(const BinaryFn& fn, double lo_a, double hi_a, double lo_b, double hi_b) {
  auto wrapped = [&fn](const TensorList& in) { return TensorList{fn(in[0], in[1])}; };
  check_gradients(wrapped, {make_input({3, 4}, lo_a, hi_a, 1), make_input({3, 4}, lo_b, hi_b, 2)});
  check_gradients(wrapped, {make_input({3, 4}, lo_a, hi_a, 3), make_input({4}, lo_b, hi_b, 4)});
  check_gradients(wrapped, {make_input({2, 1, 3}, lo_a, hi_a, 5), make_input({4, 1}, lo_b, hi_b, 6)});
  check_gradients(wrapped, {strided_input({2, 3}, lo_a, hi_a, 7), strided_input({2, 3}, lo_b, hi_b, 8)});
  check_gradients(wrapped, {make_input({3}, lo_a, hi_a, 9), make_input({3}, lo_b, hi_b, 10).detach()});
  check_gradients(wrapped, {make_input({3}, lo_a, hi_a, 11).detach(), make_input({3}, lo_b, hi_b, 12)});
}

TEST(BinaryGradTest, Arithmetic) {
  check_binary([](const Tensor& a, const Tensor& b) { return kiln::add(a, b, 2.5); }, -1, 1, -1, 1);
  check_binary([](const Tensor& a, const Tensor& b) { return kiln::sub(a, b, 0.5); }, -1, 1, -1, 1);
  check_binary([](const Tensor& a, const Tensor& b) { return a * b; }, -1, 1, -1, 1);
  check_binary([](const Tensor& a, const Tensor& b) { return a / b; }, -1, 1, 0.5, 2);
  auto scalar_forms = [](const TensorList& in) {
    return TensorList{kiln::add(in[0], 2),  kiln::sub(in[0], 1.5), kiln::rsub(in[0], 3),
                      kiln::mul(in[0], -2), kiln::div(in[0], 4),   kiln::div(3.0, in[0])};
  };
  check_gradients(scalar_forms, {make_input({2, 3}, 0.5, 2)});
}

TEST(BinaryGradTest, Remainder) {
  // a / b stays away from integers (where remainder jumps) for these seeds; divisors of both signs.
  check_binary([](const Tensor& a, const Tensor& b) { return kiln::remainder(a, b); }, -3, 3, 0.7, 1.3);
  check_binary([](const Tensor& a, const Tensor& b) { return kiln::remainder(a, b); }, -3, 3, -1.3, -0.7);
}

TEST(BinaryGradTest, MaximumAndMinimum) {
  check_binary([](const Tensor& a, const Tensor& b) { return kiln::maximum(a, b); }, -1, 1, -1, 1);
  check_binary([](const Tensor& a, const Tensor& b) { return kiln::minimum(a, b); }, -1, 1, -1, 1);
}

TEST(BinaryGradTest, Lerp) {
  check_binary([](const Tensor& a, const Tensor& b) { return kiln::lerp(a, b, 0.3); }, -1, 1, -1, 1);
  check_binary([](const Tensor& a, const Tensor& b) { return kiln::lerp(a, b, 0.8); }, -1, 1, -1, 1);
}

TEST(BinaryGradTest, WhereWithBroadcastCondition) {
  const Tensor cond = mask_of({1, 0, 1}, {3, 1});  // broadcasts over (3, 4)
  auto fn = [cond](const TensorList& in) { return TensorList{kiln::where(cond.to(in[0].device()), in[0], in[1])}; };
  check_gradients(fn, {make_input({3, 4}, -1, 1, 1), make_input({3, 4}, -1, 1, 2)});
  check_gradients(fn, {make_input({3, 4}, -1, 1, 3), make_input({4}, -1, 1, 4)});
  check_gradients(fn, {make_input({3, 1}, -1, 1, 5), make_input({1, 4}, -1, 1, 6)});
  check_gradients(fn, {strided_input({3, 2}, -1, 1, 7), strided_input({3, 2}, -1, 1, 8)});
  check_gradients(fn, {make_input({3, 4}, -1, 1, 9).detach(), make_input({4}, -1, 1, 10)});
  auto scalar_forms = [cond](const TensorList& in) {
    const Tensor c = cond.to(in[0].device());
    return TensorList{kiln::where(c, 2.0, in[0]), kiln::where(c, in[0], -1.0)};
  };
  check_gradients(scalar_forms, {make_input({3, 4})});
  check_gradients(scalar_forms, {make_input({4}, -1, 1, 3)});  // the condition broadcasts the operand
}

TEST(BinaryGradTest, MaskedFill) {
  const Tensor mask = mask_of({0, 1, 1, 0}, {4});
  auto fn = [mask](const TensorList& in) { return TensorList{kiln::masked_fill(in[0], mask.to(in[0].device()), 5)}; };
  check_gradients(fn, {make_input({3, 4})});
  check_gradients(fn, {strided_input({2, 4}, -1, 1)});
  check_gradients(fn, {make_input({4}, -1, 1, 5)});
  auto broadcast_a = [](const TensorList& in) {
    return TensorList{kiln::masked_fill(in[0], mask_of({1, 0, 0, 1, 1, 0}, {2, 3}).to(in[0].device()), -2)};
  };
  check_gradients(broadcast_a, {make_input({3}, -1, 1, 5)});  // a (3) broadcasts to the mask's (2, 3)
}

// ---------------------------------------------------------------- hand-derived values
class BinaryGradValueTest : public BackendTest {};

TEST_P(BinaryGradValueTest, MaximumAndMinimumSplitTiesHalfAndHalf) {
  Tensor a = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor b = make({1, 3, 2}, {3}, opts()).requires_grad_();
  Tensor y = kiln::maximum(a, b);
  EXPECT_EQ(y.grad_fn()->name(), "MaximumBackward");
  y.sum().backward();
  expect_values(a.grad(), {3}, {0.5, 0, 1});
  expect_values(b.grad(), {3}, {0.5, 1, 0});

  Tensor c = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor d = make({2}, {}, opts()).requires_grad_();  // 0-d broadcasts: its gradient is the sum
  Tensor z = kiln::minimum(c, d);
  EXPECT_EQ(z.grad_fn()->name(), "MinimumBackward");
  z.backward(make({10, 20, 30}, {3}, opts()));
  expect_values(c.grad(), {3}, {10, 10, 0});
  expect_values(d.grad(), {}, {0 + 10 + 30});
}

TEST_P(BinaryGradValueTest, Remainder) {
  Tensor a = make({5.5, -5.5, 1}, {3}, opts()).requires_grad_();
  Tensor b = make({2, 2, -3}, {3}, opts()).requires_grad_();
  Tensor y = kiln::remainder(a, b);
  EXPECT_EQ(y.grad_fn()->name(), "RemainderBackward");
  y.sum().backward();
  expect_values(a.grad(), {3}, {1, 1, 1});
  expect_values(b.grad(), {3}, {-2, 3, 1});  // -floor(a / b): floor(2.75), floor(-2.75), floor(-1/3)
}

TEST_P(BinaryGradValueTest, WhereGivesTheConditionNoGradient) {
  Tensor cond = make({1, 0, 1}, {3}, opts(DType::Bool));
  Tensor a = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor b = make({4}, {1}, opts()).requires_grad_();
  Tensor y = kiln::where(cond, a, b);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "WhereBackward");
  EXPECT_EQ(y.grad_fn()->next_edges().size(), 2u);  // a and b; the condition has no edge
  y.backward(make({10, 20, 30}, {3}, opts()));
  expect_values(a.grad(), {3}, {10, 0, 30});
  expect_values(b.grad(), {1}, {20});

  Tensor c = make({1, 2, 3}, {3}, opts()).requires_grad_();
  kiln::where(cond, 0.0, c).sum().backward();
  expect_values(c.grad(), {3}, {0, 1, 0});
  Tensor d = make({1, 2, 3}, {3}, opts()).requires_grad_();
  kiln::where(cond, d, 0.0).sum().backward();
  expect_values(d.grad(), {3}, {1, 0, 1});
}

TEST_P(BinaryGradValueTest, MaskedFillAndLerp) {
  Tensor a = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor y = kiln::masked_fill(a, make({0, 1, 0}, {3}, opts(DType::Bool)), 9);
  EXPECT_EQ(y.grad_fn()->name(), "MaskedFillBackward");
  y.sum().backward();
  expect_values(a.grad(), {3}, {1, 0, 1});

  Tensor s = make({0, 0}, {2}, opts()).requires_grad_();
  Tensor e = make({10, 10}, {2}, opts()).requires_grad_();
  Tensor l = kiln::lerp(s, e, 0.25);
  EXPECT_EQ(l.grad_fn()->name(), "LerpBackward");
  expect_values(l, {2}, {2.5, 2.5});
  l.sum().backward();
  expect_values(s.grad(), {2}, {0.75, 0.75});
  expect_values(e.grad(), {2}, {0.25, 0.25});
}

TEST_P(BinaryGradValueTest, ArithmeticNodeNames) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor b = make({3, 4}, {2}, opts());
  EXPECT_EQ((a + b).grad_fn()->name(), "AddBackward");
  EXPECT_EQ((a - b).grad_fn()->name(), "SubBackward");
  EXPECT_EQ((a * b).grad_fn()->name(), "MulBackward");
  EXPECT_EQ((a / b).grad_fn()->name(), "DivBackward");
  EXPECT_EQ(kiln::rsub(a, 1).grad_fn()->name(), "RsubBackward");
  EXPECT_EQ(kiln::div(1.0, a).grad_fn()->name(), "DivBackward");
  EXPECT_EQ(kiln::maximum(b, b).grad_fn(), nullptr);  // nothing requires grad: nothing recorded
}

TEST_P(BinaryGradValueTest, WhereNeedsABoolCondition) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  expect_error([&] { kiln::where(make({1, 0}, {2}, opts()), a, a); }, {"where", "bool"});
}

KILN_INSTANTIATE_BACKENDS(BinaryGradValueTest);

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

TEST(AddNGrad, EveryInputGetsTheOutputGradient) {
  Tensor a = make_input({2, 3}, -1, 1, 1), b = make_input({2, 3}, -1, 1, 2), c = make_input({2, 3}, -1, 1, 3);
  Tensor y = add_n({a, b, c});
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "AddNBackward");
  (y * y).sum().backward();
  const std::vector<double> expected = values((a + b + c).detach() * 2);
  expect_values(a.grad(), {2, 3}, expected);
  expect_values(c.grad(), {2, 3}, expected);
  check_gradients(
      [](const TensorList& in) {
        return TensorList{add_n({in[0], in[1], in[0]})};
      },
      {make_input({3, 2}), non_contiguous(make_input({3, 2}, -1, 1, 9))});
}

}  // namespace
}  // namespace kiln::testing
