// Binary elementwise ops (arithmetic, remainder, maximum/minimum, where, masked_fill, lerp), forward and
// backward side by side. Gradients come back in the broadcast shape and the computation dtype; the
// engine sums them to each input's shape and casts them to its dtype. The nodes that the in-place forms
// (inplace.cpp) share are declared in elementwise_nodes.h; their formulas are here.
#include "kiln/autograd/ops/elementwise_nodes.h"
#include "kiln/autograd/ops/op_recording.h"

namespace kiln {

using elementwise::AddBackward;
using elementwise::DivBackward;
using elementwise::MaskedFillBackward;
using elementwise::MulBackward;
using elementwise::MulScalarBackward;
using elementwise::PassBackward;

// ---------------------------------------------------------------- add, sub: out = a + alpha * b
// d/da = g, d/db = alpha * g (sub: alpha negated).
TensorList AddBackward::apply(TensorList&& grads) {
  const Tensor& g = grads[0];
  Tensor gb;
  if (needs_input_grad(1)) gb = alpha.to_double() == 1.0 ? g : internal::mul(g, alpha);
  return {needs_input_grad(0) ? g : Tensor(), gb};
}

// The gradient passes through unchanged (add/sub with a scalar), or negated (rsub).
TensorList PassBackward::apply(TensorList&& grads) { return {negate ? internal::neg(grads[0]) : grads[0]}; }

namespace {

Tensor add_impl(const Tensor& a_in, const Tensor& b_in, Scalar alpha, Op op) {
  auto [a, b] = autocast::inputs(op, a_in, b_in);
  Tensor out = op == Op::Sub ? internal::sub(a, b, alpha) : internal::add(a, b, alpha);
  if (needs_grad(a, b)) {
    auto node = make_node<AddBackward>(a, b);
    node->alpha = op == Op::Sub ? elementwise::negated(alpha) : alpha;
    set_history(out, node);
  }
  return out;
}

Tensor pass_through(Tensor out, const Tensor& a, bool negate) {
  if (needs_grad(a)) {
    auto node = make_node<PassBackward>(a);
    node->negate = negate;
    set_history(out, node);
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) { return add_impl(a, b, alpha, Op::Add); }
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) { return add_impl(a, b, alpha, Op::Sub); }
Tensor add(const Tensor& a, Scalar b) { return pass_through(internal::add(a, b), a, false); }
Tensor sub(const Tensor& a, Scalar b) { return pass_through(internal::sub(a, b), a, false); }
Tensor rsub(const Tensor& a, Scalar b) { return pass_through(internal::rsub(a, b), a, true); }

// ---------------------------------------------------------------- mul: out = a * b
// d/da = g * b, d/db = g * a.
TensorList MulBackward::apply(TensorList&& grads) {
  const Tensor& g = grads[0];
  if (needs_input_grad(0) && needs_input_grad(1)) {
    auto [ga, gb] = internal::mul_backward(g, a.unpack(*this), b.unpack(*this));  // one pass for both
    return {ga, gb};
  }
  Tensor ga, gb;
  if (needs_input_grad(0)) ga = internal::mul(g, b.unpack(*this));
  if (needs_input_grad(1)) gb = internal::mul(g, a.unpack(*this));
  return {ga, gb};
}

// out = a * s, or a / s. d/da = g * s (g / s, exactly as forward computed a / s).
TensorList MulScalarBackward::apply(TensorList&& grads) {
  return {divide ? internal::div(grads[0], factor) : internal::mul(grads[0], factor)};
}

namespace {

Tensor mul_scalar(const Tensor& a, Scalar s, bool divide) {
  Tensor out = divide ? internal::div(a, s) : internal::mul(a, s);
  if (needs_grad(a)) {
    auto node = make_node<MulScalarBackward>(a);
    node->factor = s;
    node->divide = divide;
    set_history(out, node);
  }
  return out;
}

}  // namespace

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = autocast::inputs(Op::Mul, a_in, b_in);
  Tensor out = internal::mul(a, b);
  if (needs_grad(a, b)) {
    auto node = make_node<MulBackward>(a, b);
    if (node->needs_input_grad(1)) node->a = SavedTensor(a, false);
    if (node->needs_input_grad(0)) node->b = SavedTensor(b, false);
    set_history(out, node);
  }
  return out;
}
Tensor mul(const Tensor& a, Scalar b) { return mul_scalar(a, b, false); }

// ---------------------------------------------------------------- div: out = a / b
// d/da = g / b, d/db = -g * a / b^2.
TensorList DivBackward::apply(TensorList&& grads) {
  const Tensor& g = grads[0];
  const Tensor bv = b.unpack(*this);
  Tensor ga, gb;
  if (needs_input_grad(0)) ga = internal::div(g, bv);
  if (needs_input_grad(1)) gb = internal::neg(internal::div(internal::mul(g, a.unpack(*this)), internal::mul(bv, bv)));
  return {ga, gb};
}

namespace {

// out = s / b. d/db = -g * s / b^2.
struct ScalarDivBackward final : Node {
  Scalar numerator = 1;
  SavedTensor b;
  std::string_view name() const override { return "DivBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor bv = b.unpack(*this);
    return {internal::neg(internal::div(internal::mul(grads[0], numerator), internal::mul(bv, bv)))};
  }
  void release_saved() override { b.reset(); }
};

}  // namespace

Tensor div(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = autocast::inputs(Op::Div, a_in, b_in);
  Tensor out = internal::div(a, b);
  if (needs_grad(a, b)) {
    auto node = make_node<DivBackward>(a, b);
    if (node->needs_input_grad(1)) node->a = SavedTensor(a, false);
    node->b = SavedTensor(b, false);
    set_history(out, node);
  }
  return out;
}
Tensor div(const Tensor& a, Scalar b) { return mul_scalar(a, b, true); }
Tensor div(Scalar a, const Tensor& b) {
  Tensor out = internal::div(a, b);
  if (needs_grad(b)) {
    auto node = make_node<ScalarDivBackward>(b);
    node->numerator = a;
    node->b = SavedTensor(b, false);
    set_history(out, node);
  }
  return out;
}

// ---------------------------------------------------------------- remainder: out = a - floor(a / b) * b
// d/da = g, d/db = -floor(a / b) * g (a and b saved only for b's gradient).
namespace {

struct RemainderBackward final : Node {
  SavedTensor a, b;
  std::string_view name() const override { return "RemainderBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor gb;
    if (needs_input_grad(1))
      gb = internal::neg(internal::mul(g, internal::floor(internal::div(a.unpack(*this), b.unpack(*this)))));
    return {needs_input_grad(0) ? g : Tensor(), gb};
  }
  void release_saved() override {
    a.reset();
    b.reset();
  }
};

}  // namespace

Tensor remainder(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = autocast::inputs(Op::Remainder, a_in, b_in);
  Tensor out = internal::remainder(a, b);
  if (needs_grad(a, b)) {
    auto node = make_node<RemainderBackward>(a, b);
    if (node->needs_input_grad(1)) {
      node->a = SavedTensor(a, false);
      node->b = SavedTensor(b, false);
    }
    set_history(out, node);
  }
  return out;
}

// ---------------------------------------------------------------- maximum, minimum
// The gradient goes to the larger (maximum) or smaller (minimum) input; where a == b it is split half and
// half, as in PyTorch, so that the sum of both gradients is g. Shapes: g (broadcast of a and b).
namespace {

struct MaxMinBackward final : Node {
  SavedTensor a, b;
  bool is_max = true;
  std::string_view name() const override { return is_max ? "MaximumBackward" : "MinimumBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor av = a.unpack(*this), bv = b.unpack(*this);
    // Weight of a: 1 where a wins, 0.5 on ties, 0 where b wins; b gets the rest.
    const Tensor wins = is_max ? internal::gt(av, bv) : internal::lt(av, bv);
    const Tensor weight = internal::add(internal::cast(wins, g.dtype()),
                                        internal::mul(internal::cast(internal::eq(av, bv), g.dtype()), 0.5));
    const Tensor ga = internal::mul(g, weight);
    Tensor gb;
    if (needs_input_grad(1)) gb = internal::sub(g, ga);
    return {needs_input_grad(0) ? ga : Tensor(), gb};
  }
  void release_saved() override {
    a.reset();
    b.reset();
  }
};

Tensor max_min(const Tensor& a_in, const Tensor& b_in, bool is_max) {
  auto [a, b] = autocast::inputs(is_max ? Op::Maximum : Op::Minimum, a_in, b_in);
  Tensor out = is_max ? internal::maximum(a, b) : internal::minimum(a, b);
  if (needs_grad(a, b)) {
    auto node = make_node<MaxMinBackward>(a, b);
    node->is_max = is_max;
    node->a = SavedTensor(a, false);
    node->b = SavedTensor(b, false);
    set_history(out, node);
  }
  return out;
}

}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return max_min(a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return max_min(a, b, false); }

// ---------------------------------------------------------------- where: out = condition ? a : b
// d/da = g where condition, else 0; d/db the opposite. The condition gets no gradient. A scalar operand
// has no edge, so the node's inputs are the tensor operands in order.
namespace {

struct WhereBackward final : Node {
  SavedTensor condition;
  bool a_is_tensor = true, b_is_tensor = true;
  std::string_view name() const override { return "WhereBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor c = condition.unpack(*this);
    TensorList out;
    size_t i = 0;
    if (a_is_tensor) out.push_back(needs_input_grad(i++) ? internal::where(c, g, 0.0) : Tensor());
    if (b_is_tensor) out.push_back(needs_input_grad(i++) ? internal::where(c, 0.0, g) : Tensor());
    return out;
  }
  void release_saved() override { condition.reset(); }
};

template <typename... Inputs>
Tensor record_where(Tensor out, const Tensor& condition, bool a_is_tensor, bool b_is_tensor, const Inputs&... tensors) {
  if (needs_grad(tensors...)) {
    auto node = make_node<WhereBackward>(tensors...);
    node->condition = SavedTensor(condition, false);
    node->a_is_tensor = a_is_tensor;
    node->b_is_tensor = b_is_tensor;
    set_history(out, node);
  }
  return out;
}

}  // namespace

Tensor where(const Tensor& condition, const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = autocast::inputs(Op::Where, a_in, b_in);
  return record_where(internal::where(condition, a, b), condition, true, true, a, b);
}
Tensor where(const Tensor& condition, Scalar a, const Tensor& b_in) {
  auto [b] = autocast::inputs(Op::Where, b_in);
  return record_where(internal::where(condition, a, b), condition, false, true, b);
}
Tensor where(const Tensor& condition, const Tensor& a_in, Scalar b) {
  auto [a] = autocast::inputs(Op::Where, a_in);
  return record_where(internal::where(condition, a, b), condition, true, false, a);
}

// ---------------------------------------------------------------- masked_fill: out = mask ? value : a
// d/da = g where the mask is false, else 0. The mask (bool) gets no gradient.
TensorList MaskedFillBackward::apply(TensorList&& grads) {
  return {internal::masked_fill(grads[0], mask.unpack(*this), 0.0)};
}

Tensor masked_fill(const Tensor& a_in, const Tensor& mask, Scalar value) {
  auto [a] = autocast::inputs(Op::MaskedFill, a_in);
  Tensor out = internal::masked_fill(a, mask, value);
  if (needs_grad(a)) {
    auto node = make_node<MaskedFillBackward>(a);
    node->mask = SavedTensor(mask, false);
    set_history(out, node);
  }
  return out;
}

// ---------------------------------------------------------------- lerp: out = a + w * (b - a)
// d/da = (1 - w) * g, d/db = w * g. Nothing saved: w is a scalar.
namespace {

struct LerpBackward final : Node {
  double weight = 0;
  std::string_view name() const override { return "LerpBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = internal::mul(g, 1.0 - weight);
    if (needs_input_grad(1)) gb = internal::mul(g, weight);
    return {ga, gb};
  }
};

}  // namespace

Tensor lerp(const Tensor& a_in, const Tensor& b_in, Scalar weight) {
  auto [a, b] = autocast::inputs(Op::Lerp, a_in, b_in);
  Tensor out = internal::lerp(a, b, weight);
  if (needs_grad(a, b)) {
    auto node = make_node<LerpBackward>(a, b);
    node->weight = weight.to_double();
    set_history(out, node);
  }
  return out;
}

// ---------------------------------------------------------------- add_n: out = sum_k x_k
// Every input receives the output's gradient unchanged.
namespace {
struct AddNBackward final : Node {
  std::string_view name() const override { return "AddNBackward"; }
  TensorList apply(TensorList&& grads) override { return TensorList(next_edges().size(), grads[0]); }
};
}  // namespace

Tensor add_n(const std::vector<Tensor>& tensors) {
  Tensor out = internal::add_n(tensors);
  if (autograd::needs_grad_list(tensors)) set_history(out, make_node<AddNBackward>(tensors));
  return out;
}

}  // namespace kiln
