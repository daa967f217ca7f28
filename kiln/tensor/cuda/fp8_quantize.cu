// CUDA kernels: FP8 quantisation with a fused amax (fp8_ops.h), plain or transposed, one pass over x.
//
// Each thread keeps the largest |x| it saw (a NaN sticks); a block reduces those with warp shuffles and its first
// thread adds the block's value to amax[0] with one atomicMax on the float's bits: values >= +0 (+inf included)
// order like their bit patterns read as int, and a NaN is written as the canonical NaN 0x7fc00000, which is larger
// than +inf's bits, so once amax[0] holds a NaN it keeps it. The result does not depend on the order of the atomics.
// scale and amax are read and written on the device: nothing synchronises with the host (graph-capturable).
//
// Plain: a grid-stride loop, 16 bytes of x per thread and step (4 floats or 8 16-bit values) where x is 16-byte
// aligned. Transposed (R, C) -> (C, R): 32 x 32 tiles through shared memory, read along x's rows and written along
// out's rows, so both sides are coalesced.
// Both layouts at once (fp8_quantize_pair): one 64 x 64 tile per block, x read once in 16-byte vectors (all of a
// thread's loads issued before any is used), the plain codes written straight from registers and the transposed ones
// through shared memory, 16 bytes per thread where R % 16 == 0 (4 otherwise); the tile's column sums (for a bias
// gradient) are added in a fixed order into one partial sum per column and row tile, which the frontend sums: the
// result does not depend on scheduling. The pair kernel may apply a GELU to each value as it reads it (a transformer
// MLP's activation, fused into the quantisation of the next product's input), with the unary kernels' own functions.
#include <cuda_fp16.h>  // __half2float

#include <algorithm>
#include <cstdint>
#include <type_traits>  // std::conditional_t, std::true_type

#include "kiln/tensor/cuda/activations.cuh"  // gelu_erf, gelu_tanh
#include "kiln/tensor/cuda/cuda_backend.h"   // stream_for
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/cuda/fp8_codes.cuh"  // encode, encode2, nan_max, commit_block_amax
#include "kiln/tensor/error.h"
#include "kiln/tensor/ops/fp8_kernels.h"

