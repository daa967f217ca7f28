// Reductions, forward and backward side by side.
#include <algorithm>

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

// The reduced dims of a rank-`rank` input, wrapped and sorted (empty `dims` means all).
Dims reduced_dims(const Dims& dims, int64_t rank, std::string_view op) {
  Dims out;
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) out.push_back(d);
  } else {
    for (int64_t d : dims) out.push_back(wrap_dim(d, rank, op));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A gradient of the reduced shape brought back to the input's shape (a broadcasting view, no copy).
Tensor expand_reduced(const Tensor& g, const Shape& input_shape, const Dims& dims, bool keepdim) {
  Tensor r = g;
  if (!keepdim) {
    for (int64_t d : dims) r = ops::unsqueeze(r, d);
  }
  return ops::expand(r, input_shape);
}

// ---------------------------------------------------------------- sum, mean
// d/da sum = g broadcast back over the reduced dims; mean divides by the count.
struct SumBackward final : Node {
  Shape input_shape;
  Dims dims;
  bool keepdim = false;
  double scale = 1.0;  // 1 / count for mean
  std::string_view name() const override { return scale == 1.0 ? "SumBackward" : "MeanBackward"; }
  TensorList apply(TensorList&& grads) override {
    Tensor g = expand_reduced(grads[0], input_shape, dims, keepdim);
    return {scale == 1.0 ? g : ops::mul(g, scale)};
  }
};

}  // namespace

Tensor sum(const Tensor& a_in, const Dims& dims, bool keepdim, std::optional<DType> dtype) {
  auto [a] = autocast::inputs(Op::Sum, a_in);
  Tensor out = ops::sum(a, dims, keepdim, dtype);
  if (needs_grad(a)) {
    auto node = make_node<SumBackward>(a);
    node->input_shape = a.shape();
    node->dims = reduced_dims(dims, a.dim(), "sum");
    node->keepdim = keepdim;
    set_history(out, node);
  }
  return out;
}

Tensor mean(const Tensor& a_in, const Dims& dims, bool keepdim) {
  auto [a] = autocast::inputs(Op::Mean, a_in);
  Tensor out = ops::mean(a, dims, keepdim);
  if (needs_grad(a)) {
    auto node = make_node<SumBackward>(a);
    node->input_shape = a.shape();
    node->dims = reduced_dims(dims, a.dim(), "mean");
    node->keepdim = keepdim;
    int64_t count = 1;
    for (int64_t d : node->dims) count *= a.size(d);
    node->scale = 1.0 / static_cast<double>(std::max<int64_t>(count, 1));
    set_history(out, node);
  }
  return out;
}

}  // namespace kiln
