// Layer norm kernels (layer_norm.h). Rows of D contiguous elements.
//  rows of at most 1024 elements (BERT's 768 and 1024), forward: one warp per row holding the row in registers, so x
//            is read once. It can add a residual first (s = x + residual, saved for backward), and drop elements of x
//            before that as internal::dropout would (s = dropout(x) + residual), keeping one bit per element for
//            backward.
//  rows of at most 1024 elements, backward: each warp takes a fixed set of rows and holds each row of dy and xhat in
//            registers, reading dy and x once and writing dx once (also in a second, lower-precision dtype when asked:
//            the gradient of the low-precision addend); a lane owns the same columns on every row, in groups of 4
//            moved with one 16-byte (8-byte for 16-bit types) access when D % 4 == 0 and the pointers allow, so it
//            sums dw and db for its columns in registers. Each block writes one (D) partial of its warps' sums, and a
//            column kernel adds the partials in a fixed order: about sm_count * (blocks per SM) rows of partials.
//  longer rows, forward:  one block per row; mean, then the variance around it (two passes over the row, the second
//            from cache), then y = (x - mean) * rstd * w + b. mean and rstd are saved for backward.
//  longer rows (and Float64), backward: one block per row for dx = rstd (g - mean(g) - xhat mean(g xhat)),
//            g = dy * w; and a column kernel for dw = sum_rows dy xhat, db = sum_rows dy: each block sums a chunk of
//            rows for a strip of columns into a (chunks, D) partial, which kiln's sum reduces in a fixed order.
#include "kiln/layers/cuda/layer_norm.h"
#include "kiln/tensor/trace.h"  // a range per kernel entry

#include <algorithm>
#include <type_traits>

#include "kiln/layers/cuda/layer_kernels.cuh"  // load_pack, store_pack
#include "kiln/tensor/cuda/dropout_keep.cuh"   // keep_flags: internal::dropout's keep/drop decision of an element
#include "kiln/tensor/cuda/fp8_codes.cuh"      // encode2, nan_max, commit_block_amax: the FP8 codes of y
#include "kiln/tensor/cuda/kernel_util.cuh"    // load_compute, store_as, stream_for, KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/internal_ops.h"          // internal::empty, internal::sum
#include "kiln/tensor/scalar.h"                // Scalar: the mask value as internal::dropout rounds it

namespace kiln::nn::cuda_impl {
namespace {

using cuda::kdetail::load_compute;
using cuda::kdetail::store_as;

// Sum over the block; every thread gets the result. `shared` holds 32 values.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : A(0);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, typename A>
__global__ void layer_norm_forward_kernel(const T* x, const T* w, const T* b, T* y, A* mean_out, A* rstd_out, int64_t d,
                                          A eps) {
  __shared__ A shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  T* yr = y + row * d;
  A s = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += static_cast<A>(load_compute(xr + i));
  const A mean = block_sum(s, shared) / static_cast<A>(d);
  A q = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const A c = static_cast<A>(load_compute(xr + i)) - mean;
    q += c * c;
  }
  const A var = block_sum(q, shared) / static_cast<A>(d);  // biased, as LayerNorm
  const A rstd = A(1) / sqrt(var + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    A v = (static_cast<A>(load_compute(xr + i)) - mean) * rstd;
    if (w != nullptr) v *= static_cast<A>(load_compute(w + i));
    if (b != nullptr) v += static_cast<A>(load_compute(b + i));
    store_as(yr + i, v);
  }
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

template <typename T, typename A>
__global__ void layer_norm_dx_kernel(const T* dy, const T* x, const T* w, const A* mean, const A* rstd, T* dx,
                                     int64_t d) {
  __shared__ A shared[32];
  const int64_t row = blockIdx.x;
  const T* dyr = dy + row * d;
  const T* xr = x + row * d;
  const A m = mean[row], r = rstd[row];
  A sg = 0, sgx = 0;  // sum of g, sum of g * xhat
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    A g = static_cast<A>(load_compute(dyr + i));
    if (w != nullptr) g *= static_cast<A>(load_compute(w + i));
    sg += g;
    sgx += g * (static_cast<A>(load_compute(xr + i)) - m) * r;
  }
  const A mg = block_sum(sg, shared) / static_cast<A>(d);
  const A mgx = block_sum(sgx, shared) / static_cast<A>(d);
  T* dxr = dx + row * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    A g = static_cast<A>(load_compute(dyr + i));
    if (w != nullptr) g *= static_cast<A>(load_compute(w + i));
    const A xhat = (static_cast<A>(load_compute(xr + i)) - m) * r;
    store_as(dxr + i, r * (g - mg - xhat * mgx));
  }
}

// Grid (column strips of blockDim.x, row chunks). partial_w / partial_b: (chunks, d) in A.
template <typename T, typename A>
__global__ void layer_norm_dwdb_kernel(const T* dy, const T* x, const A* mean, const A* rstd, A* partial_w,
                                       A* partial_b, int64_t rows, int64_t d, int64_t rows_per_chunk) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= d) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  A sw = 0, sb = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const A g = static_cast<A>(load_compute(dy + r * d + col));
    sb += g;
    sw += g * (static_cast<A>(load_compute(x + r * d + col)) - mean[r]) * rstd[r];
  }
  if (partial_w != nullptr) partial_w[blockIdx.y * d + col] = sw;
  if (partial_b != nullptr) partial_b[blockIdx.y * d + col] = sb;
}

// ---- rows of at most kWarpMaxD elements: a warp per row, the row in registers (one read of x, one of dy) ----
// The elements per lane are a template argument (the fewest that hold the row), so that a kernel holds no more
// registers than its rows need and enough warps stay resident to keep memory busy.
constexpr int kWarpMaxD = 1024;
constexpr int kForwardRows = 8;    // warps (rows) per block, forward
constexpr int kBackwardWarps = 4;  // warps per block, backward