namespace kiln::cuda {
namespace {

enum class In { F32, BF16, F16 };
template <In kIn>
using raw_t = std::conditional_t<kIn == In::F32, float, uint16_t>;  // 16-bit floats as their bits

template <In kIn>
__device__ __forceinline__ float load_float(raw_t<kIn> v) {
  if constexpr (kIn == In::F32) {
    return v;
  } else if constexpr (kIn == In::BF16) {
    return __uint_as_float(static_cast<uint32_t>(v) << 16);
  } else {
    return __half2float(__ushort_as_half(v));
  }
}

// What the pair kernel applies to each value before quantising it (internal::Fp8Activation), or GeluGrad: the value
// times gelu'(h) for h from a second input (the gradient through a GELU, fp8_quantize_pair_through_gelu).
enum class Act { None, Gelu, GeluTanh, GeluGrad };

template <Act kAct>
__device__ __forceinline__ float activate(float v) {
  if constexpr (kAct == Act::Gelu) {
    return gelu_erf(v);
  } else if constexpr (kAct == Act::GeluTanh) {
    return gelu_tanh(v);
  } else {
    return v;
  }
}

// One 16-byte group of x: its kVec values (as raw bits in `in`, each passed through kAct) scaled and encoded into
// `codes`, their |max| into `local`, and (kSums) each value added to its column sum.
// `h` (GeluGrad only): the second input's values at the same places.
template <In kIn, bool kE4M3, bool kSums, int kVec, Act kAct = Act::None>
__device__ __forceinline__ void encode_group(const raw_t<kIn> (&in)[kVec], float s, float& local, float (&colsum)[kVec],
                                             uint8_t (&codes)[kVec], const raw_t<kIn>* h = nullptr) {
  static_assert(kVec % 2 == 0);
  const auto value = [&](int j) {
    if constexpr (kAct == Act::GeluGrad) {
      return load_float<kIn>(in[j]) * gelu_erf_grad(load_float<kIn>(h[j]));  // as gelu_backward computes it
    } else {
      return activate<kAct>(load_float<kIn>(in[j]));
    }
  };
#pragma unroll
  for (int j = 0; j < kVec; j += 2) {
    const float f0 = value(j), f1 = value(j + 1);
    local = nan_max(nan_max(local, fabsf(f0)), fabsf(f1));
    if constexpr (kSums) {
      colsum[j] += f0;
      colsum[j + 1] += f1;
    }
    const uint16_t two = encode2<kE4M3>(f0 * s, f1 * s);
    codes[j] = static_cast<uint8_t>(two & 0xffu);
    codes[j + 1] = static_cast<uint8_t>(two >> 8);
  }
}

constexpr int kThreads = 256;

// out[i] = q(x[i] * scale), i < n. `vec`: x 16-byte and out (16 / sizeof(raw)-byte) aligned, so the first
// n / kVec groups move as vectors; the rest one by one.
template <In kIn, bool kE4M3>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const raw_t<kIn>* __restrict__ x, uint8_t* __restrict__ out, int64_t n, bool vec,
                    const float* __restrict__ scale, float* amax) {
  using Raw = raw_t<kIn>;
  constexpr int kVec = 16 / sizeof(Raw);
  const float s = *scale;
  float local = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = vec ? n / kVec : 0;
  for (int64_t g = first; g < groups; g += stride) {
    union {
      uint4 v;
      Raw e[kVec];
    } in;
    in.v = reinterpret_cast<const uint4*>(x)[g];
    union {
      uint32_t w[kVec / 4];
      uint8_t b[kVec];
    } o;
    float no_sums[kVec];
    encode_group<kIn, kE4M3, false>(in.e, s, local, no_sums, o.b);
    if constexpr (kVec == 4) {
      reinterpret_cast<uint32_t*>(out)[g] = o.w[0];
    } else {
      reinterpret_cast<uint2*>(out)[g] = make_uint2(o.w[0], o.w[1]);
    }
  }
  for (int64_t i = groups * kVec + first; i < n; i += stride) {
    const float f = load_float<kIn>(x[i]);
    local = nan_max(local, fabsf(f));
    out[i] = encode<kE4M3>(f * s);
  }
  commit_block_amax(local, amax);
}

constexpr int kTile = 32, kTileRows = 8;  // a 32 x 32 tile, blocks of 32 x 8 threads

// out (C, R) = q(x (R, C) * scale)^T. Block (bx, by) does the tiles of column block bx and row blocks by,
// by + gridDim.y, ...
template <In kIn, bool kE4M3>
__global__ void __launch_bounds__(kTile* kTileRows)
    quantize_transpose_kernel(const raw_t<kIn>* __restrict__ x, uint8_t* __restrict__ out, int64_t rows, int64_t cols,
                              const float* __restrict__ scale, float* amax) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const float s = *scale;
  float local = 0.0f;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
    // Read along x's rows: threadIdx.x walks the columns.
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) {
        const float f = load_float<kIn>(x[r * cols + c]);
        local = nan_max(local, fabsf(f));
        tile[i][threadIdx.x] = encode<kE4M3>(f * s);
      }
    }
    __syncthreads();
    // Write along out's rows: threadIdx.x walks x's rows.
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();
  }
  commit_block_amax(local, amax);
}

constexpr int kPairTile = 64, kPairThreads = 256;

