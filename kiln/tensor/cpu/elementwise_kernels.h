// kiln/tensor/cpu/elementwise_kernels.h — running an Eigen array expression over strided tensors.
//
//   // out = exp(a) for any floating dtype (Half and BFloat16 compute in float):
//   unary_kernel<T, T>(out, a, [](auto x, auto o) { o = x.exp(); });
//   // out = a < b, Bool output:
//   binary_kernel<T, bool>(out, a, b, [](auto x, auto y, auto o) { o = x < y; });
//
// The functor receives Eigen::Map'ed 1-D arrays in the compute type (compute_t<T>: float for the 16-bit
// floats) and assigns its result to the output map, so Eigen vectorises the arithmetic. Runs whose
// operands are all of the compute type with unit strides are mapped in place, whole. Otherwise the run
// goes in blocks of kBlock elements, each operand on its own terms (BlockReader/BlockWriter): mapped in
// place when it can be, a buffer filled once for a broadcast operand, converted or gathered into a small
// stack buffer otherwise. The same functor instantiation serves every path.
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

// One input of a run, read kBlock elements at a time in the compute type C: mapped in place when the
// memory already holds C's with unit stride, one buffer filled once for a broadcast (stride 0) operand
// (the scalar of x * 2, a bias), converted or gathered into the buffer per block otherwise.
template <typename T, typename C>
class BlockReader {
 public:
  BlockReader(const char* base, int64_t stride, C* buffer, int64_t n)
      : base_(base), stride_(stride), buffer_(buffer), direct_(std::is_same_v<T, C> && stride == sizeof(T)) {
    if (stride == 0) load_block<T>(buffer_, base_, 0, std::min(kBlock, n));
  }
  const C* block(int64_t i, int64_t m) const {
    if (direct_) return reinterpret_cast<const C*>(base_ + i * stride_);
    if (stride_ != 0) load_block<T>(buffer_, base_ + i * stride_, stride_, m);
    return buffer_;
  }

 private:
  const char* base_;
  int64_t stride_;
  C* buffer_;
  bool direct_;
};

// The output of a run: written in place when it holds C's with unit stride, else through the buffer.
template <typename T, typename C>
class BlockWriter {
 public:
  BlockWriter(char* base, int64_t stride, C* buffer)
      : base_(base), stride_(stride), buffer_(buffer), direct_(std::is_same_v<T, C> && stride == sizeof(T)) {}
  C* block(int64_t i) const { return direct_ ? reinterpret_cast<C*>(base_ + i * stride_) : buffer_; }
  void commit(int64_t i, int64_t m) const {
    if (!direct_) store_block<T>(base_ + i * stride_, stride_, buffer_, m);
  }

 private:
  char* base_;
  int64_t stride_;
  C* buffer_;
  bool direct_;
};

// out (Out) = f(a (In)); f(ConstArrayMap<compute_t<In>>, ArrayMap<compute_t<Out>>).
template <typename In, typename Out, typename F>
void unary_kernel(const Tensor& out, const Tensor& a, const F& f) {
  using CI = compute_t<In>;
  using CO = compute_t<Out>;
  for_each_run<2>({out, a}, [&](char* const* p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<In, CI> && std::is_same_v<Out, CO>) {
      if (s[0] == sizeof(Out) && s[1] == sizeof(In)) {  // the whole run in one expression
        f(ConstArrayMap<CI>(reinterpret_cast<const CI*>(p[1]), n), ArrayMap<CO>(reinterpret_cast<CO*>(p[0]), n));
        return;
      }
    }
    alignas(64) CI x[kBlock];
    alignas(64) CO o[kBlock];
    const BlockReader<In, CI> rx(p[1], s[1], x, n);
    const BlockWriter<Out, CO> wo(p[0], s[0], o);
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      f(ConstArrayMap<CI>(rx.block(i, m), m), ArrayMap<CO>(wo.block(i), m));
      wo.commit(i, m);
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
      if (s[0] == sizeof(Out) && s[1] == sizeof(In) && s[2] == sizeof(In)) {  // the whole run in one expression
        f(ConstArrayMap<CI>(reinterpret_cast<const CI*>(p[1]), n),
          ConstArrayMap<CI>(reinterpret_cast<const CI*>(p[2]), n), ArrayMap<CO>(reinterpret_cast<CO*>(p[0]), n));
        return;
      }
    }
    alignas(64) CI x[kBlock];
    alignas(64) CI y[kBlock];
    alignas(64) CO o[kBlock];
    const BlockReader<In, CI> rx(p[1], s[1], x, n), ry(p[2], s[2], y, n);
    const BlockWriter<Out, CO> wo(p[0], s[0], o);
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      f(ConstArrayMap<CI>(rx.block(i, m), m), ConstArrayMap<CI>(ry.block(i, m), m), ArrayMap<CO>(wo.block(i), m));
      wo.commit(i, m);
    }
  });
}

}  // namespace kiln::cpu
