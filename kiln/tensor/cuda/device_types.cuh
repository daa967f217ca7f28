// kiln/tensor/cuda/device_types.cuh — kiln's element types as CUDA code stores them (backend-internal).
//
//   using D = device_t<Half>;   // __half; device_t<float> is float
#pragma once

#include <cuda_bf16.h>  // __nv_bfloat16
#include <cuda_fp16.h>  // __half

#include "kiln/tensor/half.h"  // Half, BFloat16

namespace kiln::cuda {

template <typename T>
struct DeviceStorage {
  using type = T;
};
template <>
struct DeviceStorage<Half> {
  using type = __half;
};
template <>
struct DeviceStorage<BFloat16> {
  using type = __nv_bfloat16;
};
template <typename T>
using device_t = typename DeviceStorage<T>::type;
static_assert(sizeof(__half) == sizeof(Half) && sizeof(__nv_bfloat16) == sizeof(BFloat16),
              "kiln's 16-bit floats must have the bits of CUDA's");

}  // namespace kiln::cuda
