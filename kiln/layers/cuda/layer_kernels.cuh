// kiln/layers/cuda/layer_kernels.cuh — device helpers the layers' own kernels share (internal to kiln/layers/cuda):
// 16-byte vectors of kiln's element types, the vector width a set of pointers allows, and the grid of a
// grid-stride elementwise loop.
//
//   const int v = vector_width<T>({x.data_ptr(), y.data_ptr()}, c);   // 16 / sizeof(T) when aligned and c % v == 0
//   Vec<T, V> a = load_vec<T, V>(x + i);                               // device_t<T> elements
//   float f[4]; load_pack<4>(x + i, f); store_pack<4>(y + i, f);      // 4 elements widened, then rounded back
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "kiln/tensor/cuda/kernel_util.cuh"  // device_t, to_compute, from_compute, sm_count, ceil_div

namespace kiln::nn::cuda_impl {

using cuda::device_t;

// The elements of kiln type T in one 16-byte vector (1 for types of 16 bytes or more).
template <typename T>
inline constexpr int kVecWidth = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));

template <typename T, int V>
struct alignas(sizeof(device_t<T>) * V) Vec {
  device_t<T> v[V];
};

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const device_t<T>* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(device_t<T>* p, const Vec<T, V>& v) {
  *reinterpret_cast<Vec<T, V>*>(p) = v;
}

// p[0 .. V) read in one access (a Vec: p is aligned to it) and widened to A through T's compute type.
template <int V, typename T, typename A>
__device__ __forceinline__ void load_pack(const T* p, A* out) {
  const Vec<T, V> q = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = static_cast<A>(cuda::to_compute<T>(q.v[k]));
}

// p[0 .. V) = v[0 .. V), each rounded once into T, written in one access.
template <int V, typename T, typename A>
__device__ __forceinline__ void store_pack(T* p, const A* v) {
  Vec<T, V> q;
#pragma unroll
  for (int k = 0; k < V; ++k) q.v[k] = cuda::from_compute<T>(static_cast<compute_t<T>>(v[k]));
  *reinterpret_cast<Vec<T, V>*>(p) = q;
}

// The widest vector (16 bytes) every pointer's alignment allows, when `multiple` (the run length the vector
// must not cross) divides by it; 1 otherwise. Null pointers are ignored.
template <typename T>
int vector_width(std::initializer_list<const void*> ptrs, int64_t multiple) {
  constexpr int kWide = kVecWidth<T>;
  if (multiple % kWide != 0) return 1;
  for (const void* p : ptrs) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  }
  return kWide;
}

// Blocks of `threads` for a grid-stride loop over n items: enough to fill the GPU a few times over.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t want = std::max<int64_t>(1, cuda::kdetail::ceil_div(n, threads));
  return static_cast<unsigned>(std::min<int64_t>(want, int64_t{cuda::kdetail::sm_count()} * 16));
}

}  // namespace kiln::nn::cuda_impl
