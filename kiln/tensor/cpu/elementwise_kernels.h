// kiln/tensor/cpu/elementwise_kernels.h — running an Eigen array expression over strided tensors.
//
//   // out = exp(a) for any floating dtype (Half and BFloat16 compute in float):
//   unary_kernel<T, T>(out, a, [](auto x, auto o) { o = x.exp(); });
//   // out = a < b, Bool output:
//   binary_kernel<T, bool>(out, a, b, [](auto x, auto y, auto o) { o = x < y; });
//
// The functor receives Eigen::Map'ed 1-D arrays in the compute type (compute_t<T>: float for the 16-bit
// floats) and assigns its result to the output map, so Eigen vectorises the arithmetic. Runs whose
// operands are already of the compute type with unit strides are mapped in place; every other run
// (16-bit floats, strided or broadcast operands) goes through small stack buffers of kBlock elements:
// load and convert, compute, convert and store. The same functor instantiation serves both paths.
//
// Backend-internal: include it only from tensor/cpu/*.cpp.
#pragma once

#include <Eigen/Core>  // Eigen::Array, Eigen::Map and the vectorised coefficient-wise functions

#include <algorithm>  // std::min
#include <cstdint>
#include <type_traits>

#include "kiln/tensor/cpu/convert.h"  // convert<To>(From)
#include "kiln/tensor/cpu/loops.h"    // for_each_run
#include "kiln/tensor/dispatch.h"     // compute_t

namespace kiln::cpu {

// Elements per buffered block: small enough that the buffers stay in L1, long enough for SIMD loops.
inline constexpr int64_t kBlock = 512;

template <typename C>
using ArrayMap = Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>>;
template <typename C>
using ConstArrayMap = Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>>;

// buf[i] = element i of a run of T's at src with byte stride `stride` (0 for a broadcast operand).
template <typename T, typename C>
inline void load_block(C* buf, const char* src, int64_t stride, int64_t n) {
  if (stride == sizeof(T)) {
    const T* s = reinterpret_cast<const T*>(src);
    for (int64_t i = 0; i < n; ++i) buf[i] = convert<C>(s[i]);
  } else if (stride == 0) {
    const C v = convert<C>(*reinterpret_cast<const T*>(src));
    for (int64_t i = 0; i < n; ++i) buf[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = convert<C>(*reinterpret_cast<const T*>(src + i * stride));
  }
}

template <typename T, typename C>
inline void store_block(char* dst, int64_t stride, const C* buf, int64_t n) {
  if (stride == sizeof(T)) {
    T* d = reinterpret_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = convert<T>(buf[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(dst + i * stride) = convert<T>(buf[i]);
  }
}

// out (Out) = f(a (In)); f(ConstArrayMap<compute_t<In>>, ArrayMap<compute_t<Out>>).
template <typename In, typename Out, typename F>
void unary_kernel(const Tensor& out, const Tensor& a, const F& f) {
  using CI = compute_t<In>;
  using CO = compute_t<Out>;
  for_each_run<2>({out, a}, [&](char* const* p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<In, CI> && std::is_same_v<Out, CO>) {
      if (s[0] == sizeof(Out) && s[1] == sizeof(In)) {
        f(ConstArrayMap<CI>(reinterpret_cast<const CI*>(p[1]), n), ArrayMap<CO>(reinterpret_cast<CO*>(p[0]), n));
        return;
      }
    }
    alignas(64) CI x[kBlock];
    alignas(64) CO o[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      load_block<In>(x, p[1] + i * s[1], s[1], m);
      f(ConstArrayMap<CI>(x, m), ArrayMap<CO>(o, m));
      store_block<Out>(p[0] + i * s[0], s[0], o, m);
    }
  });
}

// out (Out) = f(a (In), b (In)); f(ConstArrayMap<CI>, ConstArrayMap<CI>, ArrayMap<CO>).
template <typename In, typename Out, typename F>
void binary_kernel(const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  using CI = compute_t<In>;
  using CO = compute_t<Out>;
  for_each_run<3>({out, a, b}, [&](char* const* p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<In, CI> && std::is_same_v<Out, CO>) {
      if (s[0] == sizeof(Out) && s[1] == sizeof(In) && s[2] == sizeof(In)) {
        f(ConstArrayMap<CI>(reinterpret_cast<const CI*>(p[1]), n),
          ConstArrayMap<CI>(reinterpret_cast<const CI*>(p[2]), n), ArrayMap<CO>(reinterpret_cast<CO*>(p[0]), n));
        return;
      }
    }
    alignas(64) CI x[kBlock];
    alignas(64) CI y[kBlock];
    alignas(64) CO o[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      load_block<In>(x, p[1] + i * s[1], s[1], m);
      load_block<In>(y, p[2] + i * s[2], s[2], m);
      f(ConstArrayMap<CI>(x, m), ConstArrayMap<CI>(y, m), ArrayMap<CO>(o, m));
      store_block<Out>(p[0] + i * s[0], s[0], o, m);
    }
  });
}

}  // namespace kiln::cpu
