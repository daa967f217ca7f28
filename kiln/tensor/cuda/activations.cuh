// kiln/tensor/cuda/activations.cuh — tanh, erf, GELU (both forms) and GELU's derivatives as device functions in a
// compute type C, their
// edges (NaN, ±inf, ±0, saturation) decided by special_values.h as on the CPU (backend-internal). One definition for
// the unary kernels (unary_float.cu) and for the FP8 quantisation that applies a GELU as it reads (fp8_quantize.cu),
// so that both give the same values bit for bit.
#pragma once

#include <type_traits>  // std::is_same_v

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

// ---- GELU (erf form) and its derivative in float: through the normal tail Q(x) = Phi(-|x|) = erfc(|x|/sqrt(2))/2,
// so that Phi(x) = 1 - Q (x >= 0) or Q (x < 0) and gelu(x) = x Phi(x), gelu'(x) = Phi(x) + x phi(x). Q is
// exp(-x^2/2) t P(t) with t = 1/(1 + |x|/(2 sqrt 2)) and P the polynomial of activation_constants.h (the CPU's float
// GELU uses the same). One reciprocal and one exp2 (the hardware's approximations, within 2 ulps) and 8 FMAs, against
// the library's erff and expf with their branches; the derivative shares them, phi(x) = exp(-x^2/2)/sqrt(2 pi).
// Accuracy against float64 at every float in [-16, 16] on a grid of 2^-12 (GeluAccuracy, on an H100): gelu within 8.3
// ulps for |x| <= 3, the error coming from exp2's argument x^2/2 rounded to float, 37 ulps for |x| <= 8 and 112
// beyond, in the left tail, where the formula 1 + erf(x/sqrt(2)) would cancel to nothing; gelu' within 1.7e-7.
// exp2 flushes results below float's smallest normal to 0: Q is 0, not subnormal, for |x| > 13.2. P(1) = 1/2
// exactly, so gelu'(0) = 1/2 exactly.
struct NormalTail {
  float q;  // Phi(-|x|)
  float e;  // exp(-x^2/2)
};
__device__ __forceinline__ NormalTail normal_tail_of(float x) {
  constexpr float kMinusHalfLog2e = -0.72134752044448170368f;  // exp(-x^2/2) = 2^(x^2 kMinusHalfLog2e)
  float t, e;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(fmaf(fabsf(x), activation::kTailScale, 1.0f)));
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * x * kMinusHalfLog2e));
  return {t * activation::tail_polynomial(t) * e, e};
}
// Phi(x) from the tail: NaN for a NaN x (Q is NaN).
__device__ __forceinline__ float normal_cdf_from(float x, float q) { return x >= 0.0f ? 1.0f - q : q; }

// x/2 (1 + erf(x / sqrt(2))); -0 at -inf. float: x Phi(x) through the normal tail above.
template <typename C>
__device__ __forceinline__ C gelu_erf(C x) {
  if constexpr (std::is_same_v<C, float>) {
    return special::activation_finish(x, x * normal_cdf_from(x, normal_tail_of(x).q));
  } else {
    return special::activation_finish(x, x * C(0.5) * (C(1) + safe_erf(x * C(activation::kSqrtHalf))));
  }
}

// x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); -0 at -inf.
template <typename C>
__device__ __forceinline__ C gelu_tanh(C x) {
  return special::activation_finish(
      x, C(0.5) * x * (C(1) + safe_tanh(C(activation::kSqrt2OverPi) * (x + C(activation::kCubic) * (x * x * x)))));
}

// gelu'(x) = Phi(x) + x phi(x), with Phi the normal CDF and phi its density; 1 at +inf, 0 at -inf, NaN for NaN.
// float: through the normal tail above.
template <typename C>
__device__ __forceinline__ C gelu_erf_grad(C x) {
  if constexpr (std::is_same_v<C, float>) {
    const NormalTail n = normal_tail_of(x);
    return special::activation_grad_finish(x, normal_cdf_from(x, n.q) + x * n.e * float(activation::kInvSqrt2Pi));
  } else {
    const C cdf =
        (special::erf_finish(x * C(activation::kSqrtHalf), m_erf(x * C(activation::kSqrtHalf))) + C(1)) * C(0.5);
    const C e = x * x * C(-0.5);
    const C pdf = special::exp_finish(e, m_exp(special::exp_arg(e))) * C(activation::kInvSqrt2Pi);
    return special::activation_grad_finish(x, cdf + x * pdf);
  }
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
