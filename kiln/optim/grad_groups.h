// kiln/optim/grad_groups.h — internal: the gradients of a parameter list grouped by device, and on each
// device the dense ones by dtype, the lists the fused multi-tensor kernels (cuda/fused.h) take; and the
// memory-order rules those kernels follow (flat_layout, same_order).
// Used by amp::GradScaler and nn::utils::clip_grad_norm_.
#pragma once

#include <vector>

#include "kiln/optim/optimizer.h"
#include "kiln/tensor/tensor.h"

namespace kiln::optim::detail {

struct GradGroup {
  Device device = Device::cpu();
  std::vector<Tensor> all;                          // every gradient on this device, in parameter order
  std::vector<std::vector<Tensor>> dense_by_dtype;  // dense (flat_dense) 32/16-bit floats, one list per dtype
  std::vector<Tensor> others;                       // the rest (strided views, float64)
};

// The fused kernels see each tensor as the flat run of numel elements from its data pointer, in memory order.
// A tensor is flat_dense when its elements fill such a run: contiguous, or channels-last (a 4-d tensor in
// NHWC order, as conv weights are in a channels-last model). Ops on one tensor at a time (scaling, norms,
// finiteness checks) are right for either; an update that combines several tensors elementwise (parameter,
// gradient, optimizer state) also needs them all in the same order (same_order).
bool flat_dense(const Tensor& t);

// The order the fused update keeps a parameter's gradient and state in: channels-last for a 4-d parameter
// stored so (the update then reads and writes the parameter in place), else contiguous (a parameter that is
// not flat_dense is updated through a contiguous copy).
MemoryFormat flat_layout(const Tensor& param);

// Same shape, and the same stride in every dim of size > 1: the same element at each memory offset.
bool same_order(const Tensor& a, const Tensor& b);

// The defined gradients of `params` (tensors sharing the gradients' memory: in-place ops on them update the
// gradients), grouped by device in order of first appearance. Parameters without a gradient are skipped.
std::vector<GradGroup> group_grads(const std::vector<Tensor>& params);

// grad *= factor (a 0-d tensor on grad's device) in place, through kiln ops; a 16-bit gradient is multiplied
// in float32 and rounded once, as the fused kernels do (and so that a factor such as 2^-25 does not round to 0).
void mul_in_float32_(Tensor& grad, const Tensor& factor);

// Every parameter of every group of `opt`, in order (through the pure virtuals only).
std::vector<Tensor> params_of(const Optimizer& opt);

}  // namespace kiln::optim::detail
