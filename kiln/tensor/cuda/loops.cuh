// kiln/tensor/cuda/loops.cuh — launching elementwise kernels over strided tensors (backend-internal).
//
//   // out = a + b for float32 (a and b already have out's shape; broadcast inputs carry stride 0):
//   struct AddF { __device__ float operator()(float x, float y) const { return x + y; } };
//   launch_elementwise("add", Types<float, float, float>{}, {out, a, b}, AddF{});
//
// Types<Out, In...> names the kiln storage types of the output and the inputs; the functor receives and
// returns their compute types (compute_t: float for Half/BFloat16, loaded from and stored as __half /
// __nv_bfloat16, which have the same bits). Every launch goes on stream_for(out).
//
// Two kernels:
//  - contiguous: every operand dense in the same order and aligned (an input may instead be one
//    broadcast element): each thread moves 16 bytes of the widest operand per access (kVec elements;
//    narrower operands move kVec * their size), the DESIGN's rule for memory-bound kernels;
//  - strided: LoopGeometry (loop_geometry.h) orders and coalesces the dims; an offset calculator turns a
//    flat index into byte offsets for up to 8 coalesced dims, in 32-bit arithmetic when the element
//    count and every byte offset fit, else 64-bit. Each thread handles 4 elements, a block's worth apart.
#pragma once

#include <cuda_bf16.h>  // __nv_bfloat16, __float2bfloat16_rn
#include <cuda_fp16.h>  // __half, __float2half_rn
#include <cuda_runtime.h>

#include <algorithm>  // std::max
#include <array>
#include <cstdint>
#include <cuda/std/tuple>  // a device-side tuple for the vector registers of each input
#include <limits>
#include <type_traits>
#include <utility>  // std::index_sequence

#include "kiln/tensor/cuda/cuda_backend.h"    // stream_for
#include "kiln/tensor/cuda/cuda_check.h"      // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/cuda/device_types.cuh"  // device_t
#include "kiln/tensor/dispatch.h"             // compute_t
#include "kiln/tensor/loop_geometry.h"        // LoopGeometry

namespace kiln::cuda {

inline constexpr int kMaxDims = 8;         // coalesced dims an offset calculator handles
inline constexpr int kThreads = 256;       // threads per block
inline constexpr int kElemsPerThread = 4;  // strided kernel
inline constexpr int kVecPerThread = 2;    // contiguous kernel: 16-byte accesses per operand per thread

// ---- storage and compute types ----
// device_t<T> (device_types.cuh): the storage type of a kiln element in CUDA code.

// to_compute / from_compute (device_types.cuh) convert between stored and compute precision.

template <typename Out, typename... In>
struct Types {};

// ---- offsets ----
template <int N>
struct Pointers {
  char* p[N];
};

// Flat index -> byte offset of each of N operands, dims innermost first.
template <int N, typename Index>
struct OffsetCalc {
  int ndim;
  Index sizes[kMaxDims];
  Index strides[kMaxDims][N];  // bytes

  __device__ __forceinline__ void get(Index linear, Index (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      Index r;
      if (d == ndim - 1) {  // the outermost dim needs no division
        r = linear;
      } else {
        const Index q = linear / sizes[d];
        r = linear - q * sizes[d];
        linear = q;
      }
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * strides[d][k];
    }
  }
};

// ---- per-element and per-vector work ----
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// One aligned access of sizeof(T) * V bytes (<= 16), as the widest integer load that size allows.
template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const char* p) {
  Vec<T, V> r;
  constexpr size_t kBytes = sizeof(T) * V;
  if constexpr (kBytes == 16) *reinterpret_cast<uint4*>(&r) = *reinterpret_cast<const uint4*>(p);
  else if constexpr (kBytes == 8) *reinterpret_cast<uint2*>(&r) = *reinterpret_cast<const uint2*>(p);
  else if constexpr (kBytes == 4) *reinterpret_cast<uint32_t*>(&r) = *reinterpret_cast<const uint32_t*>(p);
  else if constexpr (kBytes == 2) *reinterpret_cast<uint16_t*>(&r) = *reinterpret_cast<const uint16_t*>(p);
  else r = *reinterpret_cast<const Vec<T, V>*>(p);
  return r;
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(char* p, const Vec<T, V>& r) {
  constexpr size_t kBytes = sizeof(T) * V;
  if constexpr (kBytes == 16) *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&r);
  else if constexpr (kBytes == 8) *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(&r);
  else if constexpr (kBytes == 4) *reinterpret_cast<uint32_t*>(p) = *reinterpret_cast<const uint32_t*>(&r);
  else if constexpr (kBytes == 2) *reinterpret_cast<uint16_t*>(p) = *reinterpret_cast<const uint16_t*>(&r);
  else *reinterpret_cast<Vec<T, V>*>(p) = r;
}

