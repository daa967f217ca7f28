// kiln/layers/cuda/batch_norm.h — kiln's batch-norm kernels for CUDA tensors (internal; nn::batch_norm calls them).
//
//   auto fwd = cuda_impl::batch_norm_forward(x, w, b, rm, rv, /*training=*/true, 0.1, 1e-5, /*relu=*/false);
//   auto g = cuda_impl::batch_norm_backward(dy, x, Tensor(), Tensor(), w, fwd.mean, fwd.invstd, true, {});
//   // ResNet's block tail relu(bn(x) + identity): one pass forward, one reduction + one pass backward.
//   auto f = cuda_impl::batch_norm_forward(x, w, b, rm, rv, true, 0.1, 1e-5, /*relu=*/true, identity);
//   auto h = cuda_impl::batch_norm_backward(dy, x, f.y, w, f.mean, f.invstd, true, {.residual = true});
//
// x is (N, C) or (N, C, *) in float16/bfloat16/float32/float64, NCHW-contiguous or (4-d) channels-last; other
// strides are made contiguous first, and y has the layout the kernels ran in. Statistics accumulate in float
// (double for float64 inputs): per-thread sums of x - K and (x - K)^2, K each channel's first value, added per
// block; blocks split over the reduced elements and are added in a fixed order by a second kernel, a warp per
// channel (deterministic, no float atomics). Everything runs on x's current stream with temporaries from the
// caching allocator, and nothing waits for the device.
#pragma once

#include "kiln/tensor/tensor.h"  // Tensor

namespace kiln::nn::cuda_impl {

struct BatchNormForward {
  Tensor y;       // x's shape, dtype and layout
  Tensor mean;    // (C) in the accumulation dtype: the batch's (training) or the running mean (eval)
  Tensor invstd;  // (C) 1 / sqrt(var + eps), same dtype
  // With the ReLU fused and x taken W = 16 / sizeof(element) values at a time (8 for 16-bit x, 4 for float32, 2 for
  // float64): which outputs are > 0, one bit each (bit e % W of byte e / W, e the element's index in x's kernel
  // layout; numel / W bytes). Backward takes it in place of y. Else undefined.
  Tensor relu_mask;
};

// Training: batch mean and biased variance per channel; updates running_mean / running_var in place when
// defined (momentum, unbiased variance), as the composed path. Eval: the running statistics (defined).
// weight, bias (C) may be undefined; any floating dtype. relu: y = max(bn(x), 0). residual (x's shape,
// dtype and device; any layout, read in x's): y = bn(x) + residual, before the ReLU when fused.
// num_batches_tracked (undefined, or a 1-element Int64 tensor on x's device): training adds 1 to it in the kernel
// that finalises the statistics.
BatchNormForward batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    const Tensor& running_mean, const Tensor& running_var, bool training,
                                    double momentum, double eps, bool relu, const Tensor& residual = {},
                                    const Tensor& num_batches_tracked = {});

struct BatchNormGrads {
  Tensor input, weight, bias;  // undefined where not asked for; weight and bias (C) in the accumulation dtype
  Tensor residual;             // the forward's residual's gradient (dy masked by y > 0), in x's layout and dtype
};

struct BatchNormNeeds {
  bool input = true, weight = true, bias = true;
  bool residual = false;  // written by the same elementwise pass as input
};

// dy of y's shape. When relu was fused, its mask is relu_mask (as batch_norm_forward returned it) or, where that is
// undefined, the sign of y (the forward output); without a ReLU both are undefined. A residual added in forward
// needs nothing more: its gradient is dy masked like the input's.
// mean/invstd as batch_norm_forward returned them. training selects the full formula (batch statistics)
// or the eval one (dx = dy * w * invstd).
BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& y, const Tensor& relu_mask,
                                   const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training,
                                   BatchNormNeeds needs);

}  // namespace kiln::nn::cuda_impl