// v as an array of L stores it, widened back: rounded once to L.
template <typename L, typename A>
__device__ __forceinline__ A stored_as(A v) {
  return static_cast<A>(cuda::to_compute<L>(cuda::from_compute<L>(static_cast<compute_t<L>>(v))));
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A dropout fused into the forward kernel (its kDrop instances): the draw, the Bernoulli(1 - p) threshold, a kept
// element's mask value (1 / (1 - p) as internal::dropout rounds it to x's type, in float), and where the keep bits go.
struct DropParams {
  GeneratorState draw;
  philox::KeepThreshold keep;
  float scale = 0;
  uint32_t* bits = nullptr;  // (rows, 32): bit j of word l of a row is element l + 32 j of it
};

// The E4M3 codes of a float32 y written by the forward kernel (Fp8Output): codes (rows, d), the scale they are made
// with, and the amax cell that takes max |y| (one atomicMax per block, fp8_codes.cuh).
struct Fp8Params {
  uint8_t* codes = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
};

// The keep bits of this lane's elements of `row` (bit j: element lane + 32 j), internal::dropout's decisions for x's
// elements row * d + i (row-major). d <= 32 J, J a multiple of 4. When d % 4 == 0 each Philox block (4 elements)
// lies in one row, in 4 neighbouring lanes: lane l draws the row's blocks l, l + 32, ... (at most J / 4) once each,
// keeping the 4 decisions of its block t as nibble t of a word, and every lane reads its element i's bit from the
// lane that drew it: block i / 4, drawn by lane (i / 4) % 32 as its nibble (i / 4) / 32, word i % 4. Other d draw a
// block per element.
template <int J, typename X>
__device__ __forceinline__ uint32_t keep_bits(const DropParams& drop, int64_t row, int d, int lane) {
  const uint64_t row_start = static_cast<uint64_t>(row) * static_cast<uint64_t>(d);
  uint32_t bits = 0;
  if (d % 4 == 0) {
    uint32_t nibbles = 0;
#pragma unroll
    for (int t = 0; t < J / 4; ++t) {
      const int blk = lane + 32 * t;
      if (4 * blk < d) {
        bool kept[4];
        cuda::keep_flags<X, 4>(kept, drop.draw, drop.keep, row_start + 4 * static_cast<uint64_t>(blk));
        const uint32_t nibble = static_cast<uint32_t>(kept[0]) | static_cast<uint32_t>(kept[1]) << 1 |
                                static_cast<uint32_t>(kept[2]) << 2 | static_cast<uint32_t>(kept[3]) << 3;
        nibbles |= nibble << (4 * t);
      }
    }
#pragma unroll
    for (int j = 0; j < J; ++j) {
      // Element lane + 32 j is in the row's block 8 j + lane / 4: lane 8 (j % 4) + lane / 4 drew it, as nibble j / 4.
      const uint32_t word = __shfl_sync(0xffffffffu, nibbles, 8 * (j % 4) + lane / 4);
      bits |= ((word >> (4 * (j / 4) + lane % 4)) & 1u) << j;
    }
  } else {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int i = lane + 32 * j;
      if (i >= d) continue;
      const uint64_t g = row_start + static_cast<uint64_t>(i);
      bool kept[4];
      cuda::keep_flags<X, 4>(kept, drop.draw, drop.keep, g - g % 4);
      bits |= static_cast<uint32_t>(kept[g % 4]) << j;
    }
  }
  return bits;
}

