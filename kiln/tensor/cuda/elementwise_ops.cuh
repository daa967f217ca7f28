// kiln/tensor/cuda/elementwise_ops.cuh — helpers shared by the CUDA elementwise files (backend-internal).
//
//   launch_same<T>("neg", out, a, NegF<compute_t<T>>{});   // out (T) = f(a (T))
//
// Device math picks float or double versions by overload (expf for float, exp for double), so one
// functor template serves float, double and the 16-bit floats (which compute in float).
#pragma once

#include <cmath>
#include <type_traits>

#include "kiln/tensor/cuda/loops.cuh"  // launch_elementwise, Types

namespace kiln::cuda {

// The accurate CUDA math functions (no __expf-style intrinsics: results must match the CPU closely).
#define KILN_CUDA_MATH(name, float_fn, double_fn)                        \
  __device__ __forceinline__ float name(float x) { return float_fn(x); } \
  __device__ __forceinline__ double name(double x) { return double_fn(x); }
KILN_CUDA_MATH(m_exp, expf, exp)
KILN_CUDA_MATH(m_expm1, expm1f, expm1)
KILN_CUDA_MATH(m_log, logf, log)
KILN_CUDA_MATH(m_log1p, log1pf, log1p)
KILN_CUDA_MATH(m_log2, log2f, log2)
KILN_CUDA_MATH(m_sqrt, sqrtf, sqrt)
KILN_CUDA_MATH(m_rsqrt, rsqrtf, rsqrt)
KILN_CUDA_MATH(m_sin, sinf, sin)
KILN_CUDA_MATH(m_cos, cosf, cos)
KILN_CUDA_MATH(m_tanh, tanhf, tanh)
KILN_CUDA_MATH(m_erf, erff, erf)
KILN_CUDA_MATH(m_floor, floorf, floor)
KILN_CUDA_MATH(m_ceil, ceilf, ceil)
KILN_CUDA_MATH(m_rint, rintf, rint)  // round half to even
KILN_CUDA_MATH(m_fabs, fabsf, fabs)
#undef KILN_CUDA_MATH
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float m_fmod(float x, float y) { return fmodf(x, y); }
__device__ __forceinline__ double m_fmod(double x, double y) { return fmod(x, y); }

template <typename C>
__device__ __forceinline__ bool m_isnan(C x) {
  if constexpr (std::is_floating_point_v<C>) return x != x;
  else return false;
}

// Integer arithmetic that wraps like the CPU (through the unsigned type, where wrapping is defined).
template <typename C, typename U = std::make_unsigned_t<C>>
__device__ __forceinline__ C wrapping_add(C x, C y) {
  return static_cast<C>(static_cast<U>(x) + static_cast<U>(y));
}
template <typename C, typename U = std::make_unsigned_t<C>>
__device__ __forceinline__ C wrapping_sub(C x, C y) {
  return static_cast<C>(static_cast<U>(x) - static_cast<U>(y));
}
template <typename C, typename U = std::make_unsigned_t<C>>
__device__ __forceinline__ C wrapping_mul(C x, C y) {
  // uint8 * uint8 would promote to int; go through a type at least as wide as unsigned int.
  using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
  return static_cast<C>(static_cast<W>(x) * static_cast<W>(y));
}

// out (T) = f(a (T)) / f(a, b) for a functor in T's compute type.
template <typename T, typename F>
void launch_same(const char* op, const Tensor& out, const Tensor& a, const F& f) {
  launch_elementwise(op, Types<T, T>{}, {out, a}, f);
}
template <typename T, typename F>
void launch_same(const char* op, const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  launch_elementwise(op, Types<T, T, T>{}, {out, a, b}, f);
}

}  // namespace kiln::cuda
