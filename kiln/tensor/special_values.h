// kiln/tensor/special_values.h — what the transcendental elementwise functions give at their edges (NaN, ±inf,
// ±0, subnormal inputs, and beyond where they saturate), written once for the CPU and CUDA kernels
// (backend-internal). The table of values and the reasons are in kiln/tensor/README.md, "Special values".
//
//   // CPU (cpu/special_math.h): Eigen's vectorised exp runs on exp_arg(x), then every element is finished here:
//   o[i] = special::exp_finish(x[i], e[i]);                       // e = exp(exp_arg(x)) from the vector library
//   // CUDA: the same two steps around the device library's function:
//   return special::exp_finish(x, m_exp(special::exp_arg(x)));
//
// A vectorised math library is only trusted inside the range where every implementation of it is accurate: the
// `*_arg` functions move an argument into that range (exactly, by a shift that `*_finish` undoes), and the
// `*_finish` functions decide every edge case themselves, by comparisons on x. So a result at an edge never
// depends on the library's own edge behaviour, which differs between Eigen's SSE, AVX2 and AVX-512 paths and its
// scalar tail (Eigen 3.4's float exp(-inf) is 0 with AVX-512, 2.9e-39 with SSE2, 1.2e-39 on an AVX2 EPYC).
//
// Plain comparisons and selects only: on the CPU the finishing loop compiles to vector blends.
#pragma once

#include <limits>

#ifndef KILN_HOST_DEVICE
#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KILN_HOST_DEVICE inline
#endif
#endif