// s = x (+ residual), y = (s - mean) * rstd * w + b. X: x's type; S: the residual's, s's and y's type (X when there
// is no residual). Lane l holds elements l, l + 32, ... of its row. kDrop (with a residual, A float): x is first
// dropped as internal::dropout drops it (the same decision per element, x * mask rounded once to X) and the keep bits
// written, so s = dropout(x) + residual bit for bit. y_low (null: none): y rounded once to bfloat16 (low_bf16) or
// float16 as well.
template <int J, typename X, typename S, typename A, bool kDrop>
__global__ void layer_norm_forward_warp(const X* x, const S* residual, const S* w, const S* b, S* y, void* y_low,
                                        bool low_bf16, S* sum_out, A* mean_out, A* rstd_out, int64_t rows, int d, A eps,
                                        DropParams drop) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kForwardRows + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const X* xr = x + row * d;
  uint32_t kept = 0;
  if constexpr (kDrop) {
    if (drop.draw.device_offset != nullptr) drop.draw.offset = *drop.draw.device_offset;  // a CUDA graph's draw
    kept = keep_bits<J, X>(drop, row, d, lane);
    drop.bits[row * 32 + lane] = kept;
  }
  A v[J];
  A s = 0;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = lane + 32 * j;
    v[j] = 0;
    if (i < d) {
      v[j] = static_cast<A>(load_compute(xr + i));
      if constexpr (kDrop) {  // internal::dropout's value; __fmul_rn: not contracted with the add below into an FMA
        X dropped;
        store_as(&dropped, __fmul_rn(v[j], ((kept >> j) & 1u) != 0 ? drop.scale : 0.0f));
        v[j] = static_cast<A>(load_compute(&dropped));
      }
      if (residual != nullptr) {
        v[j] += static_cast<A>(load_compute(residual + row * d + i));
        if constexpr (!std::is_same_v<S, A>) {  // a 16-bit sum is rounded, as the add would round it
          S rounded;
          store_as(&rounded, v[j]);
          v[j] = static_cast<A>(load_compute(&rounded));
        }
      }
      s += v[j];
    }
  }
  const A mean = warp_sum(s) / static_cast<A>(d);
  A q = 0;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = lane + 32 * j;
    if (i < d) q += (v[j] - mean) * (v[j] - mean);
  }
  const A rstd = A(1) / sqrt(warp_sum(q) / static_cast<A>(d) + eps);  // biased variance, as LayerNorm
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = lane + 32 * j;
    if (i >= d) continue;
    if (sum_out != nullptr) store_as(sum_out + row * d + i, v[j]);
    A o = (v[j] - mean) * rstd;
    if (w != nullptr) o *= static_cast<A>(load_compute(w + i));
    if (b != nullptr) o += static_cast<A>(load_compute(b + i));
    store_as(y + row * d + i, o);
    if constexpr (std::is_same_v<S, float>) {  // y_low is asked for float32 y only: o is y's value as stored
      if (y_low != nullptr) {
        if (low_bf16) {
          store_as(static_cast<BFloat16*>(y_low) + row * d + i, o);
        } else {
          store_as(static_cast<Half*>(y_low) + row * d + i, o);
        }
      }
    }
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// The forward kernel above for rows whose elements come in groups of 4 (d % 4 == 0, every pointer aligned to its
// pack): lane l holds groups l, l + 32, ..., l + 32 (G - 1) of its row, each moved with one access (16 bytes of
// float32, 8 of 16-bit floats), where the per-element kernel needs one access per element. Each element's value is
// computed as there (dropout, residual add and roundings alike); the row's sums add the same values in another order.
// kDrop: a lane's group is one Philox block, which it draws itself; the keep bits are written in the per-element
// kernel's layout (bit j of word w: element w + 32 j), gathered with one ballot per group and position in it.
// kFp8 (S float): y's E4M3 codes too, as fp8_quantize writes them (fp8_codes.cuh: saturate(y * scale) from the float
// y stored), with the largest |y| of the row returned for the block's amax (FP8Params).
template <int G, typename X, typename S, typename A, bool kDrop, bool kFp8>
__device__ __forceinline__ float forward_packed_row(const X* x, const S* residual, const S* w, const S* b, S* y,
                                                    void* y_low, bool low_bf16, S* sum_out, A* mean_out, A* rstd_out,
                                                    int d, A eps, DropParams& drop, const Fp8Params& fp8, int64_t row,
                                                    int lane) {
  constexpr int V = 4;
  const int groups = d / V;
  float local_amax = 0.0f;
  const int64_t start = row * d;
  if constexpr (kDrop) {
    if (drop.draw.device_offset != nullptr) drop.draw.offset = *drop.draw.device_offset;  // a CUDA graph's draw
  }
  A v[G][V];
  uint32_t bits = 0;  // kDrop: this lane's word of the row's keep bits
  A s = 0;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int grp = lane + 32 * g;
    bool kept[V] = {true, true, true, true};
    if (grp < groups) {
      load_pack<V>(x + start + V * grp, v[g]);
      if constexpr (kDrop) {
        cuda::keep_flags<X, V>(kept, drop.draw, drop.keep, static_cast<uint64_t>(start + V * grp));
#pragma unroll
        for (int k = 0; k < V; ++k) {  // internal::dropout's value; __fmul_rn: not contracted into an FMA below
          X dropped;
          store_as(&dropped, __fmul_rn(v[g][k], kept[k] ? drop.scale : 0.0f));
          v[g][k] = static_cast<A>(load_compute(&dropped));
        }
      }
      if (residual != nullptr) {
        A r[V];
        load_pack<V>(residual + start + V * grp, r);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          v[g][k] += r[k];
          if constexpr (!std::is_same_v<S, A>) {  // a 16-bit sum is rounded, as the add would round it
            S rounded;
            store_as(&rounded, v[g][k]);
            v[g][k] = static_cast<A>(load_compute(&rounded));
          }
        }
      }
#pragma unroll
      for (int k = 0; k < V; ++k) s += v[g][k];
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[g][k] = 0;
    }
    if constexpr (kDrop) {
      // Element e = lane + 32 j of the row is position lane % 4 of group lane / 4 + 8 j: in group slot j / 4 (this
      // g for j = 4 g .. 4 g + 3), held by lane (lane / 4 + 8 (j % 4)). Each slot's ballots are read as they are
      // taken, so that no more than V of them are held at a time.
      uint32_t ballots[V];
#pragma unroll
      for (int k = 0; k < V; ++k) ballots[k] = __ballot_sync(0xffffffffu, grp < groups && kept[k]);
      const int k = lane % 4;
      const uint32_t m = k == 0 ? ballots[0] : k == 1 ? ballots[1] : k == 2 ? ballots[2] : ballots[3];
#pragma unroll
      for (int q = 0; q < 4; ++q) bits |= ((m >> (lane / 4 + 8 * q)) & 1u) << (4 * g + q);
    }
  }
  if constexpr (kDrop) drop.bits[row * 32 + lane] = bits;
  const A mean = warp_sum(s) / static_cast<A>(d);
  A q = 0;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane + 32 * g < groups) {
#pragma unroll
      for (int k = 0; k < V; ++k) q += (v[g][k] - mean) * (v[g][k] - mean);
    }
  }
  const A rstd = A(1) / sqrt(warp_sum(q) / static_cast<A>(d) + eps);  // biased variance, as LayerNorm
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int grp = lane + 32 * g;
    if (grp >= groups) continue;
    const int64_t at = start + V * grp;
    if (sum_out != nullptr) store_pack<V>(sum_out + at, v[g]);
    A o[V], wv[V], bv[V];
    if (w != nullptr) load_pack<V>(w + V * grp, wv);
    if (b != nullptr) load_pack<V>(b + V * grp, bv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      o[k] = (v[g][k] - mean) * rstd;
      if (w != nullptr) o[k] *= wv[k];
      if (b != nullptr) o[k] += bv[k];
    }
    store_pack<V>(y + at, o);
    if constexpr (std::is_same_v<S, float>) {  // y_low is asked for float32 y only: o is y's value as stored
      if (y_low != nullptr) {
        if (low_bf16) {
          store_pack<V>(static_cast<BFloat16*>(y_low) + at, o);
        } else {
          store_pack<V>(static_cast<Half*>(y_low) + at, o);
        }
      }
    }
    if constexpr (kFp8) {
      const float sc = *fp8.scale;
      const uint32_t lo = cuda::encode2<true>(o[0] * sc, o[1] * sc), hi = cuda::encode2<true>(o[2] * sc, o[3] * sc);
      *reinterpret_cast<uint32_t*>(fp8.codes + at) = lo | hi << 16;
#pragma unroll
      for (int k = 0; k < V; ++k) local_amax = cuda::nan_max(local_amax, fabsf(o[k]));
    }
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  return local_amax;
}

