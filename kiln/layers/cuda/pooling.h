// kiln/layers/cuda/pooling.h — kiln's 2-d pooling kernels for CUDA tensors (internal; pooling.cpp calls them).
//
//   PoolParams p{.kernel = {3, 3}, .stride = {2, 2}, .pad = {1, 1}, .out = {56, 56}};
//   auto [y, idx] = cuda_impl::max_pool2d_forward(x, p);       // x (N, C, 112, 112) -> y (N, C, 56, 56), idx Int32
//   Tensor dx = cuda_impl::max_pool2d_backward(dy, idx, x.shape(), p, x);
//
// x is 4-d (N, C, H, W), NCHW-contiguous or channels-last (other strides are made contiguous); outputs and
// input gradients take x's layout. float16/bfloat16/float32/float64, accumulation in float (double). One
// thread per output element forward; backward gathers, per input element, the outputs whose window holds it
// (deterministic: no atomics). Max pooling keeps the first maximum of a window in row-major order (PyTorch's
// tie rule), lets NaN win, and saves the flat index h * W + w of the winner in its plane.
#pragma once

#include <array>
#include <cstdint>
#include <utility>

#include "kiln/tensor/tensor.h"  // Tensor

namespace kiln::nn::cuda_impl {

struct PoolParams {
  std::array<int64_t, 2> kernel{}, stride{}, pad{}, out{};
  bool count_include_pad = true;  // average pooling
};

std::pair<Tensor, Tensor> max_pool2d_forward(const Tensor& x, const PoolParams& p);
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const PoolParams& p, const Tensor& x);

Tensor avg_pool2d_forward(const Tensor& x, const PoolParams& p);
Tensor avg_pool2d_backward(const Tensor& grad_out, const PoolParams& p, const Tensor& x);

// Output cell (i, j) averages rows [floor(i H / OH), ceil((i + 1) H / OH)) and columns likewise.
Tensor adaptive_avg_pool2d_forward(const Tensor& x, std::array<int64_t, 2> out);
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Tensor& x);

}  // namespace kiln::nn::cuda_impl