// Vector v of a dense operand, or its one element repeated when it is a broadcast scalar (stride 0 over
// the whole range: x * 2, a bias over a flat tensor).
template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_or_splat(const char* base, int64_t v, bool splat) {
  if (splat) {
    Vec<T, V> r;
    const T x = *reinterpret_cast<const T*>(base);
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = x;
    return r;
  }
  return load_vec<T, V>(base + v * static_cast<int64_t>(V * sizeof(T)));
}

template <typename Out, typename... In>
struct Elementwise {
  static constexpr int N = 1 + static_cast<int>(sizeof...(In));
  static constexpr size_t kMaxSize = std::max({sizeof(Out), sizeof(In)...});
  static constexpr int kVec = static_cast<int>(16 / kMaxSize);  // elements per 16-byte access of the widest
  using Seq = std::index_sequence_for<In...>;

  template <typename F, typename Index, size_t... I>
  __device__ __forceinline__ static void one(const F& f, char* const* p, const Index (&off)[N],
                                             std::index_sequence<I...>) {
    *reinterpret_cast<device_t<Out>*>(p[0] + off[0]) =
        from_compute<Out>(f(to_compute<In>(*reinterpret_cast<const device_t<In>*>(p[I + 1] + off[I + 1]))...));
  }

  // Vector v (elements [v * kVec, (v + 1) * kVec)) of contiguous operands; bit k of `splat` marks input
  // operand k as a broadcast scalar.
  template <typename F, size_t... I>
  __device__ __forceinline__ static void vec(const F& f, char* const* p, int64_t v, unsigned splat,
                                             std::index_sequence<I...>) {
    ::cuda::std::tuple<Vec<device_t<In>, kVec>...> in{
        load_or_splat<device_t<In>, kVec>(p[I + 1], v, ((splat >> (I + 1)) & 1u) != 0)...};
    Vec<device_t<Out>, kVec> out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) out.v[j] = from_compute<Out>(f(to_compute<In>(::cuda::std::get<I>(in).v[j])...));
    store_vec<device_t<Out>, kVec>(p[0] + v * static_cast<int64_t>(kVec * sizeof(Out)), out);
  }

  // Element i of contiguous operands.
  template <typename F, size_t... I>
  __device__ __forceinline__ static void dense(const F& f, char* const* p, int64_t i, unsigned splat,
                                               std::index_sequence<I...>) {
    reinterpret_cast<device_t<Out>*>(p[0])[i] = from_compute<Out>(
        f(to_compute<In>(reinterpret_cast<const device_t<In>*>(p[I + 1])[((splat >> (I + 1)) & 1u) ? 0 : i])...));
  }
};

// ---- kernels ----
template <typename E, typename F, typename Index>
__global__ void __launch_bounds__(kThreads)
    strided_kernel(F f, OffsetCalc<E::N, Index> calc, Pointers<E::N> ptrs, Index numel) {
  const Index base = static_cast<Index>(blockIdx.x) * (kThreads * kElemsPerThread) + threadIdx.x;
#pragma unroll
  for (int j = 0; j < kElemsPerThread; ++j) {
    const Index i = base + j * kThreads;
    if (i < numel) {
      Index off[E::N];
      calc.get(i, off);
      E::one(f, ptrs.p, off, typename E::Seq{});
    }
  }
}

// numel = nvec * kVec + tail; the first `tail` threads of the grid also do one leftover element each.
template <typename E, typename F>
__global__ void __launch_bounds__(kThreads)
    contiguous_kernel(F f, Pointers<E::N> ptrs, unsigned splat, int64_t nvec, int64_t tail) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * (kThreads * kVecPerThread) + threadIdx.x;
#pragma unroll
  for (int j = 0; j < kVecPerThread; ++j) {
    const int64_t v = base + j * kThreads;
    if (v < nvec) E::vec(f, ptrs.p, v, splat, typename E::Seq{});
  }
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t < tail) E::dense(f, ptrs.p, nvec * E::kVec + t, splat, typename E::Seq{});
}

