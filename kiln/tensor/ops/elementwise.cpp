// Frontend of the binary elementwise ops, where, masked_fill, lerp and the in-place arithmetic.
// Promotion, devices and broadcasting are shared with the unary ops (elementwise_common.h).
#include <cmath>  // std::abs
#include <tuple>

#include "kiln/tensor/ops/elementwise_common.h"  // binary, binary_, Operand, ResultKind

namespace kiln::internal {

using detail::Operand;
using detail::ResultKind;

DType result_type(const Tensor& a, const Tensor& b) {
  const Operand x(a), y(b);
  detail::check_defined("result_type", {&x, &y});
  return detail::result_type_of({&x, &y});
}

DType result_type(const Tensor& a, Scalar b) {
  const Operand x(a), y(b);
  detail::check_defined("result_type", {&x});
  return detail::result_type_of({&x, &y});
}

// ---------------------------------------------------------------- add and sub: alpha

namespace {
bool is_one(const Scalar& s) { return !s.is_bool() && s.to_double() == 1.0; }

// alpha * b in b's promoted dtype, so that alpha never changes the result type of a + alpha * b.
Operand scaled(std::string_view op, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  if (is_one(alpha)) return b;
  const Operand x(a), y(b);
  detail::check_defined(op, {&x, &y});
  const DType dtype = detail::result_type_of({&x, &y});
  KILN_CHECK(is_floating_point(dtype) || !alpha.is_floating_point(), op, ": for integer tensors (", dtype,
             "), alpha must be an integer, got ", alpha);
  KILN_CHECK(dtype != DType::Bool || alpha.is_bool(), op, ": for bool tensors, alpha must be a bool, got ", alpha);
  const Tensor bb = to(b, b.device(), dtype);
  return detail::binary(op, BinaryOp::Mul, bb, scalar_tensor(alpha, {.dtype = dtype, .device = Device::cpu()}),
                        ResultKind::Same);
}
}  // namespace

// ---------------------------------------------------------------- the binary table (binary_ops.h)
// Each row's forms: name(a, b) with the row's dtype rule; Scalar rows also name(a, number) and the in-place
// name_(a, b), name_(a, number); Alpha rows as Scalar, with alpha * b in b's promoted dtype.
#define KILN_BINARY_DEFINE_Plain(Enum, name, kind)                        \
  Tensor name(const Tensor& a, const Tensor& b) {                         \
    return detail::binary(#name, BinaryOp::Enum, a, b, ResultKind::kind); \
  }
#define KILN_BINARY_DEFINE_Scalar(Enum, name, kind)                                   \
  KILN_BINARY_DEFINE_Plain(Enum, name, kind) Tensor name(const Tensor& a, Scalar b) { \
    return detail::binary(#name, BinaryOp::Enum, a, b, ResultKind::kind);             \
  }                                                                                   \
  Tensor& name##_(Tensor& a, const Tensor& b) {                                       \
    return detail::binary_(#name "_", BinaryOp::Enum, a, b, ResultKind::kind);        \
  }                                                                                   \
  Tensor& name##_(Tensor& a, Scalar b) { return detail::binary_(#name "_", BinaryOp::Enum, a, b, ResultKind::kind); }
#define KILN_BINARY_DEFINE_Alpha(Enum, name, kind)                                                                 \
  Tensor name(const Tensor& a, const Tensor& b, Scalar alpha) {                                                    \
    return detail::binary(#name, BinaryOp::Enum, a, scaled(#name, a, b, alpha), ResultKind::kind);                 \
  }                                                                                                                \
  Tensor name(const Tensor& a, Scalar b) { return detail::binary(#name, BinaryOp::Enum, a, b, ResultKind::kind); } \
  Tensor& name##_(Tensor& a, const Tensor& b, Scalar alpha) {                                                      \
    return detail::binary_(#name "_", BinaryOp::Enum, a, scaled(#name "_", a, b, alpha), ResultKind::kind);        \
  }                                                                                                                \
  Tensor& name##_(Tensor& a, Scalar b) { return detail::binary_(#name "_", BinaryOp::Enum, a, b, ResultKind::kind); }
#define KILN_BINARY_DEFINE_PREDICATE_Plain(Enum, name) KILN_BINARY_DEFINE_Plain(Enum, name, Bool)
#define KILN_BINARY_DEFINE_PREDICATE_Scalar(Enum, name)                               \
  KILN_BINARY_DEFINE_Plain(Enum, name, Bool) Tensor name(const Tensor& a, Scalar b) { \
    return detail::binary(#name, BinaryOp::Enum, a, b, ResultKind::Bool);             \
  }

#define KILN_X(Enum, name, result, autocast, forms, ...) KILN_BINARY_DEFINE_##forms(Enum, name, result)
KILN_BINARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Enum, name, forms, ...) KILN_BINARY_DEFINE_PREDICATE_##forms(Enum, name)
KILN_BINARY_PREDICATES(KILN_X)
#undef KILN_X

// Written by hand beside the table (binary_ops.h): the number comes first.
Tensor rsub(const Tensor& a, Scalar b) { return detail::binary("rsub", BinaryOp::Sub, b, a, ResultKind::Same); }
Tensor div(Scalar a, const Tensor& b) { return detail::binary("div", BinaryOp::Div, a, b, ResultKind::Float); }

// ---------------------------------------------------------------- where and masked_fill

namespace {
void check_bool_mask(std::string_view op, const Tensor& mask, std::string_view what) {
  KILN_CHECK(mask.defined(), op, ": the ", what, " is an undefined tensor");
  KILN_CHECK(mask.dtype() == DType::Bool, op, ": expected the ", what, " to be a bool tensor, got ", mask.dtype(),
             " (shape ", mask.shape(), "); make one with a comparison (e.g. x > 0) or .to(DType::Bool)");
}

Tensor where_impl(const Tensor& condition, const Operand& a, const Operand& b) {
  check_bool_mask("where", condition, "condition");
  const Operand c(condition);
  detail::check_defined("where", {&c, &a, &b});
  const Device device = detail::common_device("where", {&c, &a, &b});
  const DType dtype = detail::result_type_of({&a, &b});
  const Shape shape = broadcast_shapes(broadcast_shapes(condition.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out =
      empty(shape, {.dtype = dtype, .device = device, .memory_format = detail::output_format(shape, {&c, &a, &b})});
  if (out.numel() == 0) return out;
  backend(device).where(out, detail::prepare(c, DType::Bool, device, shape), detail::prepare(a, dtype, device, shape),
                        detail::prepare(b, dtype, device, shape));
  return out;
}
}  // namespace

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) { return where_impl(condition, a, b); }
Tensor where(const Tensor& condition, Scalar a, const Tensor& b) { return where_impl(condition, a, b); }
Tensor where(const Tensor& condition, const Tensor& a, Scalar b) { return where_impl(condition, a, b); }

Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value) {
  KILN_CHECK(a.defined(), "masked_fill: the tensor is an undefined tensor");
  check_not_float8("masked_fill", a.dtype());
  check_bool_mask("masked_fill", mask, "mask");
  // The value takes a's dtype (masked_fill never promotes); a and mask broadcast together, as in PyTorch.
  const Operand x(a), m(mask);
  const Device device = detail::common_device("masked_fill", {&x, &m});
  const Shape shape = broadcast_shapes(a.shape(), mask.shape(), "masked_fill");
  Tensor out =
      empty(shape, {.dtype = a.dtype(), .device = device, .memory_format = detail::output_format(shape, {&x})});
  if (out.numel() == 0) return out;
  backend(device).where(out, detail::prepare(m, DType::Bool, device, shape),
                        detail::prepare(Operand(value), a.dtype(), device, shape),
                        detail::prepare(x, a.dtype(), device, shape));
  return out;
}

Tensor& masked_fill_(Tensor& a, const Tensor& mask, Scalar value) {
  KILN_CHECK(a.defined(), "masked_fill_: the tensor is an undefined tensor");
  check_not_float8("masked_fill_", a.dtype());
  check_bool_mask("masked_fill_", mask, "mask");
  const Operand x(a), m(mask);
  const Device device = detail::common_device("masked_fill_", {&x, &m});
  KILN_CHECK(a.device() == device, "masked_fill_: the tensor is on ", a.device(), " but the mask is on ", device,
             "; move them to one device with .to(device) first");
  detail::check_inplace_destination("masked_fill_", a, broadcast_shapes(a.shape(), mask.shape(), "masked_fill_"));
  if (a.numel() == 0) return a;
  backend(device).where(a, detail::prepare(m, DType::Bool, device, a.shape()),
                        detail::prepare(Operand(value), a.dtype(), device, a.shape()), a);
  detail::bump_version(a);
  return a;
}

// ---------------------------------------------------------------- lerp

Tensor lerp(const Tensor& a, const Tensor& b, Scalar weight) {
  KILN_CHECK(a.defined() && b.defined(), "lerp: an argument is an undefined tensor");
  check_not_float8("lerp", a.dtype());
  check_not_float8("lerp", b.dtype());
  const DType dtype = result_type(a, b);
  KILN_CHECK(is_floating_point(dtype), "lerp: expected floating-point tensors, got ", a.dtype(), " and ", b.dtype(),
             "; convert them with .to(DType::Float32) first");
  // 16-bit floats interpolate in float32 and round once. Near weight 1 the formula runs from b, so that
  // both ends are exact (PyTorch's form).
  const DType op_dtype = is_reduced_float(dtype) ? DType::Float32 : dtype;
  const Tensor x = to(a, a.device(), op_dtype), y = to(b, b.device(), op_dtype);
  const Tensor diff = sub(y, x);
  const double w = weight.to_double();
  const Tensor r = std::abs(w) < 0.5 ? add(x, diff, w) : sub(y, diff, 1.0 - w);
  return to(r, r.device(), dtype);
}

std::tuple<Tensor, Tensor> mul_backward(const Tensor& g, const Tensor& a, const Tensor& b) {
  const bool fused = g.defined() && a.defined() && b.defined() && g.shape() == a.shape() && g.shape() == b.shape() &&
                     g.dtype() == a.dtype() && g.dtype() == b.dtype() && is_floating_point(g.dtype()) &&
                     g.device() == a.device() && g.device() == b.device();
  if (!fused) return {mul(g, b), mul(g, a)};
  check_not_float8("mul_backward", g.dtype());
  Tensor ga = empty(g.shape(), {.dtype = g.dtype(), .device = g.device()});
  Tensor gb = empty(g.shape(), {.dtype = g.dtype(), .device = g.device()});
  if (g.numel() > 0) backend(g.device()).mul_backward(ga, gb, contiguous(g), contiguous(a), contiguous(b));
  return {ga, gb};
}

Tensor add_n(const std::vector<Tensor>& tensors) {
  KILN_CHECK(!tensors.empty(), "add_n: needs at least one tensor");
  const Tensor& first = tensors[0];
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined(), "add_n: tensor ", i, " is undefined");
    KILN_CHECK(t.shape() == first.shape() && t.dtype() == first.dtype() && t.device() == first.device(),
               "add_n: every tensor must have the shape, dtype and device of the first (", first.shape(), ", ",
               first.dtype(), ", ", first.device(), "), but tensor ", i, " is ", t.shape(), ", ", t.dtype(), ", ",
               t.device(), "; use add() for broadcasting or mixed dtypes");
  }
  check_not_float8("add_n", first.dtype());
  KILN_CHECK(first.dtype() != DType::Bool, "add_n: bool tensors cannot be summed; convert them first, e.g. with ",
             ".to(DType::Int64)");
  if (tensors.size() == 1) return clone(first, MemoryFormat::Contiguous);
  Tensor out = empty(first.shape(), {.dtype = first.dtype(), .device = first.device()});
  if (out.numel() == 0) return out;
  std::vector<Tensor> inputs;
  inputs.reserve(tensors.size());
  for (const Tensor& t : tensors) inputs.push_back(contiguous(t));
  backend(first.device()).add_n(out, inputs);
  return out;
}

}  // namespace kiln::internal
