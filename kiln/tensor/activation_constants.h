// kiln/tensor/activation_constants.h — the constants of GELU and its gradient, shared by the CPU and CUDA
// backends' forward and backward kernels (backend-internal).
#pragma once

namespace kiln::activation {

inline constexpr double kSqrtHalf = 0.70710678118654752440;     // 1/sqrt(2), GELU's erf argument scale
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2 pi), the normal density's scale
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi), GELU's tanh approximation
inline constexpr double kCubic = 0.044715;                      // the tanh approximation's x^3 coefficient

}  // namespace kiln::activation
