// Frontend of the unary elementwise ops (and pow, clamp): dtype rules, then the backend's unary primitive.
#include <cmath>  // INFINITY
#include <limits>

#include "kiln/tensor/ops/elementwise_common.h"  // unary, unary_, binary, ResultKind, Operand

namespace kiln::ops {

using detail::Operand;
using detail::ResultKind;

namespace {
void check_not_bool(std::string_view op, const Tensor& a, std::string_view instead) {
  KILN_CHECK(!a.defined() || a.dtype() != DType::Bool, op, ": not supported on a bool tensor (shape ", a.shape(), ")",
             instead);
}
}  // namespace

Tensor neg(const Tensor& a) {
  check_not_bool("neg", a, "; negation, the - operator, on a bool tensor: use logical_not() or the ~ operator");
  return detail::unary("neg", UnaryOp::Neg, a, ResultKind::Same);
}
Tensor abs(const Tensor& a) {
  check_not_bool("abs", a, "; convert it with .to(DType::Int64) first");
  return detail::unary("abs", UnaryOp::Abs, a, ResultKind::Same);
}
Tensor exp(const Tensor& a) { return detail::unary("exp", UnaryOp::Exp, a, ResultKind::Float); }
Tensor expm1(const Tensor& a) { return detail::unary("expm1", UnaryOp::Expm1, a, ResultKind::Float); }
Tensor log(const Tensor& a) { return detail::unary("log", UnaryOp::Log, a, ResultKind::Float); }
Tensor log1p(const Tensor& a) { return detail::unary("log1p", UnaryOp::Log1p, a, ResultKind::Float); }
Tensor log2(const Tensor& a) { return detail::unary("log2", UnaryOp::Log2, a, ResultKind::Float); }
Tensor sqrt(const Tensor& a) { return detail::unary("sqrt", UnaryOp::Sqrt, a, ResultKind::Float); }
Tensor rsqrt(const Tensor& a) { return detail::unary("rsqrt", UnaryOp::Rsqrt, a, ResultKind::Float); }
Tensor sin(const Tensor& a) { return detail::unary("sin", UnaryOp::Sin, a, ResultKind::Float); }
Tensor cos(const Tensor& a) { return detail::unary("cos", UnaryOp::Cos, a, ResultKind::Float); }
Tensor tanh(const Tensor& a) { return detail::unary("tanh", UnaryOp::Tanh, a, ResultKind::Float); }
Tensor erf(const Tensor& a) { return detail::unary("erf", UnaryOp::Erf, a, ResultKind::Float); }
Tensor sigmoid(const Tensor& a) { return detail::unary("sigmoid", UnaryOp::Sigmoid, a, ResultKind::Float); }
Tensor relu(const Tensor& a) {
  check_not_bool("relu", a, "; convert it with .to(DType::Float32) first");
  return detail::unary("relu", UnaryOp::Relu, a, ResultKind::Same);
}
Tensor gelu(const Tensor& a, bool tanh_approximation) {
  return detail::unary("gelu", tanh_approximation ? UnaryOp::GeluTanh : UnaryOp::GeluErf, a, ResultKind::Float);
}
Tensor silu(const Tensor& a) { return detail::unary("silu", UnaryOp::Silu, a, ResultKind::Float); }

namespace {
// An activation's gradient g * f'(x): a binary op on floating tensors (integers have no gradient).
Tensor activation_backward(std::string_view name, BinaryOp op, const Tensor& g, const Tensor& x) {
  const Operand og(g), ox(x);
  detail::check_defined(name, {&og, &ox});
  KILN_CHECK(is_floating_point(g.dtype()) && is_floating_point(x.dtype()), name,
             ": expected floating-point tensors, got a ", g.dtype(), " gradient and a ", x.dtype(), " input (shapes ",
             g.shape(), " and ", x.shape(), "); convert them with .to(DType::Float32) first");
  return detail::binary(name, op, og, ox, ResultKind::Same);
}
}  // namespace

Tensor gelu_backward(const Tensor& g, const Tensor& x, bool tanh_approximation) {
  return activation_backward("gelu_backward",
                             tanh_approximation ? BinaryOp::GeluTanhBackward : BinaryOp::GeluErfBackward, g, x);
}
Tensor silu_backward(const Tensor& g, const Tensor& x) {
  return activation_backward("silu_backward", BinaryOp::SiluBackward, g, x);
}
Tensor relu_backward(const Tensor& g, const Tensor& y) {
  return activation_backward("relu_backward", BinaryOp::ReluBackward, g, y);
}
Tensor sign(const Tensor& a) { return detail::unary("sign", UnaryOp::Sign, a, ResultKind::Same); }
Tensor floor(const Tensor& a) { return detail::unary("floor", UnaryOp::Floor, a, ResultKind::Same); }
Tensor ceil(const Tensor& a) { return detail::unary("ceil", UnaryOp::Ceil, a, ResultKind::Same); }
Tensor round(const Tensor& a) { return detail::unary("round", UnaryOp::Round, a, ResultKind::Same); }
Tensor square(const Tensor& a) {
  // square(x) is pow(x, 2): a bool tensor promotes with the integer 2 to int64, as in PyTorch.
  if (a.defined() && a.dtype() == DType::Bool) return square(cast(a, DType::Int64));
  return detail::unary("square", UnaryOp::Square, a, ResultKind::Same);
}
Tensor reciprocal(const Tensor& a) { return detail::unary("reciprocal", UnaryOp::Reciprocal, a, ResultKind::Float); }
Tensor logical_not(const Tensor& a) { return detail::unary("logical_not", UnaryOp::LogicalNot, a, ResultKind::Bool); }
Tensor isnan(const Tensor& a) { return detail::unary("isnan", UnaryOp::IsNan, a, ResultKind::Bool); }
Tensor isinf(const Tensor& a) { return detail::unary("isinf", UnaryOp::IsInf, a, ResultKind::Bool); }
Tensor isfinite(const Tensor& a) { return detail::unary("isfinite", UnaryOp::IsFinite, a, ResultKind::Bool); }

Tensor& relu_(Tensor& a) {
  check_not_bool("relu_", a, "; convert it with .to(DType::Float32) first");
  return detail::unary_("relu_", UnaryOp::Relu, a, ResultKind::Same);
}
Tensor& neg_(Tensor& a) {
  check_not_bool("neg_", a, "; negation, the - operator, on a bool tensor: use logical_not() or the ~ operator");
  return detail::unary_("neg_", UnaryOp::Neg, a, ResultKind::Same);
}
Tensor& exp_(Tensor& a) { return detail::unary_("exp_", UnaryOp::Exp, a, ResultKind::Float); }
Tensor& sqrt_(Tensor& a) { return detail::unary_("sqrt_", UnaryOp::Sqrt, a, ResultKind::Float); }

// ---------------------------------------------------------------- pow

namespace {
// An integer result with a negative integer exponent has no integer answer (PyTorch refuses it too).
void check_integer_exponent(DType result, const Scalar& exponent) {
  KILN_CHECK(!(is_integral(result, true) && exponent.is_integral() && exponent.to_int64() < 0),
             "pow: integers to negative integer powers are not allowed (", result, " tensor to the power ", exponent,
             "); convert the base to a floating dtype first, e.g. with .to(DType::Float32)");
}
}  // namespace

Tensor pow(const Tensor& a, const Tensor& exponent) {
  return detail::binary("pow", BinaryOp::Pow, a, exponent, ResultKind::Same);
}

Tensor pow(const Tensor& a, Scalar exponent) {
  const Operand base(a), e(exponent);
  detail::check_defined("pow", {&base});
  const DType result = detail::result_type_of({&base, &e});
  check_integer_exponent(result, exponent);
  // x ** 2 is the most common power: square is exact and cheaper than the general pow.
  if (exponent.to_double() == 2.0 && result != DType::Bool) return square(to(a, a.device(), result));
  return detail::binary("pow", BinaryOp::Pow, base, e, ResultKind::Same);
}

Tensor pow(Scalar base, const Tensor& exponent) {
  return detail::binary("pow", BinaryOp::Pow, base, exponent, ResultKind::Same);
}

// ---------------------------------------------------------------- clamp

namespace {
// Clamp promotes with its bounds (int_tensor.clamp(0.5, ...) is float32), as PyTorch 2 does.
DType clamp_dtype(std::string_view op, const Tensor& a, const std::optional<Scalar>& min,
                  const std::optional<Scalar>& max) {
  KILN_CHECK(min.has_value() || max.has_value(), op, ": at least one of min and max must be given");
  const Operand x(a), lo(min.value_or(Scalar(0))), hi(max.value_or(Scalar(0)));
  detail::check_defined(op, {&x});
  if (min && max) return detail::result_type_of({&x, &lo, &hi});
  return detail::result_type_of({&x, min ? &lo : &hi});
}

UnaryParams clamp_params(const std::optional<Scalar>& min, const std::optional<Scalar>& max) {
  return {.a = min ? min->to_double() : -std::numeric_limits<double>::infinity(),
          .b = max ? max->to_double() : std::numeric_limits<double>::infinity()};
}
}  // namespace

Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) {
  const DType dtype = clamp_dtype("clamp", a, min, max);
  KILN_CHECK(dtype != DType::Bool, "clamp: not supported on bool tensors (shape ", a.shape(), ")");
  return detail::unary("clamp", UnaryOp::Clamp, to(a, a.device(), dtype), ResultKind::Same, clamp_params(min, max));
}

Tensor& clamp_(Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) {
  const DType dtype = clamp_dtype("clamp_", a, min, max);
  detail::check_can_cast("clamp_", dtype, a.dtype());
  KILN_CHECK(a.dtype() != DType::Bool, "clamp_: not supported on bool tensors (shape ", a.shape(), ")");
  return detail::unary_("clamp_", UnaryOp::Clamp, a, ResultKind::Same, clamp_params(min, max));
}

}  // namespace kiln::ops
