// kiln/tensor/cuda/convert.cuh — element conversion on the GPU, with cpu/convert.h's rules (backend-internal).
//
//   float f = convert_value<float, int64_t>(x);   // To/From are kiln storage types; values are in their
//   int32_t i = convert_value<int32_t, Half>(h);  // compute types (float for Half/BFloat16)
//
// Floats truncate toward zero into integers; into uint8 they go through int64 and wrap (-1 -> 255), as
// PyTorch; anything nonzero (NaN included) becomes true. Half/BFloat16 travel as float, so a value
// bound for Half is rounded once, when it is stored (from_compute in loops.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/tensor/dispatch.h"  // compute_t
#include "kiln/tensor/tensor.h"

namespace kiln::cuda {

// Declared for copy.cu: dst = src converted (or relaid out), both on one GPU, on stream_for(dst). convert.cu.
void copy_on_device(const Tensor& dst, const Tensor& src);

template <typename To, typename From>
__host__ __device__ __forceinline__ compute_t<To> convert_value(compute_t<From> v) {
  using CT = compute_t<To>;
  using CF = compute_t<From>;
  if constexpr (std::is_same_v<CT, CF>) {
    return v;
  } else if constexpr (std::is_same_v<CT, bool>) {
    return v != CF(0);
  } else if constexpr (std::is_same_v<CT, uint8_t> && std::is_floating_point_v<CF>) {
    return static_cast<uint8_t>(static_cast<int64_t>(v));
  } else {
    return static_cast<CT>(v);
  }
}

}  // namespace kiln::cuda
