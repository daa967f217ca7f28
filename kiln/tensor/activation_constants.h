// kiln/tensor/activation_constants.h — the constants of GELU and its gradient, shared by the CPU and CUDA
// backends' forward and backward kernels (backend-internal).
#pragma once

namespace kiln::activation {

inline constexpr double kSqrtHalf = 0.70710678118654752440;     // 1/sqrt(2), GELU's erf argument scale
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2 pi), the normal density's scale
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi), GELU's tanh approximation
inline constexpr double kCubic = 0.044715;                      // the tanh approximation's x^3 coefficient

// GELU's erf form in float, on both backends, goes through the normal tail Phi(-|x|) = exp(-x^2/2) t P(t), with
// t = 1 / (1 + |x| kTailScale) and P(t) = kTail0 + kTail1 t + ... + kTail8 t^8: erfcx(z)/2 for z = |x|/sqrt(2),
// fitted by minimax of the relative error over z in [0, 9.5] by scripts/fit_normal_tail.py (6e-8 with these float
// coefficients). They sum to 1/2 exactly in float, so P(1) = Phi(0) = 1/2 at x = 0 whatever the evaluation order.
inline constexpr float kTailScale = float(0.5 * kSqrtHalf);
inline constexpr float kTail0 = 0.14104384183883667f, kTail1 = 0.1411767303943634f, kTail2 = 0.12163057178258896f;
inline constexpr float kTail3 = 0.10103465616703033f, kTail4 = -0.012588226236402988f, kTail5 = 0.13798817992210388f;
inline constexpr float kTail6 = -0.2426910698413849f, kTail7 = 0.14185060560703278f, kTail8 = -0.029445309191942215f;

// P(t) by Horner's rule, for a float (on the GPU too: constexpr) or an array of floats (Eigen's, on the CPU).
template <typename T>
constexpr T tail_polynomial(const T& t) {
  T p = t * kTail8 + kTail7;
  p = p * t + kTail6;
  p = p * t + kTail5;
  p = p * t + kTail4;
  p = p * t + kTail3;
  p = p * t + kTail2;
  p = p * t + kTail1;
  return p * t + kTail0;
}

}  // namespace kiln::activation