namespace kiln::special {

// Where each function saturates or leaves the range its library is trusted in, per compute type (float serves
// float16 and bfloat16 too: they compute in float). Every threshold is where the exact result, rounded to the
// type, already equals the value returned beyond it, so the rule only replaces what a correctly rounded
// function would give anyway.
template <typename C>
struct Limits;

// The thresholds for float (and the 16-bit types, which compute in float).
template <>
struct Limits<float> {
  static constexpr float kExpOverflow = 88.72283172607422f;      // the largest x with exp(x) <= FLT_MAX
  static constexpr float kExpZero = -104.0f;                     // exp(x) < 2^-150 rounds to +0 below ~-103.97
  static constexpr float kExpSubnormal = -87.0f;                 // below: exp(x) is near or under FLT_MIN ...
  static constexpr float kExpShift = 32.0f;                      // ... so it is exp(x + 32) e^-32 (x + 32 exact)
  static constexpr float kExpUnshift = 1.2664165549094176e-14f;  // e^-32
  static constexpr float kExpm1MinusOne = -17.5f;                // e^x < 2^-25: expm1(x) rounds to -1
  static constexpr float kMinNormal = 1.17549435e-38f;           // FLT_MIN: below, log(x) = log(x 2^24) - 24 ln 2
  static constexpr float kLogScale = 16777216.0f;                // 2^24
  static constexpr float kLog2Unscale = 24.0f;  // log2(2^24): what log2 subtracts after scaling by kLogScale
  static constexpr float kLogUnscale = 16.635532333438686f;  // 24 ln 2
  static constexpr float kTiny = 1.4901161e-8f;       // 2^-26: f(x) = x (tanh, expm1, log1p) or 2x/sqrt(pi) (erf)
  static constexpr float kTanhOne = 9.5f;             // 1 - tanh(x) < 2^-25: tanh(x) rounds to 1
  static constexpr float kErfOne = 4.0f;              // erfc(x) < 2^-25: erf(x) rounds to 1
  static constexpr float kGeluTanhGradLimit = 10.0f;  // gelu_tanh'(x) is within 1e-35 of its limit
};

// The thresholds for double, each with the meaning of Limits<float>'s of the same name.
template <>
struct Limits<double> {
  static constexpr double kExpOverflow = 709.782712893384;       // the largest x with exp(x) <= DBL_MAX
  static constexpr double kExpZero = -746.0;                     // exp(x) < 2^-1075 rounds to +0 below ~-745.13
  static constexpr double kExpSubnormal = -708.0;                // below: exp(x) is near or under DBL_MIN ...
  static constexpr double kExpShift = 64.0;                      // ... so it is exp(x + 64) e^-64
  static constexpr double kExpUnshift = 1.603810890548638e-28;   // e^-64
  static constexpr double kExpm1MinusOne = -38.0;                // e^x < 2^-54
  static constexpr double kMinNormal = 2.2250738585072014e-308;  // DBL_MIN
  static constexpr double kLogScale = 18014398509481984.0;       // 2^54
  static constexpr double kLog2Unscale = 54.0;                   // log2(2^54)
  static constexpr double kLogUnscale = 37.42994775023705;       // 54 ln 2
  static constexpr double kTiny = 2.7755575615628914e-17;        // 2^-55
  static constexpr double kTanhOne = 19.5;                       // tanh(x) rounds to 1 from here
  static constexpr double kErfOne = 6.0;                         // erf(x) rounds to 1 from here
  static constexpr double kGeluTanhGradLimit = 20.0;             // gelu_tanh'(x) rounds to its limit from here
};

inline constexpr double kTwoOverSqrtPi = 1.12837916709551257390;  // erf'(0)

template <typename C>
KILN_HOST_DEVICE C inf() {
  return std::numeric_limits<C>::infinity();
}
template <typename C>
KILN_HOST_DEVICE C nan() {
  return std::numeric_limits<C>::quiet_NaN();
}
template <typename C>
KILN_HOST_DEVICE bool is_nan(C x) {
  return x != x;
}
template <typename C>
KILN_HOST_DEVICE C magnitude(C x) {
  return x < C(0) ? -x : x;
}

// ---- exp: NaN; +inf above kExpOverflow; +0 below kExpZero (-inf included); subnormal results computed as
// exp(x + shift) times a constant, so the library only ever produces normal numbers ----
template <typename C>
KILN_HOST_DEVICE C exp_arg(C x) {
  using L = Limits<C>;
  if (x < L::kExpSubnormal) return x < L::kExpZero ? L::kExpSubnormal : x + L::kExpShift;
  return x > L::kExpOverflow ? L::kExpOverflow : x;  // NaN passes through
}
template <typename C>
KILN_HOST_DEVICE C exp_finish(C x, C e) {
  using L = Limits<C>;
  if (is_nan(x)) return x;
  if (x > L::kExpOverflow) return inf<C>();
  if (x < L::kExpZero) return C(0);
  return x < L::kExpSubnormal ? e * L::kExpUnshift : e;
}

// ---- expm1: NaN; +inf above kExpOverflow; -1 below kExpm1MinusOne (-inf included); x itself for |x| < kTiny
// (±0 keep their sign, subnormals stay exact) ----
template <typename C>
KILN_HOST_DEVICE C expm1_arg(C x) {
  using L = Limits<C>;
  return x < L::kExpm1MinusOne ? L::kExpm1MinusOne : x > L::kExpOverflow ? L::kExpOverflow : x;
}
template <typename C>
KILN_HOST_DEVICE C expm1_finish(C x, C r) {
  using L = Limits<C>;
  if (is_nan(x)) return x;
  if (x > L::kExpOverflow) return inf<C>();
  if (x < L::kExpm1MinusOne) return C(-1);
  return magnitude(x) < L::kTiny ? x : r;
}

// ---- log and log2: NaN for NaN and x < 0; -inf at ±0; +inf at +inf; a positive subnormal x is scaled by
// 2^24 (2^54 for double) first, so the result is exact where Eigen's log clamps x to the smallest normal ----
template <typename C>
KILN_HOST_DEVICE C log_arg(C x) {
  using L = Limits<C>;
  return x > C(0) && x < L::kMinNormal ? x * L::kLogScale : x;
}
template <typename C>
KILN_HOST_DEVICE C log_finish_common(C x, C r, C unscale) {
  using L = Limits<C>;
  if (is_nan(x)) return x;
  if (x < C(0)) return nan<C>();
  if (x == C(0)) return -inf<C>();
  if (x == inf<C>()) return x;
  return x < L::kMinNormal ? r - unscale : r;
}
template <typename C>
KILN_HOST_DEVICE C log_finish(C x, C r) {
  return log_finish_common(x, r, Limits<C>::kLogUnscale);
}
template <typename C>
KILN_HOST_DEVICE C log2_finish(C x, C r) {
  return log_finish_common(x, r, Limits<C>::kLog2Unscale);
}

// ---- log1p: NaN for NaN and x < -1; -inf at -1; +inf at +inf; x itself for |x| < kTiny ----
template <typename C>
KILN_HOST_DEVICE C log1p_arg(C x) {
  return x < C(-1) ? C(0) : x == inf<C>() ? C(0) : x;  // keep the library on its finite domain
}
template <typename C>
KILN_HOST_DEVICE C log1p_finish(C x, C r) {
  using L = Limits<C>;
  if (is_nan(x)) return x;
  if (x < C(-1)) return nan<C>();
  if (x == C(-1)) return -inf<C>();
  if (x == inf<C>()) return x;
  return magnitude(x) < L::kTiny ? x : r;
}

// ---- the odd functions that saturate at ±1 (tanh, erf): NaN; ±1 for |x| >= one (±inf included); `tiny` (their
// first-order term) for |x| < kTiny; else r ----
template <typename C>
KILN_HOST_DEVICE C saturating_odd_finish(C x, C r, C one, C tiny) {
  if (is_nan(x)) return x;
  const C m = magnitude(x);
  if (m >= one) return x < C(0) ? C(-1) : C(1);
  return m < Limits<C>::kTiny ? tiny : r;
}

// ---- tanh: ±1 for |x| >= kTanhOne; x itself for |x| < kTiny ----
template <typename C>
KILN_HOST_DEVICE C tanh_finish(C x, C r) {
  return saturating_odd_finish(x, r, Limits<C>::kTanhOne, x);
}

// ---- erf: ±1 for |x| >= kErfOne; 2x/sqrt(pi) for |x| < kTiny ----
template <typename C>
KILN_HOST_DEVICE C erf_finish(C x, C r) {
  return saturating_odd_finish(x, r, Limits<C>::kErfOne, C(kTwoOverSqrtPi) * x);
}

// ---- sigmoid, from e = exp(-|x|) (exp's rules above): e / (1 + e) for x < 0, 1 / (1 + e) otherwise. Exact 0 and
// 1 at -inf and +inf, subnormal (not 0) results down to x ~ -103 in float, NaN for NaN (e is NaN) ----
template <typename C>
KILN_HOST_DEVICE C sigmoid_arg(C x) {
  return -magnitude(x);
}
template <typename C>
KILN_HOST_DEVICE C sigmoid_from_exp(C x, C e) {
  return x < C(0) ? e / (C(1) + e) : C(1) / (C(1) + e);
}

// ---- the activations: their formulas are x times a factor that tends to 0 at -inf, which would give
// -inf * 0 = NaN there; the limit is 0 (approached from below: -0) ----
template <typename C>
KILN_HOST_DEVICE C activation_finish(C x, C y) {  // gelu (both forms), silu
  return x == -inf<C>() ? C(-0.0) : y;
}

// ---- the activations' derivatives (f' alone; the kernels multiply by the incoming gradient afterwards): their
// limits, 1 at +inf and 0 at -inf, where the formulas give inf * 0 = NaN ----
template <typename C>
KILN_HOST_DEVICE C activation_grad_finish(C x, C d) {  // gelu', silu'
  return x == inf<C>() ? C(1) : x == -inf<C>() ? C(0) : d;
}
// gelu_tanh'(x) = (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2): once t = tanh(u) is ±1, (1 - t^2) = 0 multiplies
// x (1 + 3 c x^2), which overflows to inf for |x| > ~5e18 (float): 0 * inf = NaN for a finite x. Beyond
// kGeluTanhGradLimit the derivative is its limit.
template <typename C>
KILN_HOST_DEVICE C gelu_tanh_grad_finish(C x, C d) {
  using L = Limits<C>;
  return x >= L::kGeluTanhGradLimit ? C(1) : x <= -L::kGeluTanhGradLimit ? C(0) : d;
}

}  // namespace kiln::special