// Column c, rows rq .. rq + 15, of a shared tile of codes with kPitch bytes per row, as one 16-byte store to dst (a
// row of the transposed output, 16-byte aligned).
template <int kPitch>
__device__ __forceinline__ void store_tile_column16(const uint8_t* tile, int c, int rq, uint8_t* dst) {
  uint32_t w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint8_t* col = tile + (rq + 4 * q) * kPitch + c;
    w[q] = static_cast<uint32_t>(col[0]) | static_cast<uint32_t>(col[kPitch]) << 8 |
           static_cast<uint32_t>(col[2 * kPitch]) << 16 | static_cast<uint32_t>(col[3 * kPitch]) << 24;
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

// out (R, C) = q(act(x) * scale), out_t (C, R) its transpose with rows ld_t >= R apart (a block of columns of a wider
// transpose), partial (C, row tiles) the column sums of each 64-row tile (null: none). GeluGrad: act(x) = x gelu'(h),
// h (R, C) laid out as x. C % 64 == 0, R % 4 == 0, x
// 16-byte aligned (pair_kernel_applies); kRows16: R % 16 == 0, so that the transposed codes go out 16 bytes per store
// (else 4).
//
// One 64 x 64 tile per block. Each thread first loads all of its rows of the tile (2 or 4 16-byte loads, issued back
// to back, so that several are in flight), then encodes them: the plain codes go straight to `out`, and into a shared
// tile from which the transposed rows are written. The column sums: each thread's rows summed in order, then the
// lanes of a warp that hold the same columns (shuffles in a fixed order), then the block's warps in order; so the sums
// do not depend on scheduling.
// Blocks per SM the pair kernel is compiled for: 8 (all 64 warps; 32 registers a thread) where it only scales and
// encodes, as it is latency-bound; 4 (64 registers) where it also computes a GELU or its derivative, whose erf and exp
// spill out of 32 registers.
template <Act kAct>
constexpr int pair_blocks_per_sm() {
  return kAct == Act::None ? 8 : 4;
}

template <In kIn, bool kE4M3, bool kSums, bool kRows16, Act kAct>
__global__ void __launch_bounds__(kPairThreads, pair_blocks_per_sm<kAct>())
    quantize_pair_kernel(const raw_t<kIn>* __restrict__ x, const raw_t<kIn>* __restrict__ h, uint8_t* __restrict__ out,
                         uint8_t* __restrict__ out_t, float* __restrict__ partial, int64_t rows, int64_t cols,
                         int64_t ld_t, const float* __restrict__ scale, float* amax) {
  using Raw = raw_t<kIn>;
  constexpr int kVec = 16 / sizeof(Raw);                // elements per 16-byte load: 4 or 8
  constexpr int kPerRow = kPairTile / kVec;             // threads across a tile row: 16 or 8
  constexpr int kRowsPerPass = kPairThreads / kPerRow;  // 16 or 32
  constexpr int kPasses = kPairTile / kRowsPerPass;     // 4 or 2
  constexpr int kWarps = kPairThreads / 32;
  constexpr int kPitch = kPairTile + 8;  // bytes per shared row: 8-byte aligned, banks spread
  __shared__ __align__(16) uint8_t tile[kPairTile * kPitch];
  __shared__ float sums[kSums ? kWarps : 1][kSums ? kPairTile : 1];
  const float s = *scale;
  const int tid = threadIdx.x, tc = tid % kPerRow, tr = tid / kPerRow;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kPairTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kPairTile;
  union Loaded {
    uint4 v;
    Raw e[kVec];
  };
  Loaded in[kPasses];
  Loaded in_h[kAct == Act::GeluGrad ? kPasses : 1];
#pragma unroll
  for (int k = 0; k < kPasses; ++k) {
    const int64_t r = r0 + tr + k * kRowsPerPass;
    in[k].v = r < rows ? *reinterpret_cast<const uint4*>(x + r * cols + c0 + tc * kVec) : make_uint4(0, 0, 0, 0);
    if constexpr (kAct == Act::GeluGrad) {
      in_h[k].v = r < rows ? *reinterpret_cast<const uint4*>(h + r * cols + c0 + tc * kVec) : make_uint4(0, 0, 0, 0);
    }
  }
  float local = 0.0f;
  float colsum[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) colsum[j] = 0.0f;
#pragma unroll
  for (int k = 0; k < kPasses; ++k) {
    const int i = tr + k * kRowsPerPass;
    union {
      uint32_t w[kVec / 4];
      uint8_t b[kVec];
    } o;
    // A row past the end is 0s, and act(0) = 0 (GeluGrad: 0 times gelu'(0)): no effect.
    if constexpr (kAct == Act::GeluGrad) {
      encode_group<kIn, kE4M3, kSums, kVec, kAct>(in[k].e, s, local, colsum, o.b, in_h[k].e);
    } else {
      encode_group<kIn, kE4M3, kSums, kVec, kAct>(in[k].e, s, local, colsum, o.b);
    }
    uint8_t* t = tile + i * kPitch + tc * kVec;
    if constexpr (kVec == 4) {
      *reinterpret_cast<uint32_t*>(t) = o.w[0];
    } else {
      *reinterpret_cast<uint2*>(t) = make_uint2(o.w[0], o.w[1]);
    }
    if (r0 + i < rows) {
      uint8_t* dst = out + (r0 + i) * cols + c0 + tc * kVec;
      if constexpr (kVec == 4) {
        *reinterpret_cast<uint32_t*>(dst) = o.w[0];
      } else {
        *reinterpret_cast<uint2*>(dst) = make_uint2(o.w[0], o.w[1]);
      }
    }
  }
  if constexpr (kSums) {
    // Lanes tc, tc + kPerRow, ... of a warp hold the same columns (rows tr of this warp): summed by shuffles.
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      for (int o = kPerRow; o < 32; o <<= 1) colsum[j] += __shfl_xor_sync(0xffffffffu, colsum[j], o);
    }
    if (tid % 32 < kPerRow) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) sums[tid / 32][tc * kVec + j] = colsum[j];
    }
  }
  __syncthreads();
  if constexpr (kRows16) {
    // out_t row c0 + c holds x's column c0 + c; each thread writes 16 codes (16 consecutive rows).
    const int c = tid / 4, rq = (tid % 4) * 16;
    if (r0 + rq < rows) {  // rows % 16 == 0: a group of 16 rows is in or out whole
      store_tile_column16<kPitch>(tile, c, rq, out_t + (c0 + c) * ld_t + r0 + rq);
    }
  } else {
    // Each thread writes 4 codes (4 consecutive rows) at a time.
    for (int p = tid; p < kPairTile * (kPairTile / 4); p += kPairThreads) {
      const int c = p / (kPairTile / 4), rq = (p % (kPairTile / 4)) * 4;
      if (r0 + rq >= rows) continue;  // rows % 4 == 0: a group of 4 rows is in or out whole
      const uint8_t* col = tile + rq * kPitch + c;
      const uint32_t w = static_cast<uint32_t>(col[0]) | static_cast<uint32_t>(col[kPitch]) << 8 |
                         static_cast<uint32_t>(col[2 * kPitch]) << 16 | static_cast<uint32_t>(col[3 * kPitch]) << 24;
      *reinterpret_cast<uint32_t*>(out_t + (c0 + c) * ld_t + r0 + rq) = w;
    }
  }
  if constexpr (kSums) {
    if (tid < kPairTile) {
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += sums[w][tid];
      partial[(c0 + tid) * gridDim.y + blockIdx.y] = total;
    }
  }
  commit_block_amax(local, amax);
}