// ---- launcher ----
namespace detail {

template <int N, typename Index>
OffsetCalc<N, Index> make_offset_calc(const LoopGeometry<N>& g) {
  OffsetCalc<N, Index> calc{};
  calc.ndim = g.ndim();
  for (int d = 0; d < g.ndim(); ++d) {
    calc.sizes[d] = static_cast<Index>(g.sizes[d]);
    for (int k = 0; k < N; ++k) calc.strides[d][k] = static_cast<Index>(g.strides[k][d]);
  }
  return calc;
}

// Whether every flat index and every byte offset of the geometry fits in 32 bits (signed, for margin).
template <size_t N>
bool fits_32bit(const LoopGeometry<N>& g, const std::array<Tensor, N>& ops) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (g.numel > kMax) return false;
  for (size_t k = 0; k < N; ++k) {
    int64_t last = static_cast<int64_t>(ops[k].element_size());
    for (int d = 0; d < g.ndim(); ++d) last += g.strides[k][d] * (g.sizes[d] - 1);
    if (last > kMax) return false;
  }
  return true;
}

[[noreturn]] inline void throw_too_many_dims(const char* op, const Tensor& out, int ndim) {
  throw Error(kiln::detail::str_cat(op, ": the CUDA elementwise kernels handle at most ", kMaxDims,
                                    " dims after merging contiguous ones, got ", ndim, " (output shape ", out.shape(),
                                    "); make the operands contiguous first"));
}

}  // namespace detail

// out = f(in...) elementwise, where ops = {out, in...} all have out's shape (inputs may broadcast with stride 0).
template <typename Out, typename... In, typename F>
void launch_elementwise(const char* op, Types<Out, In...>, const std::array<Tensor, 1 + sizeof...(In)>& ops,
                        const F& f) {
  using E = Elementwise<Out, In...>;
  constexpr int N = E::N;
  const int64_t numel = ops[0].numel();
  if (numel == 0) return;
  cudaStream_t stream = stream_for(ops[0]);
  Pointers<N> ptrs;
  for (int k = 0; k < N; ++k) ptrs.p[k] = static_cast<char*>(ops[k].data_ptr());

  const LoopGeometry<N> g(ops);
  // The contiguous path: one coalesced dim with every operand dense (or an input broadcast from one
  // element), and each dense base aligned to its access.
  constexpr size_t kSizes[N] = {sizeof(Out), sizeof(In)...};
  bool dense = g.ndim() == 1;
  unsigned splat = 0;
  for (int k = 0; k < N && dense; ++k) {
    if (k > 0 && g.strides[k][0] == 0) {
      splat |= 1u << k;
      continue;
    }
    dense = g.strides[k][0] == static_cast<int64_t>(kSizes[k]) &&
            reinterpret_cast<uintptr_t>(ptrs.p[k]) % (kSizes[k] * E::kVec) == 0;
  }
  if (numel == 1) splat = 0;  // one element: index 0 of every operand, whatever the strides
  if (dense || numel == 1) {
    const int64_t nvec = numel / E::kVec, tail = numel % E::kVec;
    const int64_t per_block = static_cast<int64_t>(kThreads) * kVecPerThread;
    const int64_t blocks = std::max<int64_t>(1, (nvec + per_block - 1) / per_block);
    contiguous_kernel<E><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(f, ptrs, splat, nvec, tail);
    KILN_CUDA_CHECK_LAUNCH(op);
    return;
  }
  if (g.ndim() > kMaxDims) detail::throw_too_many_dims(op, ops[0], g.ndim());
  const int64_t per_block = static_cast<int64_t>(kThreads) * kElemsPerThread;
  const auto blocks = static_cast<unsigned>((numel + per_block - 1) / per_block);
  if (detail::fits_32bit(g, ops)) {
    strided_kernel<E><<<blocks, kThreads, 0, stream>>>(f, detail::make_offset_calc<N, uint32_t>(g), ptrs,
                                                       static_cast<uint32_t>(numel));
  } else {
    strided_kernel<E><<<blocks, kThreads, 0, stream>>>(f, detail::make_offset_calc<N, int64_t>(g), ptrs, numel);
  }
  KILN_CUDA_CHECK_LAUNCH(op);
}

}  // namespace kiln::cuda
