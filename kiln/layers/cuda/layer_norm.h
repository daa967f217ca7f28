// kiln/layers/cuda/layer_norm.h — layer norm on the GPU: one kernel forward, two backward (internal).
//
// x is viewed as rows (R, D) of the normalised size D = prod(normalized_shape); statistics per row in
// float32 (float64 for float64 input). weight and bias (D) have x's dtype and may be undefined.
#pragma once

#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

struct LayerNormSaved {
  Tensor y;     // x's shape and dtype
  Tensor mean;  // (R), float32 (float64 for float64 x)
  Tensor rstd;  // (R), 1 / sqrt(var + eps)
};
LayerNormSaved layer_norm_forward(const Tensor& x, int64_t d, const Tensor& weight, const Tensor& bias, double eps);

struct LayerNormGrads {
  Tensor dx, dweight, dbias;  // undefined where not asked for
};
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, int64_t d, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, bool need_dx, bool need_dweight, bool need_dbias);

}  // namespace kiln::nn::cuda_impl