template <int G, typename X, typename S, typename A, bool kDrop, bool kFp8>
__global__ void layer_norm_forward_packed(const X* x, const S* residual, const S* w, const S* b, S* y, void* y_low,
                                          bool low_bf16, S* sum_out, A* mean_out, A* rstd_out, int64_t rows, int d,
                                          A eps, DropParams drop, Fp8Params fp8) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kForwardRows + threadIdx.x / 32;
  float local_amax = 0.0f;
  if (row < rows) {
    local_amax = forward_packed_row<G, X, S, A, kDrop, kFp8>(x, residual, w, b, y, y_low, low_bf16, sum_out, mean_out,
                                                             rstd_out, d, eps, drop, fp8, row, threadIdx.x % 32);
  }
  if constexpr (kFp8) cuda::commit_block_amax(local_amax, fp8.amax);  // every thread, rows past the end with 0
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w, written in x's type T and, when dx_low is given, also in
// the type L (the gradient of a lower-precision input that was added to the residual), from the same float values.
// Warp k of the grid takes rows k, k + W, k + 2 W, ... (W: the grid's warps) and holds each row's dy * w and xhat in
// registers. Lane l owns the groups of V consecutive elements l, l + 32, ..., l + 32 (G - 1) of every row: with V = 4
// (d % 4 == 0 and aligned pointers) a group is one 16-byte load or store of floats, 8 bytes of 16-bit floats; V = 1
// (elements l, l + 32, ...) serves any other d. As a lane keeps its columns on every row, it sums dy * xhat (for dw)
// and dy (for db) over its rows into its own columns of its warp's arrays in shared memory (registers would hold 2 E
// of them per lane besides the row: up to 255 registers a thread, two blocks per SM), which needs no barrier and no
// global memory traffic per row. At the end the block adds its warps' sums in warp order, a column per thread, and
// writes the block's (d) partial; column_sum_kernel then adds the partials in a fixed order. Nothing depends on
// timing, so dw and db are the same on every run.
// G (1, 2, 4, 6, 8 groups of 4, or 8, 16, 24, 32 single elements) is the least that holds the row, so that a kernel
// holds no more registers than its rows need and enough warps stay resident to keep memory busy.
// kDrop: dx_low is the gradient of a dropout's input instead (forward's kDrop kernel): dx rounded to L, times the
// mask (0, or `scale`, 1 / (1 - p) as internal::dropout rounds it to L), rounded once to L, as the dropout's own
// backward (a multiply by its mask) computes it; element i of a row is kept when bit i / 32 of its word i % 32 in
// `keep` is. dy, x, dx, dx_low: (rows, d); w: (d) or null; mean, rstd: (rows); partial_w, partial_b: (gridDim.x, d) or
// null; keep: (rows, 32) or null.
// kSums: partial_s (gridDim.x, d) also receives the column sums of x's gradient as written (dx_low where given, else
// dx), each value as stored, added like dw's and db's partials (the Linear before the layer takes them as its bias's
// gradient: autograd::offer_column_sums).
template <int G, int V, typename T, typename L, typename A, bool kDrop, bool kSums = false>
__global__ void __launch_bounds__(32 * kBackwardWarps)
    layer_norm_backward_warp(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                             const A* __restrict__ mean, const A* __restrict__ rstd, T* __restrict__ dx,
                             L* __restrict__ dx_low, A* __restrict__ partial_w, A* __restrict__ partial_b, int64_t rows,
                             int d, const uint32_t* __restrict__ keep, A scale, A* __restrict__ partial_s = nullptr) {
  constexpr int E = G * V;   // elements per lane
  constexpr int D = 32 * E;  // the longest row this instance takes
  // Each warp's column sums (above); a lane touches only its own columns until the block adds them up.
  __shared__ __align__(16) A sum_w[kBackwardWarps][D], sum_b[kBackwardWarps][D];  // of dy * xhat, of dy
  __shared__ __align__(16) A sum_s[kSums ? kBackwardWarps : 1][kSums ? D : 4];    // kSums: of x's gradient as stored
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool write = dx != nullptr || dx_low != nullptr;
  A* const sw = sum_w[warp];
  A* const sb = sum_b[warp];
  A* const ss = sum_s[kSums ? warp : 0];
  const A zeros[V] = {};
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int i = V * (lane + 32 * j);
    store_pack<V>(sw + i, zeros);
    store_pack<V>(sb + i, zeros);
    if constexpr (kSums) store_pack<V>(ss + i, zeros);
  }
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kBackwardWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kBackwardWarps) {
    const A m = mean[row], r = rstd[row];
    const T* dyr = dy + row * d;
    const T* xr = x + row * d;
    uint32_t keep_word = 0;  // this lane's word of the row's keep bits
    if constexpr (kDrop) keep_word = keep[row * 32 + lane];
    // Every load of the row first, so that they are in flight together.
    A g[E], xh[E];  // dy, then dy * w; x, then xhat
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int i = V * (lane + 32 * j);
      if (i < d) {
        load_pack<V>(dyr + i, g + V * j);
        load_pack<V>(xr + i, xh + V * j);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) g[V * j + k] = xh[V * j + k] = 0;
      }
    }
    A sg = 0, sgx = 0;  // sum of g, sum of g * xhat
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int i = V * (lane + 32 * j);
      if (i >= d) continue;
      A wv[V], cw[V], cb[V];
      if (w != nullptr) load_pack<V>(w + i, wv);
      load_pack<V>(sw + i, cw);
      load_pack<V>(sb + i, cb);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int e = V * j + k;
        xh[e] = (xh[e] - m) * r;
        cw[k] += g[e] * xh[e];
        cb[k] += g[e];
        if (w != nullptr) g[e] *= wv[k];
        sg += g[e];
        sgx += g[e] * xh[e];
      }
      store_pack<V>(sw + i, cw);
      store_pack<V>(sb + i, cb);
    }
    if (!write) continue;
    const A mg = warp_sum(sg) / static_cast<A>(d), mgx = warp_sum(sgx) / static_cast<A>(d);
    uint32_t kept = 0;  // bit V j + k: element V (lane + 32 j) + k stayed
    if constexpr (kDrop) {
      // Element i = c + 32 V j (c = V lane + k) has its bit in word c % 32, at i / 32: V shuffles serve the row.
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int c = V * lane + k;
        const uint32_t word = V == 1 ? keep_word : __shfl_sync(0xffffffffu, keep_word, c % 32);
#pragma unroll
        for (int j = 0; j < G; ++j) {
          const int i = c + 32 * V * j;
          if (i < d) kept |= ((word >> (i / 32)) & 1u) << (V * j + k);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int i = V * (lane + 32 * j);
      if (i >= d) continue;
      A v[V];
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = r * (g[V * j + k] - mg - xh[V * j + k] * mgx);
      if (dx != nullptr) store_pack<V>(dx + row * d + i, v);
      A cs[V];  // kSums: x's gradient as stored, added to this lane's sums
      if (dx_low == nullptr) {
        if constexpr (kSums) {
#pragma unroll
          for (int k = 0; k < V; ++k) cs[k] = stored_as<T>(v[k]);
        }
      } else if constexpr (kDrop) {
        A dropped[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A low = stored_as<L>(v[k]);
          dropped[k] = __fmul_rn(low, ((kept >> (V * j + k)) & 1u) != 0 ? scale : A(0));
        }
        store_pack<V>(dx_low + row * d + i, dropped);
        if constexpr (kSums) {
#pragma unroll
          for (int k = 0; k < V; ++k) cs[k] = stored_as<L>(dropped[k]);
        }
      } else {
        store_pack<V>(dx_low + row * d + i, v);
        if constexpr (kSums) {
#pragma unroll
          for (int k = 0; k < V; ++k) cs[k] = stored_as<L>(v[k]);
        }
      }
      if constexpr (kSums) {
        A c[V];
        load_pack<V>(ss + i, c);
#pragma unroll
        for (int k = 0; k < V; ++k) c[k] += cs[k];
        store_pack<V>(ss + i, c);
      }
    }
  }
  if (partial_w == nullptr && partial_b == nullptr && (!kSums || partial_s == nullptr)) return;
  // The block's partial: ((warp 0 + warp 1) + warp 2) + ..., a column per thread.
  __syncthreads();
  const int64_t out = static_cast<int64_t>(blockIdx.x) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    A tw = sum_w[0][i], tb = sum_b[0][i];