// out (C, R) = x (R, C)^T for FP8 codes (bytes): 64 x 64 tiles through shared memory, 16 bytes per thread each way.
// C % 64 == 0, R % 16 == 0, both pointers 16-byte aligned (fp8_transpose_kernel_applies).
__global__ void __launch_bounds__(kPairThreads)
    transpose_codes_kernel(const uint8_t* __restrict__ x, uint8_t* __restrict__ out, int64_t rows, int64_t cols) {
  constexpr int kPitch = kPairTile + 16;  // 16-byte aligned shared rows
  __shared__ __align__(16) uint8_t tile[kPairTile * kPitch];
  const int tid = threadIdx.x;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kPairTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kPairTile;
  {
    const int r = tid / 4, q = (tid % 4) * 16;  // tile row r, bytes q .. q + 15
    const uint4 v =
        r0 + r < rows ? *reinterpret_cast<const uint4*>(x + (r0 + r) * cols + c0 + q) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(tile + r * kPitch + q) = v;
  }
  __syncthreads();
  const int c = tid / 4, rq = (tid % 4) * 16;  // out row c0 + c, its bytes r0 + rq .. r0 + rq + 15
  if (r0 + rq < rows) {                        // rows % 16 == 0: a group of 16 rows is in or out whole
    store_tile_column16<kPitch>(tile, c, rq, out + (c0 + c) * rows + r0 + rq);
  }
}

