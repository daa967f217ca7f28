// Binary elementwise ops (the binary table's, where, masked_fill, lerp), forward and backward side by side. The
// table's ops (kiln/tensor/binary_ops.h) are generated from it: each records an elementwise::BinaryBackward whose
// formulas are the table's derivatives. Gradients come back in the broadcast shape and the computation dtype; the
// engine sums them to each input's shape and casts them to its dtype. The nodes that the in-place forms
// (inplace.cpp) share are declared in elementwise_nodes.h; their formulas are here.
#include "kiln/autograd/ops/elementwise_nodes.h"
#include "kiln/autograd/ops/op_recording.h"
#include "kiln/tensor/capture.h"

#include <iterator>  // std::size
#include <tuple>
#include <utility>  // std::move

namespace kiln {

using elementwise::BinaryBackward;
using elementwise::BinaryRow;
using elementwise::MaskedFillBackward;
using elementwise::MulScalarBackward;
using elementwise::PassBackward;
using elementwise::Reads;

// ---------------------------------------------------------------- the binary table (binary_ops.h)

TensorList BinaryBackward::apply(TensorList&& grads) {
  const Tensor& g = grads[0];
  const Tensor av = a.unpack(*this), bv = b.unpack(*this), yv = y.unpack(*this);
  Tensor ga, gb;
  if (both != nullptr && needs_input_grad(0) && needs_input_grad(1)) {
    std::tie(ga, gb) = both(g, av, bv);
  } else {
    if (needs_input_grad(0)) ga = grad_a(g, av, bv, yv);
    if (needs_input_grad(1)) gb = grad_b(g, av, bv, yv);
  }
  if (gb.defined() && (alpha.is_bool() || alpha.to_double() != 1.0)) gb = internal::mul(gb, alpha);
  return {ga, gb};
}

namespace {

// The table's derivatives: g is the incoming gradient, a and b the op's inputs, y its result.
#define KILN_X(Enum, name, result, autocast, forms, grad_a, reads_a, grad_b, reads_b, ...)   \
  Tensor name##_grad_a([[maybe_unused]] const Tensor& g, [[maybe_unused]] const Tensor& a,   \
                       [[maybe_unused]] const Tensor& b, [[maybe_unused]] const Tensor& y) { \
    return grad_a;                                                                           \
  }                                                                                          \
  Tensor name##_grad_b([[maybe_unused]] const Tensor& g, [[maybe_unused]] const Tensor& a,   \
                       [[maybe_unused]] const Tensor& b, [[maybe_unused]] const Tensor& y) { \
    return grad_b;                                                                           \
  }
KILN_BINARY_OPS(KILN_X)
#undef KILN_X

// Records out = op(a, b) (a + alpha * b for add and sub).
Tensor record_binary(Tensor out, const Tensor& a, const Tensor& b, BinaryOp op, Scalar alpha = 1) {
  if (!needs_grad(a, b)) return out;
  const BinaryRow& row = elementwise::binary_row(op);
  auto node = make_node<BinaryBackward>(a, b);
  node->op_name = row.node_name;
  node->grad_a = row.grad_a;
  node->grad_b = row.grad_b;
  node->both = row.both;
  node->alpha = alpha;
  const unsigned reads = elementwise::binary_reads(row, *node);
  if (reads & static_cast<unsigned>(Reads::A)) node->a = SavedTensor(a, false);
  if (reads & static_cast<unsigned>(Reads::B)) node->b = SavedTensor(b, false);
  set_history(out, node);
  if (reads & static_cast<unsigned>(Reads::Y)) node->y = SavedTensor(out, /*is_output=*/true);
  return out;
}

}  // namespace

