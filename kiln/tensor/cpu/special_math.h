// kiln/tensor/cpu/special_math.h — exp, expm1, log, log2, log1p, tanh, erf and sigmoid over n contiguous
// elements: Eigen's vectorised functions inside the range where they are accurate, every edge (NaN, ±inf, ±0,
// subnormals, saturation) decided by kiln/tensor/special_values.h, as the CUDA kernels decide it.
//
//   cpu::exp_n(x, o, n);          // o[i] = exp(x[i]); o may be x (in place)
//   cpu::sigmoid_n(x, o, n);
//
// Each runs in blocks of kBlock elements: argument into a stack buffer (special::*_arg), the Eigen function
// over the buffer, then o[i] = special::*_finish(x[i], buffer[i]) in a plain loop (vector blends). The finish
// reads x[i] before it writes o[i], so o may alias x.
//
// Backend-internal: include it only from tensor/cpu/*.cpp.
#pragma once

#include <Eigen/Core>

#include <algorithm>  // std::min
#include <cstdint>
#include <type_traits>

#include <unsupported/Eigen/SpecialFunctions>  // ArrayBase::erf

#include "kiln/tensor/activation_constants.h"     // GELU's normal tail
#include "kiln/tensor/cpu/elementwise_kernels.h"  // kBlock, ArrayMap
#include "kiln/tensor/special_values.h"

namespace kiln::cpu {

// Eigen's rational approximation of tanh for float, vectorised whatever EIGEN_FAST_MATH says (off for kiln_tensor,
// which would make float tanh a scalar C library call, ~40x slower); the scalar tail of a run computes the same
// formula, so an element's value does not depend on where in the run it falls. Its edges are tanh_finish's.
struct RationalTanhFloat {
  float operator()(const float& x) const { return Eigen::internal::generic_fast_tanh_float(x); }
  template <typename Packet>
  Packet packetOp(const Packet& x) const {
    return Eigen::internal::generic_fast_tanh_float(x);
  }
};

}  // namespace kiln::cpu

template <>
struct Eigen::internal::functor_traits<kiln::cpu::RationalTanhFloat> {
  enum { Cost = 30, PacketAccess = packet_traits<float>::Vectorizable };
};

namespace kiln::cpu {

// o[i] = finish(x[i], lib(arg(x))[i]) over n elements, kBlock at a time.
template <typename C, typename Arg, typename Lib, typename Finish>
void with_edges(const C* x, C* o, int64_t n, const Arg& arg, const Lib& lib, const Finish& finish) {
  alignas(64) C t[kBlock];
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t m = std::min(kBlock, n - i);
    const C* xb = x + i;
    C* ob = o + i;
    for (int64_t j = 0; j < m; ++j) t[j] = arg(xb[j]);
    ArrayMap<C> tb(t, m);
    tb = lib(tb);
    for (int64_t j = 0; j < m; ++j) ob[j] = finish(xb[j], t[j]);
  }
}

template <typename C>
void exp_n(const C* x, C* o, int64_t n) {
  with_edges(
      x, o, n, [](C v) { return special::exp_arg(v); }, [](const auto& t) { return t.exp(); },
      [](C v, C r) { return special::exp_finish(v, r); });
}

template <typename C>
void expm1_n(const C* x, C* o, int64_t n) {
  with_edges(
      x, o, n, [](C v) { return special::expm1_arg(v); }, [](const auto& t) { return t.expm1(); },
      [](C v, C r) { return special::expm1_finish(v, r); });
}

template <typename C>
void log_n(const C* x, C* o, int64_t n) {
  with_edges(
      x, o, n, [](C v) { return special::log_arg(v); }, [](const auto& t) { return t.log(); },
      [](C v, C r) { return special::log_finish(v, r); });
}

template <typename C>
void log2_n(const C* x, C* o, int64_t n) {
  with_edges(
      x, o, n, [](C v) { return special::log_arg(v); }, [](const auto& t) { return t.log2(); },
      [](C v, C r) { return special::log2_finish(v, r); });
}

template <typename C>
void log1p_n(const C* x, C* o, int64_t n) {
  with_edges(
      x, o, n, [](C v) { return special::log1p_arg(v); }, [](const auto& t) { return t.log1p(); },
      [](C v, C r) { return special::log1p_finish(v, r); });
}

template <typename C>
void tanh_n(const C* x, C* o, int64_t n) {
  with_edges(
      x, o, n, [](C v) { return v; },
      [](const auto& t) {
        if constexpr (std::is_same_v<C, float>) return t.unaryExpr(RationalTanhFloat());
        else return t.tanh();  // double: the C library's
      },
      [](C v, C r) { return special::tanh_finish(v, r); });
}

// GELU's normal CDF in float from its tail (activation_constants.h, as the GPU computes it): cdf[i] = Phi(x[i]), from
// Phi(-|x|) = exp(-x^2/2) t P(t), t = 1 / (1 + |x| kTailScale); and e[i] = exp(-x[i]^2 / 2) (exp_n's edges: 0 for
// |x| beyond about 14.5 and for ±inf, subnormal below that). NaN for a NaN x. n <= kBlock; cdf and e must not alias x.
inline void normal_cdf_n(const float* x, float* cdf, float* e, int64_t n) {
  using activation::kTailScale;
  const Eigen::Map<const Eigen::ArrayXf> xv(x, n);
  Eigen::Map<Eigen::ArrayXf> cv(cdf, n), ev(e, n);
  ev = xv.square() * -0.5f;
  exp_n(e, e, n);
  cv = (xv.abs() * kTailScale + 1.0f).inverse();                                     // t
  using Block = Eigen::Array<float, Eigen::Dynamic, 1, Eigen::ColMajor, kBlock, 1>;  // on the stack
  cv = cv * activation::tail_polynomial(Block(cv)) * ev;                             // Phi(-|x|)
  cv = (xv >= 0.0f).select(1.0f - cv, cv);                                           // NaN x: Phi(-|x|) is NaN
}

template <typename C>
void erf_n(const C* x, C* o, int64_t n) {
  with_edges(
      x, o, n, [](C v) { return v; }, [](const auto& t) { return t.erf(); },
      [](C v, C r) { return special::erf_finish(v, r); });
}

// sigmoid(x) from e = exp(-|x|) (exp_n's rules): exact at ±inf, subnormal where the true value is.
template <typename C>
void sigmoid_n(const C* x, C* o, int64_t n) {
  with_edges(
      x, o, n, [](C v) { return special::exp_arg(special::sigmoid_arg(v)); }, [](const auto& t) { return t.exp(); },
      [](C v, C r) { return special::sigmoid_from_exp(v, special::exp_finish(special::sigmoid_arg(v), r)); });
}

}  // namespace kiln::cpu
