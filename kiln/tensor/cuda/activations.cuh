// kiln/tensor/cuda/activations.cuh — tanh, erf and GELU (both forms) as device functions in a compute type C, their
// edges (NaN, ±inf, ±0, saturation) decided by special_values.h as on the CPU (backend-internal). One definition for
// the unary kernels (unary_float.cu) and for the FP8 quantisation that applies a GELU as it reads (fp8_quantize.cu),
// so that both give the same values bit for bit.
#pragma once

#include "kiln/tensor/activation_constants.h"    // GELU's constants
#include "kiln/tensor/cuda/elementwise_ops.cuh"  // m_tanh, m_erf
#include "kiln/tensor/special_values.h"

namespace kiln::cuda {

// tanh(x), saturating to ±1 where the CPU does.
template <typename C>
__device__ __forceinline__ C safe_tanh(C x) {
  return special::tanh_finish(x, m_tanh(x));
}

// erf(x), saturating to ±1 where the CPU does.
template <typename C>
__device__ __forceinline__ C safe_erf(C x) {
  return special::erf_finish(x, m_erf(x));
}

// x/2 (1 + erf(x / sqrt(2))); -0 at -inf.
template <typename C>
__device__ __forceinline__ C gelu_erf(C x) {
  return special::activation_finish(x, x * C(0.5) * (C(1) + safe_erf(x * C(activation::kSqrtHalf))));
}

// x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); -0 at -inf.
template <typename C>
__device__ __forceinline__ C gelu_tanh(C x) {
  return special::activation_finish(
      x, C(0.5) * x * (C(1) + safe_tanh(C(activation::kSqrt2OverPi) * (x + C(activation::kCubic) * (x * x * x)))));
}

}  // namespace kiln::cuda