const BinaryRow& elementwise::binary_row(BinaryOp op) {
  static const BinaryRow kRows[] = {
#define KILN_X(Enum, name, result, autocast, forms, grad_a, reads_a, grad_b, reads_b, both, ...) \
  {#Enum "Backward", name##_grad_a, Reads::reads_a, name##_grad_b, Reads::reads_b, both},
      KILN_BINARY_OPS(KILN_X)
#undef KILN_X
  };
  const auto i = static_cast<size_t>(op);
  KILN_CHECK(i < std::size(kRows), "autograd: ", binary_op_name(op), " has no gradient (not a row of KILN_BINARY_OPS)");
  return kRows[i];
}

// The table's differentiable ops, through their autocast policy; the in-place forms are in inplace.cpp.
#define KILN_BINARY_FUNCTION_Plain(Enum, name)                              \
  Tensor name(const Tensor& a_in, const Tensor& b_in) {                     \
    capture::Op cap(#name);                                                 \
    auto [a, b] = autocast::inputs(Op::Enum, a_in, b_in);                   \
    Tensor out = record_binary(internal::name(a, b), a, b, BinaryOp::Enum); \
    if (cap) cap.record({a_in, b_in}, {out});                               \
    return out;                                                             \
  }
#define KILN_BINARY_FUNCTION_Scalar(Enum, name) KILN_BINARY_FUNCTION_Plain(Enum, name)
#define KILN_BINARY_FUNCTION_Alpha(Enum, name)                                            \
  Tensor name(const Tensor& a_in, const Tensor& b_in, Scalar alpha) {                     \
    capture::Op cap(#name);                                                               \
    auto [a, b] = autocast::inputs(Op::Enum, a_in, b_in);                                 \
    Tensor out = record_binary(internal::name(a, b, alpha), a, b, BinaryOp::Enum, alpha); \
    if (cap) cap.record({a_in, b_in}, {out}, {{"alpha", capture::scalar_value(alpha)}});  \
    return out;                                                                           \
  }
#define KILN_X(Enum, name, result, autocast, forms, ...) KILN_BINARY_FUNCTION_##forms(Enum, name)
KILN_BINARY_OPS(KILN_X)
#undef KILN_X

// The predicates: no gradient, but their autocast policy.
#define KILN_BINARY_PREDICATE_Plain(Enum, name)           \
  Tensor name(const Tensor& a_in, const Tensor& b_in) {   \
    capture::Op cap(#name);                               \
    auto [a, b] = autocast::inputs(Op::Enum, a_in, b_in); \
    Tensor out = internal::name(a, b);                    \
    if (cap) cap.record({a_in, b_in}, {out});             \
    return out;                                           \
  }
#define KILN_BINARY_PREDICATE_Scalar(Enum, name)                                      \
  KILN_BINARY_PREDICATE_Plain(Enum, name) Tensor name(const Tensor& a_in, Scalar b) { \
    capture::Op cap(#name);                                                           \
    auto [a] = autocast::inputs(Op::Enum, a_in);                                      \
    Tensor out = internal::name(a, b);                                                \
    if (cap) cap.record({a_in}, {out}, {{"other", capture::scalar_value(b)}});        \
    return out;                                                                       \
  }
#define KILN_X(Enum, name, forms, ...) KILN_BINARY_PREDICATE_##forms(Enum, name)
KILN_BINARY_PREDICATES(KILN_X)
#undef KILN_X

// ---------------------------------------------------------------- with a number (by hand: binary_ops.h says why)
// The gradient passes through unchanged (add/sub with a scalar), or negated (rsub).
TensorList PassBackward::apply(TensorList&& grads) { return {negate ? internal::neg(grads[0]) : grads[0]}; }

namespace {

Tensor pass_through(Tensor out, const Tensor& a, bool negate) {
  return record<PassBackward>(std::move(out), a, [&](PassBackward& node) { node.negate = negate; });
}

}  // namespace

// The forms with a number record as "<name>_scalar" with the number as attribute "other".
Tensor add(const Tensor& a, Scalar b) {
  capture::Op cap("add_scalar");
  Tensor out = pass_through(internal::add(a, b), a, false);
  if (cap) cap.record({a}, {out}, {{"other", capture::scalar_value(b)}});
  return out;
}
Tensor sub(const Tensor& a, Scalar b) {
  capture::Op cap("sub_scalar");
  Tensor out = pass_through(internal::sub(a, b), a, false);
  if (cap) cap.record({a}, {out}, {{"other", capture::scalar_value(b)}});
  return out;
}
Tensor rsub(const Tensor& a, Scalar b) {  // b - a
  capture::Op cap("rsub_scalar");
  Tensor out = pass_through(internal::rsub(a, b), a, true);
  if (cap) cap.record({a}, {out}, {{"other", capture::scalar_value(b)}});
  return out;
}

// out = a * s, or a / s. d/da = g * s (g / s, exactly as forward computed a / s).
TensorList MulScalarBackward::apply(TensorList&& grads) {
  return {divide ? internal::div(grads[0], factor) : internal::mul(grads[0], factor)};
}

namespace {

Tensor mul_scalar(const Tensor& a, Scalar s, bool divide) {
  Tensor out = divide ? internal::div(a, s) : internal::mul(a, s);
  return record<MulScalarBackward>(out, a, [&](MulScalarBackward& node) {
    node.factor = s;
    node.divide = divide;
  });
}

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

Tensor mul(const Tensor& a, Scalar b) {
  capture::Op cap("mul_scalar");
  Tensor out = mul_scalar(a, b, false);
  if (cap) cap.record({a}, {out}, {{"other", capture::scalar_value(b)}});
  return out;
}
Tensor div(const Tensor& a, Scalar b) {
  capture::Op cap("div_scalar");
  Tensor out = mul_scalar(a, b, true);
  if (cap) cap.record({a}, {out}, {{"other", capture::scalar_value(b)}});
  return out;
}
Tensor div(Scalar a, const Tensor& b) {  // a / b
  capture::Op cap("rdiv_scalar");
  Tensor out = record<ScalarDivBackward>(internal::div(a, b), b, [&](ScalarDivBackward& node) {
    node.numerator = a;
    node.b = SavedTensor(b, false);
  });
  if (cap) cap.record({b}, {out}, {{"other", capture::scalar_value(a)}});
  return out;
}

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
  return record<WhereBackward>(std::move(out), tensors..., [&](WhereBackward& node) {
    node.condition = SavedTensor(condition, false);
    node.a_is_tensor = a_is_tensor;
    node.b_is_tensor = b_is_tensor;
  });
}

}  // namespace

// Recorded as "where" with inputs (condition, a, b); a number operand is an attribute ("a" or "b") and its
// input undefined.
Tensor where(const Tensor& condition, const Tensor& a_in, const Tensor& b_in) {
  capture::Op cap("where");
  auto [a, b] = autocast::inputs(Op::Where, a_in, b_in);
  Tensor out = record_where(internal::where(condition, a, b), condition, true, true, a, b);
  if (cap) cap.record({condition, a_in, b_in}, {out});
  return out;
}
Tensor where(const Tensor& condition, Scalar a, const Tensor& b_in) {
  capture::Op cap("where");
  auto [b] = autocast::inputs(Op::Where, b_in);
  Tensor out = record_where(internal::where(condition, a, b), condition, false, true, b);
  if (cap) cap.record({condition, Tensor(), b_in}, {out}, {{"a", capture::scalar_value(a)}});
  return out;
}
Tensor where(const Tensor& condition, const Tensor& a_in, Scalar b) {
  capture::Op cap("where");
  auto [a] = autocast::inputs(Op::Where, a_in);
  Tensor out = record_where(internal::where(condition, a, b), condition, true, false, a);
  if (cap) cap.record({condition, a_in, Tensor()}, {out}, {{"b", capture::scalar_value(b)}});
  return out;
}

// ---------------------------------------------------------------- masked_fill: out = mask ? value : a
// d/da = g where the mask is false, else 0. The mask (bool) gets no gradient.
TensorList MaskedFillBackward::apply(TensorList&& grads) {
  return {internal::masked_fill(grads[0], mask.unpack(*this), 0.0)};
}

Tensor masked_fill(const Tensor& a_in, const Tensor& mask, Scalar value) {
  capture::Op cap("masked_fill");
  auto [a] = autocast::inputs(Op::MaskedFill, a_in);
  Tensor out = record<MaskedFillBackward>(internal::masked_fill(a, mask, value), a,
                                          [&](MaskedFillBackward& node) { node.mask = SavedTensor(mask, false); });
  if (cap) cap.record({a_in, mask}, {out}, {{"value", capture::scalar_value(value)}});
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
  return record<LerpBackward>(internal::lerp(a, b, weight), a, b,
                              [&](LerpBackward& node) { node.weight = weight.to_double(); });
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
