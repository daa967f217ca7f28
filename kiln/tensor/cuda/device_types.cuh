// kiln/tensor/cuda/device_types.cuh — kiln's element types as CUDA code stores them (backend-internal).
//
//   using D = device_t<Half>;   // __half; device_t<float> is float
#pragma once

#include <cuda_bf16.h>  // __nv_bfloat16
#include <cuda_fp16.h>  // __half

#include <type_traits>

#include "kiln/tensor/dispatch.h"  // compute_t, map_16bit_t
#include "kiln/tensor/half.h"      // Half, BFloat16

namespace kiln::cuda {

// compute_t's rule (dispatch.h) with CUDA's own 16-bit types.
template <typename T>
using device_t = map_16bit_t<T, __half, __nv_bfloat16>;
static_assert(sizeof(__half) == sizeof(Half) && sizeof(__nv_bfloat16) == sizeof(BFloat16),
              "kiln's 16-bit floats must have the bits of CUDA's");

// A stored element in the precision kernels compute in (16-bit floats in float), and back, rounded once
// to nearest even as half.h does. Every CUDA file converts through these two.
template <typename T>
__device__ __forceinline__ compute_t<T> to_compute(device_t<T> v) {
  if constexpr (std::is_same_v<T, Half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, BFloat16>) return __bfloat162float(v);
  else return v;
}

template <typename T>
__device__ __forceinline__ device_t<T> from_compute(compute_t<T> v) {
  if constexpr (std::is_same_v<T, Half>) return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, BFloat16>) return __float2bfloat16_rn(v);
  else return v;
}

}  // namespace kiln::cuda
