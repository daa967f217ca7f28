// kiln/autograd/ops/op_recording.h — what every op family file in kiln/autograd/ops/ uses to record
// itself: the declarations it implements (functions.h), the graph helpers (node.h) and the autocast hook,
// under the short names the files use. Internal: include it only from kiln/autograd/ops/*.cpp.
#pragma once

#include <vector>

#include "kiln/autograd/autocast.h"   // autocast::inputs, autocast::Op
#include "kiln/autograd/functions.h"  // the differentiable ops these files define
#include "kiln/autograd/node.h"       // Node, SavedTensor, make_node, set_history, needs_grad, check_inplace

namespace kiln {

using autocast::Op;
using autograd::check_inplace;
using autograd::make_node;
using autograd::needs_grad;
using autograd::Node;
using autograd::SavedTensor;
using autograd::set_history;
using autograd::TensorList;

namespace recording_detail {
inline bool needs_grad_any(const Tensor& t) { return needs_grad(t); }
inline bool needs_grad_any(const std::vector<Tensor>& ts) { return autograd::needs_grad_list(ts); }
}  // namespace recording_detail

// The one way these files record an op: when an input needs a gradient, a node N with edges to the inputs,
// filled by fill(N&) with what its backward keeps (saved tensors, dims, flags), becomes out's history.
// The input is a Tensor or a std::vector<Tensor> (cat, stack); a second overload takes two Tensors.
//   return record<ProdBackward>(internal::prod(a, dims, keepdim), a, [&](ProdBackward& n) { n.keepdim = keepdim; });
// A fill may save out itself (SavedTensor(out, /*is_output=*/true)): that does not depend on set_history's order.
template <typename N, typename Input, typename Fill>
Tensor record(Tensor out, const Input& input, Fill&& fill) {
  if (!recording_detail::needs_grad_any(input)) return out;
  auto node = make_node<N>(input);
  fill(*node);
  set_history(out, node);
  return out;
}
template <typename N, typename Fill>
Tensor record(Tensor out, const Tensor& a, const Tensor& b, Fill&& fill) {  // two Tensor inputs
  if (!needs_grad(a, b)) return out;
  auto node = make_node<N>(a, b);
  fill(*node);
  set_history(out, node);
  return out;
}

}  // namespace kiln
