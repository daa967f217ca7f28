// Binary arithmetic, forward and backward side by side. Gradients come back in the broadcast shape and
// the computation dtype; the engine sums them to each input's shape and casts them to its dtype.
#include "kiln/autograd/autocast.h"
#include "kiln/autograd/functions.h"
#include "kiln/autograd/node.h"

namespace kiln {

using autograd::make_node;
using autograd::needs_grad;
using autograd::Node;
using autograd::SavedTensor;
using autograd::set_history;
using autograd::TensorList;
using autocast::Op;

namespace {

// ---------------------------------------------------------------- add, sub: out = a + alpha * b
// d/da = g, d/db = alpha * g (sub: alpha negated).
struct AddBackward final : Node {
  Scalar alpha = 1;
  std::string_view name() const override { return "AddBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor gb;
    if (needs_input_grad(1)) gb = alpha.to_double() == 1.0 ? g : ops::mul(g, alpha);
    return {needs_input_grad(0) ? g : Tensor(), gb};
  }
};

// The gradient passes through unchanged (add/sub with a scalar), or negated (rsub).
struct PassBackward final : Node {
  bool negate = false;
  std::string_view name() const override { return negate ? "RsubBackward" : "AddBackward"; }
  TensorList apply(TensorList&& grads) override { return {negate ? ops::neg(grads[0]) : grads[0]}; }
};

// ---------------------------------------------------------------- mul: out = a * b
// d/da = g * b, d/db = g * a.
struct MulBackward final : Node {
  SavedTensor a, b;
  std::string_view name() const override { return "MulBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = ops::mul(g, b.unpack(*this));
    if (needs_input_grad(1)) gb = ops::mul(g, a.unpack(*this));
    return {ga, gb};
  }
  void release_saved() override {
    a.reset();
    b.reset();
  }
};

// out = a * s (div by a scalar: s = 1 / divisor). d/da = g * s.
struct MulScalarBackward final : Node {
  Scalar factor = 1;
  bool divide = false;  // g / factor, exactly as forward computed a / factor
  std::string_view name() const override { return divide ? "DivBackward" : "MulBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {divide ? ops::div(grads[0], factor) : ops::mul(grads[0], factor)};
  }
};

// ---------------------------------------------------------------- div: out = a / b
// d/da = g / b, d/db = -g * a / b^2.
struct DivBackward final : Node {
  SavedTensor a, b;
  std::string_view name() const override { return "DivBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor bv = b.unpack(*this);
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = ops::div(g, bv);
    if (needs_input_grad(1)) gb = ops::neg(ops::div(ops::mul(g, a.unpack(*this)), ops::mul(bv, bv)));
    return {ga, gb};
  }
  void release_saved() override {
    a.reset();
    b.reset();
  }
};

// out = s / b. d/db = -g * s / b^2.
struct ScalarDivBackward final : Node {
  Scalar numerator = 1;
  SavedTensor b;
  std::string_view name() const override { return "DivBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor bv = b.unpack(*this);
    return {ops::neg(ops::div(ops::mul(grads[0], numerator), ops::mul(bv, bv)))};
  }
  void release_saved() override { b.reset(); }
};

Scalar negated(Scalar s) { return s.is_floating_point() ? Scalar(-s.to_double()) : Scalar(-s.to_int64()); }

Tensor add_impl(const Tensor& a_in, const Tensor& b_in, Scalar alpha, Op op) {
  auto [a, b] = autocast::inputs(op, a_in, b_in);
  Tensor out = op == Op::Sub ? ops::sub(a, b, alpha) : ops::add(a, b, alpha);
  if (needs_grad(a, b)) {
    auto node = make_node<AddBackward>(a, b);
    node->alpha = op == Op::Sub ? negated(alpha) : alpha;
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

Tensor mul_scalar(const Tensor& a, Scalar s, bool divide) {
  Tensor out = divide ? ops::div(a, s) : ops::mul(a, s);
  if (needs_grad(a)) {
    auto node = make_node<MulScalarBackward>(a);
    node->factor = s;
    node->divide = divide;
    set_history(out, node);
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) { return add_impl(a, b, alpha, Op::Add); }
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) { return add_impl(a, b, alpha, Op::Sub); }
Tensor add(const Tensor& a, Scalar b) { return pass_through(ops::add(a, b), a, false); }
Tensor sub(const Tensor& a, Scalar b) { return pass_through(ops::sub(a, b), a, false); }
Tensor rsub(const Tensor& a, Scalar b) { return pass_through(ops::rsub(a, b), a, true); }

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = autocast::inputs(Op::Mul, a_in, b_in);
  Tensor out = ops::mul(a, b);
  if (needs_grad(a, b)) {
    auto node = make_node<MulBackward>(a, b);
    if (node->needs_input_grad(1)) node->a = SavedTensor(a, false);
    if (node->needs_input_grad(0)) node->b = SavedTensor(b, false);
    set_history(out, node);
  }
  return out;
}
Tensor mul(const Tensor& a, Scalar b) { return mul_scalar(a, b, false); }

Tensor div(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = autocast::inputs(Op::Div, a_in, b_in);
  Tensor out = ops::div(a, b);
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
  Tensor out = ops::div(a, b);
  if (needs_grad(b)) {
    auto node = make_node<ScalarDivBackward>(b);
    node->numerator = a;
    node->b = SavedTensor(b, false);
    set_history(out, node);
  }
  return out;
}

}  // namespace kiln