#pragma unroll
    for (int k = 1; k < kBackwardWarps; ++k) tw += sum_w[k][i], tb += sum_b[k][i];
    if (partial_w != nullptr) partial_w[out + i] = tw;
    if (partial_b != nullptr) partial_b[out + i] = tb;
    if constexpr (kSums) {
      if (partial_s != nullptr) {
        A ts = sum_s[0][i];
#pragma unroll
        for (int k = 1; k < kBackwardWarps; ++k) ts += sum_s[k][i];
        partial_s[out + i] = ts;
      }
    }
  }
}

// dw and db (d, in T) from the backward kernel's (parts, d) partials in A; blockIdx.y picks dw (0) or db (1). A block
// takes 32 columns; its thread (c, s) adds rows s, s + kSumSlices, ... of column c, and the slices' sums are added in
// slice order, so the result is the same on every run. The rows are split kSumSlices ways and the loop unrolled so
// that each thread has several loads in flight: the partials are few rows of L2-resident data, and a loop of one
// dependent load per row would be bound by L2 latency.
constexpr int kSumSlices = 16;

template <typename T, typename A>
__global__ void __launch_bounds__(32 * kSumSlices)
    column_sum_kernel(const A* __restrict__ partial_w, const A* __restrict__ partial_b, T* __restrict__ dw,
                      T* __restrict__ db, int parts, int d) {
  __shared__ A slice_sums[kSumSlices][32];
  const A* partial = blockIdx.y == 0 ? partial_w : partial_b;
  T* out = blockIdx.y == 0 ? dw : db;
  if (partial == nullptr) return;  // the whole block leaves together
  const int c = blockIdx.x * 32 + threadIdx.x, s = threadIdx.y;
  A t = 0;
  if (c < d) {
#pragma unroll 8
    for (int p = s; p < parts; p += kSumSlices) t += partial[static_cast<int64_t>(p) * d + c];
  }
  slice_sums[s][threadIdx.x] = t;
  __syncthreads();
  if (s != 0 || c >= d) return;
  A total = slice_sums[0][threadIdx.x];
#pragma unroll
  for (int k = 1; k < kSumSlices; ++k) total += slice_sums[k][threadIdx.x];
  store_as(out + c, total);
}

// Calls f(std::integral_constant<int, J>{}) with the smallest J of 8, 16, 24, 32 for which 32 J >= d.
template <typename F>
void with_lane_count(int64_t d, F&& f) {
  if (d <= 256) return f(std::integral_constant<int, 8>{});
  if (d <= 512) return f(std::integral_constant<int, 16>{});
  if (d <= 768) return f(std::integral_constant<int, 24>{});
  return f(std::integral_constant<int, 32>{});
}

// Calls f(std::integral_constant<int, G>{}) with the smallest G of 1, 2, 4, 6, 8 for which 128 G >= d (groups of 4).
template <typename F>
void with_group_count(int64_t d, F&& f) {
  if (d <= 128) return f(std::integral_constant<int, 1>{});
  if (d <= 256) return f(std::integral_constant<int, 2>{});
  if (d <= 512) return f(std::integral_constant<int, 4>{});
  if (d <= 768) return f(std::integral_constant<int, 6>{});
  return f(std::integral_constant<int, 8>{});
}

// Resident blocks per SM of a backward kernel (its registers and shared memory decide), asked once. At most
// kMaxBackwardBlocksPerSm: each block adds one row to the partials that column_sum_kernel adds up.
constexpr int kMaxBackwardBlocksPerSm = 8;

// The kernel's resident blocks per SM, with as much of the SM's memory as shared memory as the kernel can use (its
// column sums take up to 48 KB a block): without that preference the driver may configure less and keep fewer blocks
// resident than the grid assumes.
template <typename Kernel>
int resident_blocks(Kernel kernel) {
  KILN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
      "layer_norm backward");
  int count = 0;
  KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, kernel, 32 * kBackwardWarps, 0),
                  "layer_norm backward");
  return count;
}

