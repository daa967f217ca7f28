// Gradients of the unary elementwise ops, pow and clamp: gradcheck (float64, CPU, then GPU vs CPU) on
// contiguous and strided inputs for every op, hand-derived values at the points where the gradient is
// special (0 for relu/abs/sign, the bounds of clamp, 0^b for pow), node names, and the activations' fused
// gradients (float32 and bfloat16 rounded once, one backend op per backward node).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tensor/trace.h"  // trace::Listener: which ops a backward node runs
#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

constexpr double kPi = 3.14159265358979323846;

// A strided (non-contiguous) float64 input requiring grad, with make_input's values.
Tensor strided_input(const Shape& shape, double lo, double hi, uint64_t seed = 7) {
  Tensor t = non_contiguous(make_input(shape, lo, hi, seed).detach());
  EXPECT_FALSE(t.is_contiguous());
  return t.requires_grad_();
}

// ---------------------------------------------------------------- gradcheck of every unary op
struct UnaryCase {
  std::string label;
  Tensor (*fn)(const Tensor&);
  double lo, hi;     // input range where the op is smooth (and defined)
  std::string node;  // expected grad_fn name
};

Tensor gelu_exact(const Tensor& x) { return kiln::gelu(x, false); }
Tensor gelu_tanh(const Tensor& x) { return kiln::gelu(x, true); }
Tensor pow_2_5(const Tensor& x) { return kiln::pow(x, 2.5); }
Tensor pow_3(const Tensor& x) { return kiln::pow(x, 3); }
Tensor pow_neg_1_5(const Tensor& x) { return kiln::pow(x, -1.5); }
Tensor pow_0(const Tensor& x) { return kiln::pow(x, 0); }
Tensor exp2_of(const Tensor& x) { return kiln::pow(2.0, x); }
Tensor clamp_both(const Tensor& x) { return kiln::clamp(x, -0.5, 0.5); }
Tensor clamp_min(const Tensor& x) { return kiln::clamp(x, 0.1, std::nullopt); }
Tensor clamp_max(const Tensor& x) { return kiln::clamp(x, std::nullopt, -0.2); }

void PrintTo(const UnaryCase& c, std::ostream* os) { *os << c.label; }

class UnaryGradTest : public ::testing::TestWithParam<UnaryCase> {};

TEST_P(UnaryGradTest, MatchesFiniteDifferences) {
  const UnaryCase& c = GetParam();
  auto fn = [&c](const TensorList& in) { return TensorList{c.fn(in[0])}; };
  check_gradients(fn, {make_input({3, 4}, c.lo, c.hi)});
  check_gradients(fn, {strided_input({2, 3}, c.lo, c.hi, 11)});
  check_gradients(fn, {make_input({}, c.lo, c.hi, 3)});  // 0-d
}

TEST_P(UnaryGradTest, RecordsItsNode) {
  const UnaryCase& c = GetParam();
  Tensor y = c.fn(make_input({2}, c.lo, c.hi));
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), c.node);
  EXPECT_EQ(c.fn(make_input({2}, c.lo, c.hi).detach()).grad_fn(), nullptr);  // nothing requires grad
}

// Where gradcheck samples each domain of the unary table (kiln/tensor/unary_ops.h); Smooth ops are checked on
// both sides of 0, away from every integer and half-integer (where floor, round, sign, relu and abs jump or kink).
struct Range {
  const char* suffix;
  double lo, hi;
};
std::vector<Range> ranges_of(std::string_view domain) {
  if (domain == "Positive") return {{"", 0.5, 3}};
  if (domain == "AboveMinusOne") return {{"", -0.5, 2}};
  if (domain == "Smooth") return {{"_negative", -0.9, -0.6}, {"_positive", 0.6, 0.9}};
  return {{"", -2, 2}};  // All
}