// act: internal::Fp8Activation, or (h defined) the gradient through a GELU (erf form) with h its input.
template <In kIn, bool kE4M3>
void launch_pair(const Tensor& out, const Tensor& out_t, const Tensor& partial, const Tensor& x, const Tensor& scale,
                 const Tensor& amax, internal::Fp8Activation act, const Tensor& h) {
  cudaStream_t stream = stream_for(out);
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t row_tiles = (rows + kPairTile - 1) / kPairTile;
  KILN_CHECK(row_tiles <= 65535, "cuda::fp8_quantize_pair: ", rows, " rows are more than its grid covers (",
             65535 * kPairTile, ")");  // fp8_pair_kernel_applies sends larger ones to the separate kernels
  const dim3 grid(static_cast<unsigned>(cols / kPairTile), static_cast<unsigned>(row_tiles));
  const auto* px = static_cast<const raw_t<kIn>*>(x.data_ptr());
  auto* po = static_cast<uint8_t*>(out.data_ptr());
  auto* pt = static_cast<uint8_t*>(out_t.data_ptr());
  auto* pp = partial.defined() ? static_cast<float*>(partial.data_ptr()) : nullptr;
  const auto* ps = static_cast<const float*>(scale.data_ptr());
  auto* pa = static_cast<float*>(amax.data_ptr());
  const auto* ph = h.defined() ? static_cast<const raw_t<kIn>*>(h.data_ptr()) : nullptr;
  auto run = [&](auto sums, auto rows16, auto activation) {
    quantize_pair_kernel<kIn, kE4M3, decltype(sums)::value, decltype(rows16)::value, decltype(activation)::value>
        <<<grid, kPairThreads, 0, stream>>>(px, ph, po, pt, pp, rows, cols, out_t.stride(0), ps, pa);
  };
  using None = std::integral_constant<Act, Act::None>;
  const bool rows16 = rows % 16 == 0;
  if (ph != nullptr) {
    if constexpr (kIn != In::F32) {  // fp8_pair_kernel_through_gelu: 16-bit inputs, either format, sums or not
      using Grad = std::integral_constant<Act, Act::GeluGrad>;
      if (pp != nullptr) {
        rows16 ? run(std::true_type{}, std::true_type{}, Grad{}) : run(std::true_type{}, std::false_type{}, Grad{});
      } else {
        rows16 ? run(std::false_type{}, std::true_type{}, Grad{}) : run(std::false_type{}, std::false_type{}, Grad{});
      }
    } else {
      KILN_FAIL("cuda::fp8_quantize_pair: the gradient through a GELU is taken for 16-bit inputs only");
    }
  } else if (pp != nullptr) {
    rows16 ? run(std::true_type{}, std::true_type{}, None{}) : run(std::true_type{}, std::false_type{}, None{});
  } else if (act == internal::Fp8Activation::None) {
    rows16 ? run(std::false_type{}, std::true_type{}, None{}) : run(std::false_type{}, std::false_type{}, None{});
  } else if constexpr (kIn != In::F32 && kE4M3) {  // the problems fp8_pair_kernel_activates takes
    auto with = [&](auto activation) {
      rows16 ? run(std::false_type{}, std::true_type{}, activation)
             : run(std::false_type{}, std::false_type{}, activation);
    };
    if (act == internal::Fp8Activation::Gelu) {
      with(std::integral_constant<Act, Act::Gelu>{});
    } else {
      with(std::integral_constant<Act, Act::GeluTanh>{});
    }
  } else {
    KILN_FAIL("cuda::fp8_quantize_pair: no kernel applies an activation to ", x.dtype(), " quantised to ", out.dtype(),
              "; the frontend activates such inputs first");
  }
  KILN_CUDA_CHECK_LAUNCH("fp8_quantize_pair");
}

template <In kIn, bool kE4M3>
void launch(const Tensor& out, const Tensor& x, const Tensor& scale, const Tensor& amax, bool transpose) {
  cudaStream_t stream = stream_for(out);
  const auto* px = static_cast<const raw_t<kIn>*>(x.data_ptr());
  auto* po = static_cast<uint8_t*>(out.data_ptr());
  const auto* ps = static_cast<const float*>(scale.data_ptr());
  auto* pa = static_cast<float*>(amax.data_ptr());
  if (!transpose) {
    const int64_t n = x.numel();
    constexpr int kVec = 16 / sizeof(raw_t<kIn>);
    const bool vec = reinterpret_cast<uintptr_t>(px) % 16 == 0 && reinterpret_cast<uintptr_t>(po) % kVec == 0;
    const int64_t work = vec ? std::max<int64_t>(n / kVec, 1) : n;
    // Enough blocks to fill an H200 several times over; each thread loops over the rest.
    const int64_t blocks = std::min<int64_t>((work + kThreads - 1) / kThreads, 4096);
    quantize_kernel<kIn, kE4M3><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(px, po, n, vec, ps, pa);
  } else {
    const int64_t rows = x.size(0), cols = x.size(1);
    const int64_t col_tiles = (cols + kTile - 1) / kTile, row_tiles = (rows + kTile - 1) / kTile;
    KILN_CHECK(col_tiles <= 0x7fffffff, "fp8_quantize: ", cols, " columns are too many to transpose on CUDA");
    const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(std::min<int64_t>(row_tiles, 65535)));
    quantize_transpose_kernel<kIn, kE4M3><<<grid, dim3(kTile, kTileRows), 0, stream>>>(px, po, rows, cols, ps, pa);
  }
  KILN_CUDA_CHECK_LAUNCH("fp8_quantize");
}