// The grid of every kernel of a family (G, V, T, L): the fewest blocks any of its instances (with and without the
// fused dropout, with and without x's gradient's sums) keeps resident, so that each runs as one wave of blocks (a
// grid larger than what stays resident leaves a last partial wave, half the SMs idle), and all of them give each
// block the same rows: dw and db are summed in the same order, bit for bit those of add_layer_norm after an unfused
// dropout, and those of a call without the sums.
template <int G, int V, typename T, typename L>
int backward_blocks_per_sm() {
  static const int n = [] {
    int count = std::min(resident_blocks(layer_norm_backward_warp<G, V, T, L, float, false>),
                         resident_blocks(layer_norm_backward_warp<G, V, T, L, float, true>));
    if constexpr (V == 4) {
      count = std::min({count, resident_blocks(layer_norm_backward_warp<G, V, T, L, float, false, true>),
                        resident_blocks(layer_norm_backward_warp<G, V, T, L, float, true, true>)});
    }
    return std::clamp(count, 1, kMaxBackwardBlocksPerSm);
  }();
  return n;
}

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

int threads_for(int64_t d) {
  // One thread per few elements of the row, in whole warps, at most 512.
  int t = 32;
  while (t < 512 && t * 4 < d) t *= 2;
  return t;
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

}  // namespace

LayerNormSaved layer_norm_forward(const Tensor& x, int64_t d, const Tensor& weight, const Tensor& bias, double eps,
                                  const Tensor& residual, const FusedDropout* dropout, std::optional<DType> y_also_in,
                                  const Fp8Output* fp8) {
  trace::Scope range(trace::Kind::Op,
                     dropout != nullptr   ? "dropout_add_layer_norm_forward"
                     : residual.defined() ? "add_layer_norm_forward"
                                          : "layer_norm_forward",
                     x.device(), {&x, &weight});
  const int64_t rows = x.numel() / d;
  const DType out_dtype = residual.defined() ? residual.dtype() : x.dtype();
  const DType stat = out_dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  const TensorOptions out_options{.dtype = out_dtype, .device = x.device()};
  LayerNormSaved out{internal::empty(x.shape(), out_options),
                     internal::empty({rows}, {.dtype = stat, .device = x.device()}),
                     internal::empty({rows}, {.dtype = stat, .device = x.device()}),
                     residual.defined() ? internal::empty(x.shape(), out_options) : Tensor()};
  if (dropout != nullptr) {
    KILN_CHECK(residual.defined() && d <= kWarpMaxD && out_dtype != DType::Float64 && dropout->p > 0 && dropout->p < 1,
               "layer_norm: a fused dropout needs a residual, rows of at most ", kWarpMaxD,
               " elements, a dtype other than Float64 and p in (0, 1), got ", d, ", ", out_dtype,
               " and p = ", dropout->p);
    out.keep = internal::empty({rows, 32}, {.dtype = DType::Int32, .device = x.device()});
  }
  if (y_also_in && (*y_also_in == DType::BFloat16 || *y_also_in == DType::Float16) && out_dtype == DType::Float32 &&
      d <= kWarpMaxD) {
    out.y_low = internal::empty(x.shape(), {.dtype = *y_also_in, .device = x.device()});
  }
  if (rows == 0) return out;
  KILN_CHECK(!residual.defined() ||
                 (d <= kWarpMaxD &&
                  (x.dtype() == residual.dtype() || (residual.dtype() == DType::Float32 &&
                                                     (x.dtype() == DType::BFloat16 || x.dtype() == DType::Float16)))),
             "layer_norm: a fused residual needs rows of at most ", kWarpMaxD, " elements and a Float32 residual (or ",
             "one of x's dtype), got ", d, " and ", residual.dtype());
  cudaStream_t stream = cuda::stream_for(x);
  if (d <= kWarpMaxD) {
    const auto blocks = static_cast<unsigned>((rows + kForwardRows - 1) / kForwardRows);
    visit_floating_dtype(out_dtype, "layer_norm", [&](auto tag) {
      using S = typename decltype(tag)::type;
      using A = std::conditional_t<std::is_same_v<S, double>, double, float>;
      auto launch = [&](auto x_tag) {
        using X = typename decltype(x_tag)::type;
        DropParams drop;
        if (dropout != nullptr) {
          drop.draw = dropout->draw;
          drop.keep = philox::keep_threshold(1.0 - dropout->p);  // bernoulli(1 - p)'s decisions, as internal::dropout
          // The mask value of a kept element as internal::dropout stores it (rounded to X), widened exactly to float.
          drop.scale = static_cast<float>(static_cast<compute_t<X>>(Scalar(1.0 / (1.0 - dropout->p)).to<X>()));
          drop.bits = reinterpret_cast<uint32_t*>(out.keep.data_ptr<int32_t>());
        }
        // Groups of 4 where d and every pointer allow (x's pack is 8 or 16 bytes, the others' 16, y_low's 8).
        const auto packs = [&](const Tensor& t, size_t element) {
          return !t.defined() || aligned_to(t.data_ptr(), 4 * element);
        };
        const bool packed = !std::is_same_v<S, double> && d % 4 == 0 && packs(x, sizeof(X)) &&
                            packs(residual, sizeof(S)) && packs(weight, sizeof(S)) && packs(bias, sizeof(S)) &&
                            packs(out.y, sizeof(S)) && packs(out.sum, sizeof(S)) && packs(out.y_low, 2);
        const auto run = [&](auto kernel, auto... fp8_params) {
          kernel<<<blocks, 32 * kForwardRows, 0, stream>>>(
              x.data_ptr<X>(), ptr_or_null<S>(residual), ptr_or_null<S>(weight), ptr_or_null<S>(bias),
              out.y.data_ptr<S>(), out.y_low.defined() ? out.y_low.data_ptr() : nullptr,
              out.y_low.defined() && out.y_low.dtype() == DType::BFloat16,
              out.sum.defined() ? out.sum.data_ptr<S>() : nullptr, out.mean.data_ptr<A>(), out.rstd.data_ptr<A>(), rows,
              static_cast<int>(d), static_cast<A>(eps), drop, fp8_params...);
        };
        if constexpr (!std::is_same_v<S, double>) {
          if (packed) {
            // y's FP8 codes in the same pass: float32 y, codes 4-byte aligned (the packed kernel stores 4 at a time).
            bool codes = false;
            if constexpr (std::is_same_v<S, float>) {
              codes =
                  fp8 != nullptr && fp8->codes.dtype() == DType::Float8_e4m3fn && aligned_to(fp8->codes.data_ptr(), 4);
            }
            const Fp8Params params = codes ? Fp8Params{static_cast<uint8_t*>(fp8->codes.data_ptr()),
                                                       fp8->scale.data_ptr<float>(), fp8->amax.data_ptr<float>()}
                                           : Fp8Params{};
            with_group_count(d, [&](auto groups) {
              constexpr int G = decltype(groups)::value;
              if constexpr (std::is_same_v<S, float>) {
                if (codes && dropout != nullptr) return run(layer_norm_forward_packed<G, X, S, A, true, true>, params);
                if (codes) return run(layer_norm_forward_packed<G, X, S, A, false, true>, params);
              }
              if (dropout != nullptr) return run(layer_norm_forward_packed<G, X, S, A, true, false>, params);
              run(layer_norm_forward_packed<G, X, S, A, false, false>, params);
            });
            KILN_CUDA_CHECK_LAUNCH("layer_norm");
            if (codes) {
              out.fp8_written = true;
              fp8->amax.impl().storage()->bump_version();
            }
            return;
          }
        }
        with_lane_count(d, [&](auto lanes) {
          constexpr int J = decltype(lanes)::value;
          if constexpr (std::is_same_v<A, float>) {
            if (dropout != nullptr) return run(layer_norm_forward_warp<J, X, S, A, true>);
          }
          run(layer_norm_forward_warp<J, X, S, A, false>);
        });
        KILN_CUDA_CHECK_LAUNCH("layer_norm");
      };
      if constexpr (std::is_same_v<S, float>) {
        if (x.dtype() == DType::BFloat16) return launch(TypeTag<BFloat16>{});
        if (x.dtype() == DType::Float16) return launch(TypeTag<Half>{});
      }
      launch(tag);
    });
    return out;
  }
  visit_floating_dtype(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    layer_norm_forward_kernel<T, A><<<static_cast<unsigned>(rows), threads_for(d), 0, stream>>>(
        x.data_ptr<T>(), ptr_or_null<T>(weight), ptr_or_null<T>(bias), out.y.data_ptr<T>(), out.mean.data_ptr<A>(),
        out.rstd.data_ptr<A>(), d, static_cast<A>(eps));
    KILN_CUDA_CHECK_LAUNCH("layer_norm");
  });
  return out;
}

LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, int64_t d, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, bool need_dx, bool need_dweight, bool need_dbias,
                                   std::optional<DType> dx_also_in, const Tensor& keep, double p, bool dx_sums) {
  trace::Scope range(trace::Kind::Op, keep.defined() ? "dropout_add_layer_norm_backward" : "layer_norm_backward",
                     x.device(), {&dy, &x});
  const int64_t rows = x.numel() / d;
  LayerNormGrads g;
  cudaStream_t stream = cuda::stream_for(x);
  const DType acc = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  const bool drop = keep.defined();
  const bool low = need_dx && dx_also_in && (*dx_also_in != x.dtype() || drop);
  KILN_CHECK(!low || (d <= kWarpMaxD && ((drop && *dx_also_in == x.dtype() && x.dtype() != DType::Float64) ||
                                         (x.dtype() == DType::Float32 &&
                                          (*dx_also_in == DType::BFloat16 || *dx_also_in == DType::Float16)))),
             "layer_norm backward: a second gradient dtype needs Float32 rows of at most ", kWarpMaxD, " elements");
  KILN_CHECK(!drop || (keep.dtype() == DType::Int32 && keep.numel() == rows * 32 && p > 0 && p < 1),
             "layer_norm backward: a fused dropout needs forward's (rows, 32) Int32 keep bits and p in (0, 1)");
  // (Float64 keeps the kernels below: its per-lane sums would take twice the registers.)
  if (d <= kWarpMaxD && x.dtype() != DType::Float64) {
    const TensorOptions options{.dtype = x.dtype(), .device = x.device()};
    if (need_dx) g.dx = internal::empty(x.shape(), options);
    if (low) g.dx_low = internal::empty(x.shape(), {.dtype = *dx_also_in, .device = x.device()});
    if (need_dweight) g.dweight = internal::empty({d}, options);
    if (need_dbias) g.dbias = internal::empty({d}, options);
    if (rows == 0) {
      if (need_dweight) g.dweight.zero_();
      if (need_dbias) g.dbias.zero_();
      return g;
    }
    visit_floating_dtype(x.dtype(), "layer_norm backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<T, double>) {
        auto launch = [&](auto low_tag) {
          using L = typename decltype(low_tag)::type;
          const T* w = ptr_or_null<T>(weight);
          T* dx = need_dx ? g.dx.data_ptr<T>() : nullptr;
          L* dx_low = low ? g.dx_low.data_ptr<L>() : nullptr;
          // Groups of 4 need every row of every array to start on a 4-element boundary.
          const bool packs = d % 4 == 0 && aligned_to(dy.data_ptr<T>(), 4 * sizeof(T)) &&
                             aligned_to(x.data_ptr<T>(), 4 * sizeof(T)) && aligned_to(w, 4 * sizeof(T)) &&
                             aligned_to(dx, 4 * sizeof(T)) && aligned_to(dx_low, 4 * sizeof(L));
          // The mask value of a kept element as internal::dropout stores it in L, widened exactly to float.
          const float scale =
              drop ? static_cast<float>(static_cast<compute_t<L>>(Scalar(1.0 / (1.0 - p)).to<L>())) : 0.0f;
          const auto* keep_bits = drop ? reinterpret_cast<const uint32_t*>(keep.data_ptr<int32_t>()) : nullptr;
          // x's gradient's column sums where asked for, x's gradient is written, and rows move in groups of 4.
          const bool sums_wanted = dx_sums && need_dx && packs;
          auto run = [&](auto kernel, int blocks_per_sm, bool sums) {
            // Every SM as full as the kernel's registers allow, and no more blocks than the rows keep busy: each
            // block's warps sum their rows' dw and db in registers, and each block adds one row of partials.
            const int64_t blocks = std::min<int64_t>(static_cast<int64_t>(blocks_per_sm) * cuda::kdetail::sm_count(),
                                                     cuda::kdetail::ceil_div(rows, kBackwardWarps));
            Tensor pw, pb;  // (blocks, d) in float
            if (need_dweight) pw = internal::empty({blocks, d}, {.dtype = DType::Float32, .device = x.device()});
            if (need_dbias) pb = internal::empty({blocks, d}, {.dtype = DType::Float32, .device = x.device()});
            float* pw_ptr = need_dweight ? pw.data_ptr<float>() : nullptr;
            float* pb_ptr = need_dbias ? pb.data_ptr<float>() : nullptr;
            Tensor ps;  // (blocks, d): the sums of x's gradient
            if (sums) ps = internal::empty({blocks, d}, {.dtype = DType::Float32, .device = x.device()});
            float* ps_ptr = sums ? ps.data_ptr<float>() : nullptr;
            kernel<<<static_cast<unsigned>(blocks), 32 * kBackwardWarps, 0, stream>>>(
                dy.data_ptr<T>(), x.data_ptr<T>(), w, mean.data_ptr<float>(), rstd.data_ptr<float>(), dx, dx_low,
                pw_ptr, pb_ptr, rows, static_cast<int>(d), keep_bits, scale, ps_ptr);
            KILN_CUDA_CHECK_LAUNCH("layer_norm backward");
            if (sums) {
              g.dx_sums = internal::empty({d}, {.dtype = DType::Float32, .device = x.device()});
              const dim3 grid(static_cast<unsigned>(cuda::kdetail::ceil_div(d, 32)), 1);
              column_sum_kernel<float, float><<<grid, dim3(32, kSumSlices), 0, stream>>>(
                  ps_ptr, nullptr, g.dx_sums.data_ptr<float>(), nullptr, static_cast<int>(blocks), static_cast<int>(d));
              KILN_CUDA_CHECK_LAUNCH("layer_norm backward");
            }
            if (!need_dweight && !need_dbias) return;
            const dim3 grid(static_cast<unsigned>(cuda::kdetail::ceil_div(d, 32)), 2);
            column_sum_kernel<T, float><<<grid, dim3(32, kSumSlices), 0, stream>>>(
                pw_ptr, pb_ptr, need_dweight ? g.dweight.data_ptr<T>() : nullptr,
                need_dbias ? g.dbias.data_ptr<T>() : nullptr, static_cast<int>(blocks), static_cast<int>(d));
            KILN_CUDA_CHECK_LAUNCH("layer_norm backward");
            // pw and pb are released here; the caching allocator hands them out again only in stream order.
          };
          auto pick = [&](auto drop_tag) {
            constexpr bool kDrop = decltype(drop_tag)::value;
            if (packs) {
              with_group_count(d, [&](auto groups) {
                constexpr int G = decltype(groups)::value;
                if (sums_wanted) {
                  run(layer_norm_backward_warp<G, 4, T, L, float, kDrop, true>, backward_blocks_per_sm<G, 4, T, L>(),
                      true);
                } else {
                  run(layer_norm_backward_warp<G, 4, T, L, float, kDrop>, backward_blocks_per_sm<G, 4, T, L>(), false);
                }
              });
            } else {
              with_lane_count(d, [&](auto lanes) {
                constexpr int J = decltype(lanes)::value;
                run(layer_norm_backward_warp<J, 1, T, L, float, kDrop>, backward_blocks_per_sm<J, 1, T, L>(), false);
              });
            }
          };
          if (drop && low) return pick(std::true_type{});
          pick(std::false_type{});
        };
        if constexpr (std::is_same_v<T, float>) {
          if (low && *dx_also_in == DType::BFloat16) return launch(TypeTag<BFloat16>{});
          if (low && *dx_also_in == DType::Float16) return launch(TypeTag<Half>{});
        }
        launch(tag);
      }
    });
    return g;
  }
  // Longer rows and Float64: (chunks, d) partial sums of dy * xhat (pw) and of dy (pb), added up at the end.
  Tensor pw, pb;
  auto make_partials = [&](int64_t count) {
    if (need_dweight) pw = internal::empty({count, d}, {.dtype = acc, .device = x.device()});
    if (need_dbias) pb = internal::empty({count, d}, {.dtype = acc, .device = x.device()});
    if (rows == 0) {
      if (pw.defined()) pw.zero_();
      if (pb.defined()) pb.zero_();
    }
  };
  visit_floating_dtype(x.dtype(), "layer_norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    if (need_dx) {
      g.dx = internal::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
      if (rows > 0) {
        layer_norm_dx_kernel<T, A><<<static_cast<unsigned>(rows), threads_for(d), 0, stream>>>(
            dy.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<T>(weight), mean.data_ptr<A>(), rstd.data_ptr<A>(),
            g.dx.data_ptr<T>(), d);
        KILN_CUDA_CHECK_LAUNCH("layer_norm backward");
      }
    }
    if (need_dweight || need_dbias) {
      // Enough row chunks to fill the GPU, each at least 32 rows long.
      constexpr int kThreads = 128;
      const int64_t strips = (d + kThreads - 1) / kThreads;
      const int64_t want = std::max<int64_t>(1, 4 * cuda::kdetail::sm_count() / std::max<int64_t>(strips, 1));
      const int64_t chunks = std::clamp<int64_t>(std::min(want, (rows + 31) / 32), 1, 65535);
      const int64_t per_chunk = (rows + chunks - 1) / chunks;
      make_partials(chunks);
      if (rows > 0) {
        const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(chunks));
        layer_norm_dwdb_kernel<T, A><<<grid, kThreads, 0, stream>>>(
            dy.data_ptr<T>(), x.data_ptr<T>(), mean.data_ptr<A>(), rstd.data_ptr<A>(),
            pw.defined() ? pw.data_ptr<A>() : nullptr, pb.defined() ? pb.data_ptr<A>() : nullptr, rows, d, per_chunk);
        KILN_CUDA_CHECK_LAUNCH("layer_norm backward");
      }
    }
  });
  if (need_dweight) g.dweight = internal::sum(pw, {0}, false).to(x.dtype());
  if (need_dbias) g.dbias = internal::sum(pb, {0}, false).to(x.dtype());
  return g;
}

}  // namespace kiln::nn::cuda_impl
