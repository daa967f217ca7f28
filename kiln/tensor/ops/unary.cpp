// Frontend of the unary elementwise ops (and pow, clamp): dtype rules, then the backend's unary primitive.
#include <cmath>  // INFINITY
#include <limits>

#include "kiln/tensor/ops/elementwise_common.h"  // unary, unary_, binary, ResultKind, Operand

namespace kiln::internal {

using detail::Operand;
using detail::ResultKind;

namespace {
// `instead`: the end of the message (the table's bool_advice); nullptr when a bool tensor is taken as numbers.
void check_not_bool(std::string_view op, const Tensor& a, const char* instead) {
  KILN_CHECK(instead == nullptr || !a.defined() || a.dtype() != DType::Bool, op,
             ": not supported on a bool tensor (shape ", a.shape(), ")", instead);
}
}  // namespace

// The ops of the table (unary_ops.h), out of place and in place.
#define KILN_X(Enum, name, result, autocast, save, derivative, reference, domain, bool_advice) \
  Tensor name(const Tensor& a) {                                                               \
    check_not_bool(#name, a, bool_advice);                                                     \
    return detail::unary(#name, UnaryOp::Enum, a, ResultKind::result);                         \
  }                                                                                            \
  Tensor& name##_(Tensor& a) {                                                                 \
    check_not_bool(#name "_", a, bool_advice);                                                 \
    return detail::unary_(#name "_", UnaryOp::Enum, a, ResultKind::result);                    \
  }
KILN_UNARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Enum, name, reference) \
  Tensor name(const Tensor& a) { return detail::unary(#name, UnaryOp::Enum, a, ResultKind::Bool); }
KILN_UNARY_PREDICATES(KILN_X)
#undef KILN_X

Tensor gelu(const Tensor& a, bool tanh_approximation) {
  return detail::unary("gelu", tanh_approximation ? UnaryOp::GeluTanh : UnaryOp::GeluErf, a, ResultKind::Float);
}

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
Tensor square(const Tensor& a) {
  // square(x) is pow(x, 2): a bool tensor promotes with the integer 2 to int64, as in PyTorch.
  if (a.defined() && a.dtype() == DType::Bool) return square(cast(a, DType::Int64));
  return detail::unary("square", UnaryOp::Square, a, ResultKind::Same);
}

// ---------------------------------------------------------------- pow with a number (pow(a, b) is the binary table's)

namespace {
// An integer result with a negative integer exponent has no integer answer (PyTorch refuses it too).
void check_integer_exponent(DType result, const Scalar& exponent) {
  KILN_CHECK(!(is_integral(result, true) && exponent.is_integral() && exponent.to_int64() < 0),
             "pow: integers to negative integer powers are not allowed (", result, " tensor to the power ", exponent,
             "); convert the base to a floating dtype first, e.g. with .to(DType::Float32)");
}
}  // namespace

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

}  // namespace kiln::internal
