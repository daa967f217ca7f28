// kiln/optim/clip_grad.h — gradient clipping: optim::clip_grad_norm_ and optim::clip_grad_value_, also named
// nn::utils::clip_grad_norm_ / clip_grad_value_ as in torch.nn.utils and libtorch's torch::nn::utils (the
// names PyTorch users look for).
//
//   loss.backward();
//   Tensor norm = nn::utils::clip_grad_norm_(model->parameters(), 1.0);  // 0-d, on the device: no sync
//   nn::utils::clip_grad_value_(model->parameters(), 0.5);               // each element into [-0.5, 0.5]
//   opt.step();
//   if (step % 100 == 0) log(norm.item<float>());                         // reading it is the sync
//
// With a GradScaler, call scaler.unscale_(opt) before clipping so the norm is of the true gradients.
#pragma once

#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::optim {

// Scales the gradients of `params` in place so that their total norm (the norm of all gradients seen as one
// vector) is at most max_norm: each gradient *= min(1, max_norm / (total + 1e-6)), the coefficient computed on
// the device (a multiplication by exactly 1 when the total is below max_norm). norm_type: p > 0 or INFINITY
// (the largest |element|). Returns the total norm before clipping, a 0-d tensor on the first gradient's device
// (float32; float64 when every gradient is float64); 0 (on the CPU) when no parameter has a gradient.
// On CUDA the L2 norm and the scaling are fused kernels (a few launches for all tensors). Nothing syncs the
// host, except error_if_nonfinite = true, which reads the total to throw kiln::Error when it is inf or NaN
// (then nothing is changed); with false a non-finite total turns the gradients into NaN, as in PyTorch.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// Clamps every element of every gradient into [-clip_value, clip_value] in place; a row-sparse gradient is
// coalesced first (repeated rows summed), then its values clamped, as the dense gradient's would be.
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace kiln::optim

// PyTorch's names for the same functions.
namespace kiln::nn::utils {
using optim::clip_grad_norm_;
using optim::clip_grad_value_;
}  // namespace kiln::nn::utils
