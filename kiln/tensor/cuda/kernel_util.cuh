// kiln/tensor/cuda/kernel_util.cuh — small device helpers shared by the random, reduction and softmax
// kernels (backend-internal): loading/storing kiln's element types in compute precision, NaN-aware
// max/min, strided offsets of a row-major index, and the launch stream.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/cuda/device_types.cuh"  // device_t, to_compute, from_compute
#include "kiln/tensor/dispatch.h"             // acc_t, compute_t, Half, BFloat16

namespace kiln::cuda::kdetail {

// Dims of a coalesced layout passed by value to kernels (kiln tensors have far fewer dims).
inline constexpr int kMaxDims = 16;

// *p in compute precision: kiln's 16-bit floats have the bits of CUDA's own types (device_types.cuh).
template <typename T>
__device__ __forceinline__ compute_t<T> load_compute(const T* p) {
  return to_compute<T>(*reinterpret_cast<const device_t<T>*>(p));
}

// The value of *p in the accumulation type Acc (bool -> 0/1).
template <typename Acc, typename T>
__device__ __forceinline__ Acc load_as(const T* p) {
  return static_cast<Acc>(load_compute(p));
}

// Stores v rounded once into T (as the CPU's from_acc: 16-bit floats go through float).
template <typename T, typename V>
__device__ __forceinline__ void store_as(T* p, V v) {
  if constexpr (std::is_same_v<T, bool>) {
    *p = v != V(0);
  } else {
    *reinterpret_cast<device_t<T>*>(p) = from_compute<T>(static_cast<compute_t<T>>(v));
  }
}

// max/min that let NaN win (as the CPU backend): once NaN, always NaN.
template <typename A>
__device__ __forceinline__ A nan_max(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) return ((b > a) | (b != b)) ? b : a;
  else return b > a ? b : a;
}
template <typename A>
__device__ __forceinline__ A nan_min(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) return ((b < a) | (b != b)) ? b : a;
  else return b < a ? b : a;
}

// Row-major index -> element offset over up to kMaxDims dims (innermost last).
struct Offsets {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];
  __host__ __device__ __forceinline__ int64_t operator()(int64_t i) const {
    if (ndim == 1) return i * strides[0];  // the common coalesced case: no division
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t q = i / sizes[d];
      off += (i - q * sizes[d]) * strides[d];
      i = q;
    }
    return off;
  }
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Streaming multiprocessors of the current device (grid sizing).
int sm_count();

}  // namespace kiln::cuda::kdetail