// Every op of the table, then the unary ops written by hand.
std::vector<UnaryCase> unary_cases() {
  std::vector<UnaryCase> cases;
#define KILN_X(Enum, name, result, autocast, save, derivative, reference, domain, bool_advice) \
  for (const Range& r : ranges_of(#domain)) cases.push_back({std::string(#name) + r.suffix, kiln::name, r.lo, r.hi, #Enum "Backward"});
  KILN_UNARY_OPS(KILN_X)
#undef KILN_X
  const UnaryCase by_hand[] = {
      {"gelu", gelu_exact, -3, 3, "GeluBackward"},
      {"gelu_tanh", gelu_tanh, -3, 3, "GeluBackward"},
      {"square", kiln::square, -2, 2, "SquareBackward"},
      {"pow_2_5", pow_2_5, 0.5, 2, "PowBackward"},
      {"pow_3_negative_base", pow_3, -2, 2, "PowBackward"},
      {"pow_negative_exponent", pow_neg_1_5, 0.5, 2, "PowBackward"},
      {"pow_0", pow_0, -2, 2, "PowBackward"},
      {"scalar_pow", exp2_of, -2, 2, "PowBackward"},
      {"clamp", clamp_both, -1, 1, "ClampBackward"},
      {"clamp_min", clamp_min, -1, 1, "ClampBackward"},
      {"clamp_max", clamp_max, -1, 1, "ClampBackward"},
  };
  cases.insert(cases.end(), std::begin(by_hand), std::end(by_hand));
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ops, UnaryGradTest, ::testing::ValuesIn(unary_cases()),
                         [](const ::testing::TestParamInfo<UnaryCase>& info) { return info.param.label; });

// The in-place form of every op of the unary table: the same values and gradients as the out-of-place op, through
// the history it writes over (x * 1.5, then f_ in place), whether the derivative reads the input (copied before
// the write) or the result.
TEST(UnaryTableInPlace, MatchesTheOutOfPlaceOp) {
#define KILN_X(Enum, op_, result, autocast, save, derivative, reference, domain, bool_advice)                 \
  for (const Range& r : ranges_of(#domain)) {                                                                \
    SCOPED_TRACE(#op_ "_");                                                                                 \
    auto in_place = [](const TensorList& in) {                                                               \
      Tensor t = kiln::mul(in[0], 1.5);                                                                      \
      return TensorList{kiln::op_##_(t)};                                                                   \
    };                                                                                                       \
    const Tensor x = make_input({3, 4}, r.lo / 1.5, r.hi / 1.5, 5);                                          \
    check_gradients(in_place, {x});                                                                          \
    Tensor t = kiln::mul(x, 1.5);                                                                            \
    Tensor& w = kiln::op_##_(t);                                                                            \
    EXPECT_EQ(&w, &t);                                                                                       \
    ASSERT_NE(t.grad_fn(), nullptr);                                                                         \
    EXPECT_EQ(t.grad_fn()->name(), #Enum "Backward");                                                        \
    expect_values(t, {3, 4}, values(kiln::op_(kiln::mul(x, 1.5))), 0, 0);                                   \
  }
  KILN_UNARY_OPS(KILN_X)
#undef KILN_X
}

// pow with two tensors: both gradients, broadcasting (3, 4) ^ (4), and strided operands.
TEST(PowGradTest, TensorExponentMatchesFiniteDifferences) {
  auto fn = [](const TensorList& in) { return TensorList{kiln::pow(in[0], in[1])}; };
  check_gradients(fn, {make_input({3, 4}, 0.5, 2), make_input({4}, -2, 2, 9)});
  check_gradients(fn, {make_input({4}, 0.5, 2, 5), make_input({2, 1, 4}, -2, 2, 13)});
  check_gradients(fn, {strided_input({2, 3}, 0.5, 2), strided_input({2, 3}, -1, 1, 17)});
  // Only one side requires grad.
  check_gradients(fn, {make_input({3}, 0.5, 2), make_input({3}, -1, 1, 3).detach()});
  check_gradients(fn, {make_input({3}, 0.5, 2).detach(), make_input({3}, -1, 1, 3)});
}

// ---------------------------------------------------------------- hand-derived values
class UnaryGradValueTest : public BackendTest {};

// Gradient of sum(f(x)) at x.
Tensor grad_of(Tensor (*f)(const Tensor&), const Tensor& x_values) {
  Tensor x = x_values.detach().requires_grad_();
  f(x).sum().backward();
  return x.grad();
}

TEST_P(UnaryGradValueTest, SmoothOpsAtKnownPoints) {
  const Tensor x = make({0, 1, 4}, {3}, opts());
  expect_values(grad_of(kiln::exp, x), {3}, {1, std::exp(1.0), std::exp(4.0)});
  expect_values(grad_of(kiln::tanh, x), {3}, {1, 1 - std::pow(std::tanh(1.0), 2), 1 - std::pow(std::tanh(4.0), 2)});
  expect_values(
      grad_of(kiln::sigmoid, x), {3},
      {0.25, std::exp(-1.0) / std::pow(1 + std::exp(-1.0), 2), std::exp(-4.0) / std::pow(1 + std::exp(-4.0), 2)});
  expect_values(grad_of(kiln::square, x), {3}, {0, 2, 8});
  expect_values(grad_of(kiln::erf, x), {3},
                {2 / std::sqrt(kPi), 2 / std::sqrt(kPi) * std::exp(-1.0), 2 / std::sqrt(kPi) * std::exp(-16.0)});
  expect_values(grad_of(gelu_exact, x), {3},
                {0.5, 0.5 * (1 + std::erf(1 / std::sqrt(2.0))) + std::exp(-0.5) / std::sqrt(2 * kPi),
                 0.5 * (1 + std::erf(4 / std::sqrt(2.0))) + 4 * std::exp(-8.0) / std::sqrt(2 * kPi)});
  const double s1 = 1 / (1 + std::exp(-1.0));
  expect_values(grad_of(kiln::silu, make({0, 1}, {2}, opts())), {2}, {0.5, s1 * (1 + (1 - s1))});
  expect_values(grad_of(gelu_tanh, make({0}, {1}, opts())), {1}, {0.5});

  const Tensor p = make({0.25, 1, 4}, {3}, opts());
  expect_values(grad_of(kiln::sqrt, p), {3}, {1, 0.5, 0.25});
  expect_values(grad_of(kiln::rsqrt, p), {3}, {-4, -0.5, -1.0 / 16});  // -x^(-3/2) / 2
  expect_values(grad_of(kiln::reciprocal, p), {3}, {-16, -1, -1.0 / 16});
  expect_values(grad_of(kiln::log, p), {3}, {4, 1, 0.25});
  expect_values(grad_of(kiln::log2, p), {3}, {4 / std::log(2.0), 1 / std::log(2.0), 0.25 / std::log(2.0)});
  expect_values(grad_of(kiln::log1p, p), {3}, {0.8, 0.5, 0.2});
  expect_values(grad_of(kiln::expm1, p), {3}, {std::exp(0.25), std::exp(1.0), std::exp(4.0)});
}

// relu, abs and sign at 0 give 0, as in PyTorch; floor, ceil, round have zero gradient everywhere.
TEST_P(UnaryGradValueTest, ZeroAndPiecewiseConstantGradients) {
  const Tensor x = make({-1.5, 0, 2.5}, {3}, opts());
  expect_values(grad_of(kiln::relu, x), {3}, {0, 0, 1});
  expect_values(grad_of(kiln::abs, x), {3}, {-1, 0, 1});
  expect_values(grad_of(kiln::neg, x), {3}, {-1, -1, -1});
  for (auto f : {kiln::sign, kiln::floor, kiln::ceil, kiln::round}) {
    const Tensor g = grad_of(f, x);
    ASSERT_TRUE(g.defined());
    expect_values(g, {3}, {0, 0, 0});
  }
}

// At the bounds the gradient passes (PyTorch's convention); outside it is 0.
TEST_P(UnaryGradValueTest, ClampPassesAtTheBounds) {
  const Tensor x = make({-2, -1, 0, 1, 2}, {5}, opts());
  expect_values(grad_of(clamp_both, make({-1, -0.5, 0, 0.5, 1}, {5}, opts())), {5}, {0, 1, 1, 1, 0});
  Tensor a = x.detach().requires_grad_();
  kiln::clamp(a, std::nullopt, 1).sum().backward();
  expect_values(a.grad(), {5}, {1, 1, 1, 1, 0});
  Tensor b = x.detach().requires_grad_();
  kiln::clamp(b, -1, std::nullopt).sum().backward();
  expect_values(b.grad(), {5}, {0, 1, 1, 1, 1});
}

TEST_P(UnaryGradValueTest, PowAtKnownPointsAndZeroBase) {
  Tensor x = make({2, -1}, {2}, opts()).requires_grad_();
  kiln::pow(x, 3).sum().backward();
  expect_values(x.grad(), {2}, {12, 3});

  Tensor e = make({3, 0}, {2}, opts()).requires_grad_();
  kiln::pow(2.0, e).sum().backward();
  expect_values(e.grad(), {2}, {8 * std::log(2.0), std::log(2.0)});

  // 0^b: d/db would be 0 * log(0) = NaN; PyTorch (and kiln) give 0 where b >= 0. d/da at b == 0 is 0.
  Tensor a = make({0, 0, 2}, {3}, opts()).requires_grad_();
  Tensor b = make({2, 0, 0}, {3}, opts()).requires_grad_();
  kiln::pow(a, b).sum().backward();
  expect_values(a.grad(), {3}, {0, 0, 0});
  expect_values(b.grad(), {3}, {0, 0, std::log(2.0)});
  Tensor z = make({1, 0}, {2}, opts()).requires_grad_();
  kiln::pow(0.0, z).sum().backward();
  expect_values(z.grad(), {2}, {0, 0});
}

// Float32 on the backend: gradients keep the input's dtype and device.
TEST_P(UnaryGradValueTest, GradientKeepsDtypeAndDevice) {
  Tensor x = make({0.5, 2}, {2}, opts(DType::Float32)).requires_grad_();
  (kiln::sqrt(x) + kiln::sigmoid(x) + kiln::pow(x, 2)).sum().backward();
  EXPECT_EQ(x.grad().dtype(), DType::Float32);
  EXPECT_EQ(x.grad().device(), dev());
  const double s0 = 1 / (1 + std::exp(-0.5)), s1 = 1 / (1 + std::exp(-2.0));
  expect_values(x.grad(), {2},
                {1 / (2 * std::sqrt(0.5)) + s0 * (1 - s0) + 1, 1 / (2 * std::sqrt(2.0)) + s1 * (1 - s1) + 4});
}

// gelu (both forms), silu and relu in float32 and bfloat16 on the backend: the gradient of y = f(x) for an
// arbitrary output gradient g is g * f'(x), computed in float32 and rounded once (half an ulp of the dtype),
// against float64 derivatives written from the definitions.
TEST_P(UnaryGradValueTest, ActivationGradientsAreRoundedOnce) {
  const std::vector<double> xs = {-6, -3, -1.5, -0.75, -0.25, 0, 0.125, 0.5, 1, 2.5, 4, 12};
  const std::vector<double> gs = {0.5, -1.25, 2, 1, -0.75, 3, 1.5, -2, 0.25, 1, -1, 2};
  auto gelu_d = [](double x) {
    return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-x * x / 2) / std::sqrt(2 * kPi);
  };
  auto gelu_tanh_d = [](double x) {
    const double k = std::sqrt(2 / kPi), t = std::tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
  };
  auto silu_d = [](double x) {
    const double s = 1 / (1 + std::exp(-x));
    return s * (1 + x * (1 - s));
  };
  auto relu_d = [](double x) { return x > 0 ? 1.0 : 0.0; };
  struct Case {
    Tensor (*f)(const Tensor&);
    std::function<double(double)> d;
  };
  const Case cases[] = {{gelu_exact, gelu_d}, {gelu_tanh, gelu_tanh_d}, {kiln::silu, silu_d}, {kiln::relu, relu_d}};
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    for (const Case& c : cases) {
      Tensor x = make(xs, {3, 4}, opts(dt)).requires_grad_();
      const Tensor g = make(gs, {3, 4}, opts(dt));
      c.f(x).backward(g);
      ASSERT_TRUE(x.grad().defined());
      EXPECT_EQ(x.grad().dtype(), dt);
      std::vector<double> expected;
      for (size_t i = 0; i < xs.size(); ++i) expected.push_back(gs[i] * c.d(xs[i]));  // xs, gs exact in bfloat16
      expect_values(x.grad(), {3, 4}, expected, dt == DType::BFloat16 ? 4e-3 : 1e-5, 1e-6);
    }
  }
}

// Each activation's backward is one backend op (one kernel on a GPU): its node runs nothing else.
class OpRecorder final : public trace::Listener {
 public:
  std::vector<std::string> ops_in_node;  // the ops run while a backward node named `node` was running
  std::string node;
  void begin(const trace::Range& r) override {
    if (r.kind == trace::Kind::Backward && r.name == node) inside_ = true;
    else if (r.kind == trace::Kind::Op && inside_) ops_in_node.emplace_back(r.name);
  }
  void end(const trace::Range& r) override {
    if (r.kind == trace::Kind::Backward && r.name == node) inside_ = false;
  }

 private:
  bool inside_ = false;
};

TEST_P(UnaryGradValueTest, ActivationBackwardIsOneFusedOp) {
  struct Case {
    std::function<Tensor(const Tensor&)> f;
    std::string node, op;
  };
  const Case cases[] = {
      {gelu_exact, "GeluBackward", "gelu_backward"},
      {gelu_tanh, "GeluBackward", "gelu_tanh_backward"},
      {kiln::silu, "SiluBackward", "silu_backward"},
      {kiln::relu, "ReluBackward", "relu_backward"},
      {[](const Tensor& x) { return (x * 1.0).relu_(); }, "ReluBackward", "relu_backward"},  // in place
  };
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    for (const Case& c : cases) {
      Tensor x = make({-1, 0.5, 2, -0.25}, {2, 2}, opts(dt)).requires_grad_();
      Tensor y = c.f(x);
      auto recorder = std::make_shared<OpRecorder>();
      recorder->node = c.node;
      trace::add_listener(recorder);
      y.backward(ones_like(y));
      trace::remove_listener(recorder);
      EXPECT_EQ(recorder->ops_in_node, std::vector<std::string>{c.op}) << c.node << " on " << dt;
    }
  }
}

// A graph freed by backward cannot run again through a node that saved a tensor.
TEST_P(UnaryGradValueTest, SecondBackwardThroughAFreedNodeIsAnError) {
  Tensor x = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor y = kiln::exp(x).sum();
  y.backward();
  expect_error([&] { y.backward(); }, {"ExpBackward", "retain_graph=true"});
}

KILN_INSTANTIATE_BACKENDS(UnaryGradValueTest);

}  // namespace
}  // namespace kiln::testing
