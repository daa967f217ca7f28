// kiln/optim/grad_groups.h — internal: the gradients of a parameter list grouped by device, and on each
// device the contiguous ones by dtype, the lists the fused multi-tensor kernels (cuda/fused.h) take.
// Used by amp::GradScaler and nn::utils::clip_grad_norm_.
#pragma once

#include <vector>

#include "kiln/optim/optimizer.h"
#include "kiln/tensor/tensor.h"

namespace kiln::optim::detail {

struct GradGroup {
  Device device = Device::cpu();
  std::vector<Tensor> all;                               // every gradient on this device, in parameter order
  std::vector<std::vector<Tensor>> contiguous_by_dtype;  // contiguous 32/16-bit floats, one list per dtype
  std::vector<Tensor> others;                            // the rest (non-contiguous, float64)
};

// The defined gradients of `params` (tensors sharing the gradients' memory: in-place ops on them update the
// gradients), grouped by device in order of first appearance. Parameters without a gradient are skipped.
std::vector<GradGroup> group_grads(const std::vector<Tensor>& params);

// grad *= factor (a 0-d tensor on grad's device) in place, through kiln ops; a 16-bit gradient is multiplied
// in float32 and rounded once, as the fused kernels do (and so that a factor such as 2^-25 does not round to 0).
void mul_in_float32_(Tensor& grad, const Tensor& factor);

// Every parameter of every group of `opt`, in order (through the pure virtuals only).
std::vector<Tensor> params_of(const Optimizer& opt);

}  // namespace kiln::optim::detail
