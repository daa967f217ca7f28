// kiln/tensor/cuda/activations.cuh — tanh, erf, GELU (both forms) and GELU's derivatives as device functions in a
// compute type C, their
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

// gelu'(x) = Phi(x) + x phi(x), with Phi the normal CDF and phi its density; 1 at +inf, 0 at -inf, NaN for NaN.
template <typename C>
__device__ __forceinline__ C gelu_erf_grad(C x) {
  const C cdf =
      (special::erf_finish(x * C(activation::kSqrtHalf), m_erf(x * C(activation::kSqrtHalf))) + C(1)) * C(0.5);
  const C e = x * x * C(-0.5);
  const C pdf = special::exp_finish(e, m_exp(special::exp_arg(e))) * C(activation::kInvSqrt2Pi);
  return special::activation_grad_finish(x, cdf + x * pdf);
}

// The tanh form's derivative: with t = tanh(k (x + c x^3)), (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2).
template <typename C>
__device__ __forceinline__ C gelu_tanh_grad(C x) {
  const C x2 = x * x;
  const C u = x * (x2 * C(activation::kCubic) + C(1)) * C(activation::kSqrt2OverPi);
  const C t = special::tanh_finish(u, m_tanh(u));
  const C left = (t + C(1)) * C(0.5);
  const C du = (x2 * C(3 * activation::kCubic) + C(1)) * C(activation::kSqrt2OverPi);
  return special::gelu_tanh_grad_finish(x, left + x * (C(1) - t * t) * du * C(0.5));
}

}  // namespace kiln::cuda
