// Unary elementwise ops (and pow, clamp), forward and backward side by side. Most gradients are
// g * f'(x): one formula per op, applied by elementwise::UnaryBackward to the op's saved input or, where
// f' is cheaper from it, its saved result (exp, sqrt, tanh, sigmoid, rsqrt, reciprocal, relu). All
// shapes are those of the input; nothing broadcasts.
#include <cmath>
#include "kiln/autograd/ops/op_recording.h"

#include "kiln/autograd/ops/elementwise_nodes.h"

namespace kiln {

using elementwise::ClampBackward;
using elementwise::UnaryBackward;

namespace {

constexpr double kPi = 3.14159265358979323846;

enum class Save { Nothing, Input, Result };

// Records `out` = f(a) with gradient formula(g, saved).
Tensor record_unary(Tensor out, const Tensor& a, std::string_view name, UnaryBackward::Formula formula, Save save) {
  if (needs_grad(a)) {
    auto node = make_node<UnaryBackward>(a);
    node->op_name = name;
    node->formula = formula;
    if (save == Save::Input) node->saved = SavedTensor(a, false);
    set_history(out, node);
    if (save == Save::Result) node->saved = SavedTensor(out, /*is_output=*/true);
  }
  return out;
}

// An op whose forward is ops::f and whose gradient is `formula`, with autocast policy `op`.
Tensor unary(Op op, Tensor (*forward)(const Tensor&), const Tensor& a_in, std::string_view name,
             UnaryBackward::Formula formula, Save save) {
  auto [a] = autocast::inputs(op, a_in);
  return record_unary(forward(a), a, name, formula, save);
}

// ---------------------------------------------------------------- formulas: g is the incoming gradient,
// x the op's input, y its result.
Tensor abs_grad(const Tensor& g, const Tensor& x) { return ops::mul(g, ops::sign(x)); }
Tensor expm1_grad(const Tensor& g, const Tensor& y) { return ops::mul(g, ops::add(y, 1.0)); }  // e^x = y + 1
Tensor log_grad(const Tensor& g, const Tensor& x) { return ops::div(g, x); }
Tensor log1p_grad(const Tensor& g, const Tensor& x) { return ops::div(g, ops::add(x, 1.0)); }
Tensor log2_grad(const Tensor& g, const Tensor& x) { return ops::div(g, ops::mul(x, std::log(2.0))); }
// y = x^(-1/2): dy/dx = -y^3 / 2.
Tensor rsqrt_grad(const Tensor& g, const Tensor& y) { return ops::mul(g, ops::mul(ops::mul(ops::square(y), y), -0.5)); }
Tensor sin_grad(const Tensor& g, const Tensor& x) { return ops::mul(g, ops::cos(x)); }
Tensor cos_grad(const Tensor& g, const Tensor& x) { return ops::neg(ops::mul(g, ops::sin(x))); }
Tensor tanh_grad(const Tensor& g, const Tensor& y) { return ops::mul(g, ops::rsub(ops::square(y), 1.0)); }
// d erf(x)/dx = 2 / sqrt(pi) * exp(-x^2).
Tensor erf_grad(const Tensor& g, const Tensor& x) {
  return ops::mul(g, ops::mul(ops::exp(ops::neg(ops::square(x))), 2.0 / std::sqrt(kPi)));
}
Tensor sigmoid_grad(const Tensor& g, const Tensor& y) { return ops::mul(g, ops::mul(y, ops::rsub(y, 1.0))); }
// gelu, gelu with the tanh approximation and silu: g * f'(x) in one fused pass each (ops::gelu_backward,
// ops::silu_backward), instead of a chain of a dozen ops over the whole tensor.
Tensor gelu_grad(const Tensor& g, const Tensor& x) { return ops::gelu_backward(g, x, /*tanh_approximation=*/false); }
Tensor gelu_tanh_grad(const Tensor& g, const Tensor& x) {
  return ops::gelu_backward(g, x, /*tanh_approximation=*/true);
}
Tensor silu_grad(const Tensor& g, const Tensor& x) { return ops::silu_backward(g, x); }
// sign, floor, ceil, round: piecewise constant, zero gradient (as in PyTorch).
Tensor zero_grad(const Tensor& g, const Tensor&) { return ops::zeros_like(g); }
Tensor square_grad(const Tensor& g, const Tensor& x) { return ops::mul(g, ops::mul(x, 2.0)); }
Tensor reciprocal_grad(const Tensor& g, const Tensor& y) { return ops::neg(ops::mul(g, ops::square(y))); }

}  // namespace

// The formulas that the in-place forms share (elementwise_nodes.h).
namespace elementwise {
Tensor neg_grad(const Tensor& g, const Tensor&) { return ops::neg(g); }
Tensor exp_grad(const Tensor& g, const Tensor& y) { return ops::mul(g, y); }
Tensor sqrt_grad(const Tensor& g, const Tensor& y) { return ops::div(g, ops::mul(y, 2.0)); }
// Where the result is > 0 the input was; the gradient at x = 0 is 0, as in PyTorch. One fused pass.
Tensor relu_grad(const Tensor& g, const Tensor& y) { return ops::relu_backward(g, y); }
}  // namespace elementwise

using elementwise::exp_grad;
using elementwise::neg_grad;
using elementwise::relu_grad;
using elementwise::sqrt_grad;

Tensor neg(const Tensor& a) { return unary(Op::Neg, ops::neg, a, "NegBackward", neg_grad, Save::Nothing); }
Tensor abs(const Tensor& a) { return unary(Op::Abs, ops::abs, a, "AbsBackward", abs_grad, Save::Input); }
Tensor exp(const Tensor& a) { return unary(Op::Exp, ops::exp, a, "ExpBackward", exp_grad, Save::Result); }
Tensor expm1(const Tensor& a) { return unary(Op::Expm1, ops::expm1, a, "Expm1Backward", expm1_grad, Save::Result); }
Tensor log(const Tensor& a) { return unary(Op::Log, ops::log, a, "LogBackward", log_grad, Save::Input); }
Tensor log1p(const Tensor& a) { return unary(Op::Log1p, ops::log1p, a, "Log1pBackward", log1p_grad, Save::Input); }
Tensor log2(const Tensor& a) { return unary(Op::Log2, ops::log2, a, "Log2Backward", log2_grad, Save::Input); }
Tensor sqrt(const Tensor& a) { return unary(Op::Sqrt, ops::sqrt, a, "SqrtBackward", sqrt_grad, Save::Result); }
Tensor rsqrt(const Tensor& a) { return unary(Op::Rsqrt, ops::rsqrt, a, "RsqrtBackward", rsqrt_grad, Save::Result); }
Tensor sin(const Tensor& a) { return unary(Op::Sin, ops::sin, a, "SinBackward", sin_grad, Save::Input); }
Tensor cos(const Tensor& a) { return unary(Op::Cos, ops::cos, a, "CosBackward", cos_grad, Save::Input); }
Tensor tanh(const Tensor& a) { return unary(Op::Tanh, ops::tanh, a, "TanhBackward", tanh_grad, Save::Result); }
Tensor erf(const Tensor& a) { return unary(Op::Erf, ops::erf, a, "ErfBackward", erf_grad, Save::Input); }
Tensor sigmoid(const Tensor& a) {
  return unary(Op::Sigmoid, ops::sigmoid, a, "SigmoidBackward", sigmoid_grad, Save::Result);
}
Tensor relu(const Tensor& a) { return unary(Op::Relu, ops::relu, a, "ReluBackward", relu_grad, Save::Result); }
Tensor gelu(const Tensor& a_in, bool tanh_approximation) {
  auto [a] = autocast::inputs(Op::Gelu, a_in);
  return record_unary(ops::gelu(a, tanh_approximation), a, "GeluBackward",
                      tanh_approximation ? gelu_tanh_grad : gelu_grad, Save::Input);
}
Tensor silu(const Tensor& a) { return unary(Op::Silu, ops::silu, a, "SiluBackward", silu_grad, Save::Input); }
// No autocast policy: these keep their input's dtype.
Tensor sign(const Tensor& a) { return record_unary(ops::sign(a), a, "SignBackward", zero_grad, Save::Nothing); }
Tensor floor(const Tensor& a) { return record_unary(ops::floor(a), a, "FloorBackward", zero_grad, Save::Nothing); }
Tensor ceil(const Tensor& a) { return record_unary(ops::ceil(a), a, "CeilBackward", zero_grad, Save::Nothing); }
Tensor round(const Tensor& a) { return record_unary(ops::round(a), a, "RoundBackward", zero_grad, Save::Nothing); }
Tensor square(const Tensor& a) { return unary(Op::Square, ops::square, a, "SquareBackward", square_grad, Save::Input); }
Tensor reciprocal(const Tensor& a) {
  return unary(Op::Reciprocal, ops::reciprocal, a, "ReciprocalBackward", reciprocal_grad, Save::Result);
}

// ---------------------------------------------------------------- pow
// out = a^b. d/da = g * b * a^(b-1), 0 where b == 0; d/db = g * out * log(a), 0 where a == 0 and b >= 0
// (there a^b is 0 or 1 and the limit of the gradient is 0). Both as in PyTorch. Shapes: broadcast of a, b.
namespace {

struct PowBackward final : Node {
  SavedTensor base, exponent, result;
  std::string_view name() const override { return "PowBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor a = base.unpack(*this), b = exponent.unpack(*this);
    Tensor ga, gb;
    if (needs_input_grad(0)) {
      ga = ops::where(ops::eq(b, 0.0), 0.0, ops::mul(g, ops::mul(b, ops::pow(a, ops::sub(b, 1.0)))));
    }
    if (needs_input_grad(1)) {
      const Tensor zero_base = ops::logical_and(ops::eq(a, 0.0), ops::ge(b, 0.0));
      gb = ops::where(zero_base, 0.0, ops::mul(g, ops::mul(result.unpack(*this), ops::log(a))));
    }
    return {ga, gb};
  }
  void release_saved() override {
    base.reset();
    exponent.reset();
    result.reset();
  }
};

// out = a^e (scalar e). d/da = g * e * a^(e-1), 0 when e == 0.
struct PowScalarExponentBackward final : Node {
  SavedTensor base;
  double exponent = 1;
  std::string_view name() const override { return "PowBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    if (exponent == 0.0) return {ops::zeros_like(g)};
    return {ops::mul(g, ops::mul(ops::pow(base.unpack(*this), exponent - 1.0), exponent))};
  }
  void release_saved() override { base.reset(); }
};

// out = s^b (scalar s). d/db = g * out * log(s), 0 where s == 0 and b >= 0.
struct PowScalarBaseBackward final : Node {
  SavedTensor exponent, result;
  double base = 1;
  std::string_view name() const override { return "PowBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor gb = ops::mul(grads[0], ops::mul(result.unpack(*this), std::log(base)));
    if (base != 0.0) return {gb};
    return {ops::where(ops::ge(exponent.unpack(*this), 0.0), 0.0, gb)};
  }
  void release_saved() override {
    exponent.reset();
    result.reset();
  }
};

}  // namespace

Tensor pow(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = autocast::inputs(Op::Pow, a_in, b_in);
  Tensor out = ops::pow(a, b);
  if (needs_grad(a, b)) {
    auto node = make_node<PowBackward>(a, b);
    node->base = SavedTensor(a, false);
    node->exponent = SavedTensor(b, false);
    set_history(out, node);
    if (node->needs_input_grad(1)) node->result = SavedTensor(out, /*is_output=*/true);
  }
  return out;
}

Tensor pow(const Tensor& a_in, Scalar exponent) {
  auto [a] = autocast::inputs(Op::Pow, a_in);
  Tensor out = ops::pow(a, exponent);
  if (needs_grad(a)) {
    auto node = make_node<PowScalarExponentBackward>(a);
    node->exponent = exponent.to_double();
    if (node->exponent != 0.0) node->base = SavedTensor(a, false);
    set_history(out, node);
  }
  return out;
}

Tensor pow(Scalar base, const Tensor& b_in) {
  auto [b] = autocast::inputs(Op::Pow, b_in);
  Tensor out = ops::pow(base, b);
  if (needs_grad(b)) {
    auto node = make_node<PowScalarBaseBackward>(b);
    node->base = base.to_double();
    if (node->base == 0.0) node->exponent = SavedTensor(b, false);
    set_history(out, node);
    node->result = SavedTensor(out, /*is_output=*/true);
  }
  return out;
}

// ---------------------------------------------------------------- clamp
// The gradient passes where min <= x <= max (at the bounds too, as in PyTorch), and is 0 elsewhere.
TensorList ClampBackward::apply(TensorList&& grads) {
  const Tensor x = input.unpack(*this);
  Tensor inside;
  if (min) inside = ops::ge(x, *min);
  if (max) inside = inside.defined() ? ops::logical_and(inside, ops::le(x, *max)) : ops::le(x, *max);
  if (!inside.defined()) return {grads[0]};
  return {ops::where(inside, grads[0], 0.0)};
}

Tensor clamp(const Tensor& a_in, std::optional<Scalar> min, std::optional<Scalar> max) {
  auto [a] = autocast::inputs(Op::Clamp, a_in);
  Tensor out = ops::clamp(a, min, max);
  if (needs_grad(a)) {
    auto node = make_node<ClampBackward>(a);
    node->input = SavedTensor(a, false);
    node->min = min;
    node->max = max;
    set_history(out, node);
  }
  return out;
}

}  // namespace kiln
