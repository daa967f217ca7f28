// autocast::stacked_cast (kiln/autograd/stacked_cast.h), forward and backward side by side.

#include "kiln/autograd/stacked_cast.h"

#include "kiln/autograd/ops/op_recording.h"
#include "kiln/tensor/capture.h"
#include "kiln/tensor/owned_split.h"

namespace kiln {

namespace {

// The stack's gradient, in the parameters' dtype, split into one piece per parameter; pieces that own their rows
// when the gradient is contiguous and held by nothing else (the product that computed it for this node).
struct StackedCastBackward final : Node {
  std::vector<int64_t> rows;
  DType dtype = DType::Float32;
  std::string_view name() const override { return "StackedCastBackward"; }
  TensorList apply(TensorList&& grads) override {
    Tensor g = std::move(grads[0]);
    if (g.dtype() != dtype) g = internal::cast(g, dtype);
    std::vector<Tensor> parts = internal::split_owned(std::move(g), rows);
    TensorList out(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      if (needs_input_grad(i)) out[i] = std::move(parts[i]);
    }
    return out;
  }

 protected:
  // A gradient already in the parameters' dtype needs no cast (a widening product writes it so).
  std::optional<DType> other_gradient_dtype(uint32_t) const override { return dtype; }
};

}  // namespace

Tensor autocast::stacked_cast(const std::vector<Tensor>& params, DType dtype) {
  KILN_CHECK(!params.empty(), "autocast::stacked_cast: no parameters given");
  Tensor stack = capture::active() ? Tensor() : detail::stacked_shadow(params, dtype);
  if (!stack.defined()) {
    std::vector<Tensor> casts;
    casts.reserve(params.size());
    for (const Tensor& p : params) casts.push_back(cast_to(p, dtype));
    return cat(casts, 0);
  }
  // A new alias of the buffer carries this call's history; the buffer itself stays a plain tensor.
  return record<StackedCastBackward>(stack.detach(), params, [&](StackedCastBackward& node) {
    node.dtype = params[0].dtype();
    for (const Tensor& p : params) node.rows.push_back(p.size(0));
  });
}

}  // namespace kiln
