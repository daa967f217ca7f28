// Unary elementwise ops (and pow, clamp), forward and backward side by side. The ops of the unary table
// (kiln/tensor/unary_ops.h) are generated from it: each records an elementwise::UnaryBackward whose formula is the
// table's derivative, reading the op's saved input or, where the derivative is cheaper from it, its saved result.
// Their in-place forms save a copy of the input before the write when the derivative needs it. All shapes are
// those of the input; nothing broadcasts.
#include <cmath>
#include "kiln/autograd/ops/op_recording.h"

#include "kiln/autograd/ops/elementwise_nodes.h"
#include "kiln/tensor/capture.h"

namespace kiln {

using elementwise::ClampBackward;
using elementwise::UnaryBackward;

namespace {

enum class Save { Nothing, Input, Result };

// Records `out` = f(a) with gradient formula(g, x, y).
Tensor record_unary(Tensor out, const Tensor& a, std::string_view name, UnaryBackward::Formula formula, Save save) {
  if (needs_grad(a)) {
    auto node = make_node<UnaryBackward>(a);
    node->op_name = name;
    node->formula = formula;
    if (save == Save::Input) node->saved = SavedTensor(a, false);
    set_history(out, node);
    if (save == Save::Result) {
      node->saved = SavedTensor(out, /*is_output=*/true);
      node->saved_is_result = true;
    }
  }
  return out;
}

// An op whose forward is internal::f and whose gradient is `formula`, with autocast policy `op`.
Tensor unary(Op op, Tensor (*forward)(const Tensor&), const Tensor& a_in, std::string_view name,
             UnaryBackward::Formula formula, Save save) {
  auto [a] = autocast::inputs(op, a_in);
  return record_unary(forward(a), a, name, formula, save);
}

// The in-place form: the node takes a's edges before the write (a's old history becomes its input); the input
// the formula needs is copied before the write, the result it needs is saved after it.
Tensor& unary_inplace(Tensor& a, const char* op, Tensor& (*forward)(Tensor&), std::string_view name,
                      UnaryBackward::Formula formula, Save save) {
  const bool record = check_inplace(a, false, op);
  std::shared_ptr<UnaryBackward> node;
  if (record) {
    node = make_node<UnaryBackward>(a);
    node->op_name = name;
    node->formula = formula;
    if (save == Save::Input) node->saved = SavedTensor(internal::clone(a), false);
  }
  forward(a);
  if (record) {
    set_history(a, node);
    if (save == Save::Result) {
      node->saved = SavedTensor(a, /*is_output=*/true);
      node->saved_is_result = true;
    }
  }
  return a;
}

// The table's derivatives: g is the incoming gradient, x the op's input, y its result.
#define KILN_X(Enum, name, result, autocast, save, derivative, ...) \
  Tensor name##_derivative(const Tensor& g, const Tensor& x, const Tensor& y) { return derivative; }
KILN_UNARY_OPS(KILN_X)
#undef KILN_X

// gelu (both forms): g * f'(x) in one fused pass (internal::gelu_backward).
Tensor gelu_grad(const Tensor& g, const Tensor& x, const Tensor&) {
  return internal::gelu_backward(g, x, /*tanh_approximation=*/false);
}
Tensor gelu_tanh_grad(const Tensor& g, const Tensor& x, const Tensor&) {
  return internal::gelu_backward(g, x, /*tanh_approximation=*/true);
}
Tensor square_grad(const Tensor& g, const Tensor& x, const Tensor&) { return internal::mul(g, internal::mul(x, 2.0)); }

}  // namespace

#define KILN_X(Enum, name, result, autocast, save, ...)                                                            \
  Tensor name(const Tensor& a) {                                                                                   \
    capture::Op cap(#name);                                                                                        \
    Tensor out = unary(Op::Enum, internal::name, a, #Enum "Backward", name##_derivative, Save::save);              \
    if (cap) cap.record({a}, {out});                                                                               \
    return out;                                                                                                    \
  }                                                                                                                \
  Tensor& name##_(Tensor& a) {                                                                                     \
    capture::Op cap(#name); /* recorded as the op, its result the same tensor */                                   \
    const Tensor before = a;                                                                                       \
    Tensor& out = unary_inplace(a, #name "_", internal::name##_, #Enum "Backward", name##_derivative, Save::save); \
    if (cap) cap.record({before}, {out});                                                                          \
    return out;                                                                                                    \
  }
KILN_UNARY_OPS(KILN_X)
#undef KILN_X

Tensor gelu(const Tensor& a_in, bool tanh_approximation) {
  capture::Op cap("gelu");
  auto [a] = autocast::inputs(Op::Gelu, a_in);
  Tensor out = record_unary(internal::gelu(a, tanh_approximation), a, "GeluBackward",
                            tanh_approximation ? gelu_tanh_grad : gelu_grad, Save::Input);
  if (cap) cap.record({a_in}, {out}, {{"tanh_approximation", int64_t{tanh_approximation}}});
  return out;
}
Tensor square(const Tensor& a) {
  capture::Op cap("square");
  Tensor out = unary(Op::Square, internal::square, a, "SquareBackward", square_grad, Save::Input);
  if (cap) cap.record({a}, {out});
  return out;
}

// ---------------------------------------------------------------- pow with a number
// pow(a, b) of two tensors is the binary table's (binary_ops.h), with its derivatives. With a number, as there:
// d/da = g * e * a^(e-1), 0 where e == 0; d/db = g * out * log(s), 0 where s == 0 and b >= 0, as in PyTorch.
namespace {

// out = a^e (scalar e). d/da = g * e * a^(e-1), 0 when e == 0.
struct PowScalarExponentBackward final : Node {
  SavedTensor base;
  double exponent = 1;
  std::string_view name() const override { return "PowBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    if (exponent == 0.0) return {internal::zeros_like(g)};
    return {internal::mul(g, internal::mul(internal::pow(base.unpack(*this), exponent - 1.0), exponent))};
  }
  void release_saved() override { base.reset(); }
};

// out = s^b (scalar s). d/db = g * out * log(s), 0 where s == 0 and b >= 0.
struct PowScalarBaseBackward final : Node {
  SavedTensor exponent, result;
  double base = 1;
  std::string_view name() const override { return "PowBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor gb = internal::mul(grads[0], internal::mul(result.unpack(*this), std::log(base)));
    if (base != 0.0) return {gb};
    return {internal::where(internal::ge(exponent.unpack(*this), 0.0), 0.0, gb)};
  }
  void release_saved() override {
    exponent.reset();
    result.reset();
  }
};

}  // namespace

Tensor pow(const Tensor& a_in, Scalar exponent) {
  capture::Op cap("pow_scalar");  // a ** exponent
  auto [a] = autocast::inputs(Op::Pow, a_in);
  Tensor out = internal::pow(a, exponent);
  if (needs_grad(a)) {
    auto node = make_node<PowScalarExponentBackward>(a);
    node->exponent = exponent.to_double();
    if (node->exponent != 0.0) node->base = SavedTensor(a, false);
    set_history(out, node);
  }
  if (cap) cap.record({a_in}, {out}, {{"exponent", capture::scalar_value(exponent)}});
  return out;
}

Tensor pow(Scalar base, const Tensor& b_in) {
  capture::Op cap("rpow_scalar");  // base ** b
  auto [b] = autocast::inputs(Op::Pow, b_in);
  Tensor out = internal::pow(base, b);
  if (needs_grad(b)) {
    auto node = make_node<PowScalarBaseBackward>(b);
    node->base = base.to_double();
    if (node->base == 0.0) node->exponent = SavedTensor(b, false);
    set_history(out, node);
    node->result = SavedTensor(out, /*is_output=*/true);
  }
  if (cap) cap.record({b_in}, {out}, {{"base", capture::scalar_value(base)}});
  return out;
}

// ---------------------------------------------------------------- clamp
// The gradient passes where min <= x <= max (at the bounds too, as in PyTorch), and is 0 elsewhere.
TensorList ClampBackward::apply(TensorList&& grads) {
  const Tensor x = input.unpack(*this);
  Tensor inside;
  if (min) inside = internal::ge(x, *min);
  if (max) inside = inside.defined() ? internal::logical_and(inside, internal::le(x, *max)) : internal::le(x, *max);
  if (!inside.defined()) return {grads[0]};
  return {internal::where(inside, grads[0], 0.0)};
}

Tensor clamp(const Tensor& a_in, std::optional<Scalar> min, std::optional<Scalar> max) {
  capture::Op cap("clamp");
  auto [a] = autocast::inputs(Op::Clamp, a_in);
  Tensor out = internal::clamp(a, min, max);
  if (needs_grad(a)) {
    auto node = make_node<ClampBackward>(a);
    node->input = SavedTensor(a, false);
    node->min = min;
    node->max = max;
    set_history(out, node);
  }
  if (cap) {
    std::vector<capture::Attr> attrs;
    if (min) attrs.push_back({"min", capture::scalar_value(*min)});
    if (max) attrs.push_back({"max", capture::scalar_value(*max)});
    cap.record({a_in}, {out}, std::move(attrs));
  }
  return out;
}

}  // namespace kiln