template <In kIn>
void launch_for_format(const Tensor& out, const Tensor& x, const Tensor& scale, const Tensor& amax, bool transpose) {
  if (out.dtype() == DType::Float8_e4m3fn) {
    launch<kIn, true>(out, x, scale, amax, transpose);
  } else {
    launch<kIn, false>(out, x, scale, amax, transpose);
  }
}

template <In kIn>
void launch_pair_for_format(const Tensor& out, const Tensor& out_t, const Tensor& partial, const Tensor& x,
                            const Tensor& scale, const Tensor& amax, internal::Fp8Activation act, const Tensor& h) {
  if (out.dtype() == DType::Float8_e4m3fn) {
    launch_pair<kIn, true>(out, out_t, partial, x, scale, amax, act, h);
  } else {
    launch_pair<kIn, false>(out, out_t, partial, x, scale, amax, act, h);
  }
}

}  // namespace

bool fp8_pair_kernel_applies(const Tensor& x) {
  return x.dim() == 2 && x.size(1) % kPairTile == 0 && x.size(0) % 4 == 0 &&
         (x.size(0) + kPairTile - 1) / kPairTile <= 65535 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
}

int64_t fp8_pair_row_tiles(int64_t rows) { return (rows + kPairTile - 1) / kPairTile; }

bool fp8_pair_kernel_activates(const Tensor& x, DType fp8_dtype, bool column_sums) {
  return (x.dtype() == DType::BFloat16 || x.dtype() == DType::Float16) && fp8_dtype == DType::Float8_e4m3fn &&
         !column_sums;
}

bool fp8_pair_kernel_through_gelu(const Tensor& grad, const Tensor& h, bool tanh_approximation) {
  return !tanh_approximation && (grad.dtype() == DType::BFloat16 || grad.dtype() == DType::Float16) &&
         h.dtype() == grad.dtype() && h.shape() == grad.shape() && h.is_contiguous() &&
         reinterpret_cast<uintptr_t>(h.data_ptr()) % 16 == 0 && fp8_pair_kernel_applies(grad);
}

void fp8_quantize_pair(const Tensor& out, const Tensor& out_t, const Tensor& partial_sums, const Tensor& x,
                       const Tensor& scale, const Tensor& amax, internal::Fp8Activation act, const Tensor& h) {
  switch (x.dtype()) {
    case DType::Float32: return launch_pair_for_format<In::F32>(out, out_t, partial_sums, x, scale, amax, act, h);
    case DType::BFloat16: return launch_pair_for_format<In::BF16>(out, out_t, partial_sums, x, scale, amax, act, h);
    case DType::Float16: return launch_pair_for_format<In::F16>(out, out_t, partial_sums, x, scale, amax, act, h);
    default: KILN_FAIL("cuda::fp8_quantize_pair: unexpected input dtype ", x.dtype());
  }
}

bool fp8_transpose_kernel_applies(const Tensor& x) {
  return x.dim() == 2 && x.size(1) % kPairTile == 0 && x.size(0) % 16 == 0 &&
         (x.size(0) + kPairTile - 1) / kPairTile <= 65535 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
}

void fp8_transpose(const Tensor& out, const Tensor& x) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const dim3 grid(static_cast<unsigned>(cols / kPairTile), static_cast<unsigned>((rows + kPairTile - 1) / kPairTile));
  transpose_codes_kernel<<<grid, kPairThreads, 0, stream_for(out)>>>(static_cast<const uint8_t*>(x.data_ptr()),
                                                                     static_cast<uint8_t*>(out.data_ptr()), rows, cols);
  KILN_CUDA_CHECK_LAUNCH("fp8_transpose");
}

void fp8_quantize(const Tensor& out, const Tensor& x, const Tensor& scale, const Tensor& amax, bool transpose) {
  switch (x.dtype()) {
    case DType::Float32: return launch_for_format<In::F32>(out, x, scale, amax, transpose);
    case DType::BFloat16: return launch_for_format<In::BF16>(out, x, scale, amax, transpose);
    case DType::Float16: return launch_for_format<In::F16>(out, x, scale, amax, transpose);
    default: KILN_FAIL("cuda::fp8_quantize: unexpected input dtype ", x.dtype());
  }
}

}  // namespace kiln::cuda
