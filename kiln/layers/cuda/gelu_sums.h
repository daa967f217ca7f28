// kiln/layers/cuda/gelu_sums.h — a transformer MLP's backward step through its GELU, with the first product's bias
// gradient in the same pass (internal; used by nn::gelu_backward_with_column_sums).
//
//   if (cuda_impl::gelu_backward_sums_fits(g, h)) {
//     auto [dh, sums] = cuda_impl::gelu_backward_sums(g, h, tanh_approximation);   // dh (R, C), sums (C) float32
//   }
//
// dh = g * gelu'(h) with internal::gelu_backward's values bit for bit (the same device functions, computed in float32
// and rounded once), and each column's float32 sum of dh as stored (what a product with dh as its output gradient
// sums for its bias). One kernel reads g and h once and writes dh and one partial sum per 64-row tile and column
// (added in a fixed order, so the result does not vary between runs); a row reduction of the partials finishes the
// sums. Without it the bias gradient is a second pass over dh (cuBLASLt's bias-gradient epilogue, or a reduction).
#pragma once

#include <utility>

#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

// Whether the kernel takes (g, h): CUDA tensors of one shape (R, C) with R >= 1 and C >= 1, one dtype (float32,
// bfloat16 or float16), both contiguous, 16-byte aligned, and C a multiple of the elements in 16 bytes (4 or 8).
bool gelu_backward_sums_fits(const Tensor& g, const Tensor& h);

// (dh, sums) as above; g and h must fit (gelu_backward_sums_fits).
std::pair<Tensor, Tensor> gelu_backward_sums(const Tensor& g, const Tensor& h, bool tanh_approximation);

}  // namespace kiln::nn::cuda_impl
