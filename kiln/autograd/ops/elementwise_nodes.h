// kiln/autograd/ops/elementwise_nodes.h — the backward nodes that an out-of-place elementwise op and its
// in-place form share (add and add_, exp and exp_, ...), so that each formula is written once. Private to
// kiln/autograd/ops/: the forwards live in unary.cpp, binary.cpp and inplace.cpp, and each apply() is
// defined beside the forward of its out-of-place op.
//
//   auto node = make_node<elementwise::BinaryBackward>(a, b);  // binary.cpp: kiln::mul, inplace.cpp: mul_
#pragma once

#include <optional>
#include <string_view>
#include <tuple>

#include "kiln/autograd/ops/op_recording.h"
#include "kiln/tensor/backend.h"  // BinaryOp

namespace kiln::elementwise {

inline Scalar negated(Scalar s) { return s.is_floating_point() ? Scalar(-s.to_double()) : Scalar(-s.to_int64()); }

// ---------------------------------------------------------------- unary (unary.cpp)

// A one-input op of the unary table (kiln/tensor/unary_ops.h), out of place or in place: its gradient is
// formula(g, x, y), of which the node saved the input x or the result y (the other is undefined; both are when
// the formula needs neither, e.g. neg).
struct UnaryBackward final : Node {
  using Formula = Tensor (*)(const Tensor& g, const Tensor& x, const Tensor& y);  // g * f'(x), from x or y
  std::string_view op_name;                                                       // "ExpBackward", ...
  Formula formula = nullptr;                                                      // the row's derivative
  SavedTensor saved;                                                              // x or y, as saved_is_result says
  bool saved_is_result = false;                                                   // true: `saved` holds y, else x
  std::string_view name() const override { return op_name; }
  // formula(g, x, y) with the saved tensor in its place.
  TensorList apply(TensorList&& grads) override {
    const Tensor s = saved.unpack(*this);
    return {saved_is_result ? formula(grads[0], Tensor(), s) : formula(grads[0], s, Tensor())};
  }
  // Only a saved tensor is freed: a formula that needs none (neg) may run again without retain_graph.
  void release_saved() override {
    if (saved.defined()) saved.reset();
  }
};

// clamp: the gradient passes where min <= input <= max (boundaries included), else 0.
struct ClampBackward final : Node {
  SavedTensor input;  // clamp's input
  // The bounds clamp had: min the lower one, max the upper one; {} for none.
  std::optional<Scalar> min, max;  // max: the upper bound, {} for none
  std::string_view name() const override { return "ClampBackward"; }
  TensorList apply(TensorList&& grads) override;  // g where min <= input <= max, else 0
  void release_saved() override { input.reset(); }
};

// ---------------------------------------------------------------- binary (binary.cpp)

// A two-input op of the binary table (kiln/tensor/binary_ops.h), out of place or in place: the gradient of a is
// grad_a(g, a, b, y) and that of b is grad_b(g, a, b, y) (times alpha: add and sub with alpha), or both come from
// one pass of `both` when both are needed. The node saves a, b and the result y only where a needed gradient reads
// them (the others stay undefined). Gradients come back in the broadcast shape; the engine sums them to each input's
// shape and casts them to its dtype.
struct BinaryBackward final : Node {
  // A derivative of the table: the gradient of one input from g, a, b and y.
  using Formula = Tensor (*)(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor& y);
  // Both gradients in one pass.
  using Both = std::tuple<Tensor, Tensor> (*)(const Tensor& g, const Tensor& a, const Tensor& b);
  std::string_view op_name;  // "MulBackward", ...
  // The gradients of a (grad_a) and of b (grad_b).
  Formula grad_a = nullptr, grad_b = nullptr;  // grad_b: b's derivative
  Both both = nullptr;                         // used when both gradients are needed; may be null
  Scalar alpha = 1;                            // b's gradient is multiplied by it (add, sub)
  // The inputs a and b and the result y, each saved only where a needed gradient reads it.
  SavedTensor a;  // the first input
  SavedTensor b;  // the second input
  SavedTensor y;  // the result
  std::string_view name() const override { return op_name; }
  TensorList apply(TensorList&& grads) override;  // {a's gradient, b's}, undefined where not needed
  // Only saved tensors are freed: a node that saved none (add) may run again without retain_graph.
  void release_saved() override {
    if (a.defined()) a.reset();
    if (b.defined()) b.reset();
    if (y.defined()) y.reset();
  }
};

// What a row's gradient reads (binary_ops.h's reads_a and reads_b columns), as bits.
enum class Reads : uint8_t { None = 0, A = 1, B = 2, AB = 3, Y = 4, AY = 5, BY = 6, ABY = 7 };

// A row of the binary table as the autograd code needs it (defined in binary.cpp).
struct BinaryRow {
  std::string_view node_name;      // "AddBackward", ...
  BinaryBackward::Formula grad_a;  // a's derivative
  Reads reads_a;                   // what grad_a reads
  BinaryBackward::Formula grad_b;  // b's derivative
  Reads reads_b;                   // what grad_b reads
  BinaryBackward::Both both;       // both at once, or null
};
const BinaryRow& binary_row(BinaryOp op);

// The bits of what `node`'s needed gradients read.
inline unsigned binary_reads(const BinaryRow& row, const Node& node) {
  return (node.needs_input_grad(0) ? static_cast<unsigned>(row.reads_a) : 0u) |
         (node.needs_input_grad(1) ? static_cast<unsigned>(row.reads_b) : 0u);
}

// out = a + s, a - s (the gradient passes unchanged) or s - a (negated).
struct PassBackward final : Node {
  bool negate = false;  // s - a: the gradient is negated
  std::string_view name() const override { return negate ? "RsubBackward" : "AddBackward"; }
  TensorList apply(TensorList&& grads) override;  // g, or -g
};

// out = a * factor, or a / factor when `divide`.
struct MulScalarBackward final : Node {
  Scalar factor = 1;    // the scalar s
  bool divide = false;  // a / s rather than a * s
  std::string_view name() const override { return divide ? "DivBackward" : "MulBackward"; }
  TensorList apply(TensorList&& grads) override;  // g * s, or g / s
};

// out = a with value where mask: the gradient passes where the mask is false.
struct MaskedFillBackward final : Node {
  SavedTensor mask;  // the Bool mask of the forward
  std::string_view name() const override { return "MaskedFillBackward"; }
  TensorList apply(TensorList&& grads) override;  // g with 0 where mask is true
  void release_saved() override { mask.reset(); }
};

}  // namespace kiln::elementwise
