// kiln/layers/cuda/layer_norm.h — layer norm on the GPU: one kernel forward, two backward (internal).
//
// x is viewed as rows (R, D) of the normalised size D = prod(normalized_shape); statistics per row in
// float32 (float64 for float64 input). weight and bias (D) have x's dtype and may be undefined.
#pragma once

#include <optional>

#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

struct LayerNormSaved {
  Tensor y;     // x's shape and dtype (the residual's with a residual)
  Tensor mean;  // (R), float32 (float64 for float64 x)
  Tensor rstd;  // (R), 1 / sqrt(var + eps)
  Tensor sum;   // with a residual: x + residual, the layer's input for backward
};
// With `residual` (x's shape, x's dtype or Float32 for a 16-bit x; D <= 1024): normalises x + residual, summed in
// float32 (exactly as a cast of x and an add would), and returns that sum too.
LayerNormSaved layer_norm_forward(const Tensor& x, int64_t d, const Tensor& weight, const Tensor& bias, double eps,
                                  const Tensor& residual = {});

struct LayerNormGrads {
  Tensor dx, dweight, dbias;  // undefined where not asked for
  Tensor dx_low;              // dx in dx_also_in as well, when asked for
};
// dx_also_in (BFloat16 or Float16, for Float32 x with D <= 1024): also write dx in that dtype, from the same values.
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, int64_t d, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, bool need_dx, bool need_dweight, bool need_dbias,
                                   std::optional<DType> dx_also_in = std::nullopt);

}  // namespace kiln::nn::cuda_impl
