// kiln/autograd/ops/elementwise_nodes.h — the backward nodes that an out-of-place elementwise op and its
// in-place form share (add and add_, exp and exp_, ...), so that each formula is written once. Private to
// kiln/autograd/ops/: the forwards live in unary.cpp, binary.cpp and inplace.cpp, and each apply() is
// defined beside the forward of its out-of-place op.
//
//   auto node = make_node<elementwise::MulBackward>(a, b);    // binary.cpp: kiln::mul, inplace.cpp: mul_
#pragma once

#include <optional>
#include <string_view>

#include "kiln/autograd/ops/op_recording.h"

namespace kiln::elementwise {

inline Scalar negated(Scalar s) { return s.is_floating_point() ? Scalar(-s.to_double()) : Scalar(-s.to_int64()); }

// ---------------------------------------------------------------- unary (unary.cpp)

// A one-input op of the unary table (kiln/tensor/unary_ops.h), out of place or in place: its gradient is
// formula(g, x, y), of which the node saved the input x or the result y (the other is undefined; both are when
// the formula needs neither, e.g. neg).
struct UnaryBackward final : Node {
  using Formula = Tensor (*)(const Tensor& g, const Tensor& x, const Tensor& y);
  std::string_view op_name;  // "ExpBackward", ...
  Formula formula = nullptr;
  SavedTensor saved;
  bool saved_is_result = false;
  std::string_view name() const override { return op_name; }
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
  SavedTensor input;
  std::optional<Scalar> min, max;
  std::string_view name() const override { return "ClampBackward"; }
  TensorList apply(TensorList&& grads) override;
  void release_saved() override { input.reset(); }
};

// ---------------------------------------------------------------- binary (binary.cpp)

// out = a + alpha * b (sub: alpha negated).
struct AddBackward final : Node {
  Scalar alpha = 1;
  std::string_view name() const override { return "AddBackward"; }
  TensorList apply(TensorList&& grads) override;
};

// out = a + s, a - s (the gradient passes unchanged) or s - a (negated).
struct PassBackward final : Node {
  bool negate = false;
  std::string_view name() const override { return negate ? "RsubBackward" : "AddBackward"; }
  TensorList apply(TensorList&& grads) override;
};

// out = a * b; a is saved when b needs a gradient and b when a does.
struct MulBackward final : Node {
  SavedTensor a, b;
  std::string_view name() const override { return "MulBackward"; }
  TensorList apply(TensorList&& grads) override;
  void release_saved() override {
    a.reset();
    b.reset();
  }
};

// out = a * factor, or a / factor when `divide`.
struct MulScalarBackward final : Node {
  Scalar factor = 1;
  bool divide = false;
  std::string_view name() const override { return divide ? "DivBackward" : "MulBackward"; }
  TensorList apply(TensorList&& grads) override;
};

// out = a / b; b always saved, a only when b needs a gradient.
struct DivBackward final : Node {
  SavedTensor a, b;
  std::string_view name() const override { return "DivBackward"; }
  TensorList apply(TensorList&& grads) override;
  void release_saved() override {
    a.reset();
    b.reset();
  }
};

// out = a with value where mask: the gradient passes where the mask is false.
struct MaskedFillBackward final : Node {
  SavedTensor mask;
  std::string_view name() const override { return "MaskedFillBackward"; }
  TensorList apply(TensorList&& grads) override;
  void release_saved() override { mask.reset(); }
};

}  // namespace kiln::elementwise
