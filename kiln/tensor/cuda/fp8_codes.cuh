// kiln/tensor/cuda/fp8_codes.cuh — device helpers of the kernels that write FP8 codes with a fused amax (backend-
// internal): the quantisation kernels (fp8_quantize.cu) and the layer norm that writes its output's codes for the next
// FP8 product (kiln/layers/cuda/layer_norm.cu). A block's largest |value| goes into amax[0] with one atomicMax on the
// float's bits: values >= +0 (+inf included) order like their bit patterns read as int, and a NaN is written as the
// canonical NaN 0x7fc00000, which is larger than +inf's bits, so once amax[0] holds a NaN it keeps it. The result does
// not depend on the order of the atomics.
#pragma once

#include <cuda_fp8.h>  // __nv_cvt_float_to_fp8

#include <cstdint>

namespace kiln::cuda {

// float -> FP8 code: the cast's conversion (convert.cu): round to nearest even, saturating, NaN -> 0x7f.
template <bool kE4M3>
__device__ __forceinline__ uint8_t encode(float v) {
  if (v != v) return 0x7f;
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

// Two floats -> two FP8 codes (a in the low byte), as encode() does each: one conversion instruction for the pair on
// FP8-capable GPUs (sm_89+).
template <bool kE4M3>
__device__ __forceinline__ uint16_t encode2(float a, float b) {
  uint16_t v = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kE4M3 ? __NV_E4M3 : __NV_E5M2);
  if (a != a) v = static_cast<uint16_t>((v & 0xff00u) | 0x7fu);
  if (b != b) v = static_cast<uint16_t>((v & 0x00ffu) | 0x7f00u);
  return v;
}

// max(m, v) where a NaN v wins and a NaN m stays (v > NaN is false).
__device__ __forceinline__ float nan_max(float m, float v) { return (v > m || v != v) ? v : m; }

// The block's largest value into amax[0] (see the header comment). Every thread of the block calls it once, at one
// place in the kernel.
inline __device__ void commit_block_amax(float local, float* amax) {
  __shared__ float warp_max[32];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int lane = tid % 32, warp = tid / 32, warps = (blockDim.x * blockDim.y + 31) / 32;
  for (int o = 16; o > 0; o >>= 1) local = nan_max(local, __shfl_xor_sync(0xffffffffu, local, o));
  if (lane == 0) warp_max[warp] = local;
  __syncthreads();
  if (warp != 0) return;
  local = lane < warps ? warp_max[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) local = nan_max(local, __shfl_xor_sync(0xffffffffu, local, o));
  if (lane == 0) {
    const int bits = local != local ? 0x7fc00000 : __float_as_int(local);
    atomicMax(reinterpret_cast<int*>(amax), bits);
  }
}

}  // namespace kiln::cuda
