// kiln/layers/cuda/short_attention.cu — attention for sequences of at most 128 in one kernel each way (see
// short_attention.h).
//
// Tensor-core products are mma.sync m16n8k16 (16-bit inputs, float accumulators) with operands from shared memory
// through ldmatrix. Fragments (lane l, r = l / 4, c = 2 (l % 4)): A (16 x 16) registers hold rows r and r + 8,
// columns c, c + 1 and c + 8, c + 9; B (16 x 8) columns r, rows c, c + 1 and c + 8, c + 9; an accumulator (16 x 8)
// rows r and r + 8, columns c, c + 1. A row of a tile of 64 columns is 8 chunks of 16 bytes; chunk x
// of row y sits at chunk x ^ (y % 8), so that the 8 rows one ldmatrix reads fall in different banks.
#include "kiln/layers/cuda/short_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

#include "kiln/tensor/cuda.h"               // compute_capability
#include "kiln/tensor/cuda/cuda_backend.h"  // stream_for
#include "kiln/tensor/cuda/cuda_check.h"    // KILN_CUDA_CHECK, KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"  // internal::empty
#include "kiln/tensor/trace.h"         // a range per entry

namespace kiln::nn::cuda_impl {

namespace {

constexpr int kD = 64;                 // head size
constexpr int kMaxS = 128;             // the longest sequence
constexpr int kWarps = kMaxS / 16;     // a warp per 16 queries (or keys)
constexpr int kThreads = 32 * kWarps;  //
constexpr int kTile64 = kMaxS * kD;    // elements of a (128, 64) tile
constexpr float kLog2e = 1.4426950408889634f;

// Element offset of chunk `chunk` (8 elements) of row `row` in a tile of `chunks` chunks a row.
template <int kChunks>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * (8 * kChunks) + ((chunk ^ (row & 7)) << 3);
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// d += a b for one m16n8k16 tile.
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T in one 32-bit register, lo in the low half (the lower column of a fragment).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return __half2float(v);
  }
}

// Element strides of a (B, H, X, 64) operand.
struct Strides {
  int64_t b = 0, h = 0, x = 0;
};

struct Params {
  const void *q, *k, *v, *bias;  // bias: (B|1, 1, 1, S) or null
  Strides qs, ks, vs;
  int64_t bias_b = 0;  // 0 when the bias is shared by the batch
  void* out;           // forward: O, (B, H, L, 64) with strides os
  Strides os;
  float* stats;         // (B, H, L): forward writes it, backward reads it
  const void *o, *d_o;  // backward: O and dO (strides os, dos)
  Strides dos;
  void *dq, *dk, *dv;  // backward: strides dqs, dks, dvs
  Strides dqs, dks, dvs;
  float* partial = nullptr;  // backward, packed gradients: (B, 3, H, 64) column sums over each sequence, or null
  int heads = 1, length = 0;
  float scale = 1.0f;       // of q k^T
  float keep_scale = 1.0f;  // 1 / (1 - p)
  philox::KeepThreshold keep;
  GeneratorState draw;           // forward: the dropout's draw
  uint8_t* keep_bits = nullptr;  // dropout: (B, H, L, kKeepRowBytes), forward writes it, backward reads it
};

// Starts copying rows [0, n) of a (n, 64) operand of row stride `ld` into a swizzled shared tile (n <= 128), 16 bytes
// a copy, without waiting for them (wait_copies does).
template <typename T>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t ld, int n) {
  for (int idx = threadIdx.x; idx < n * 8; idx += kThreads) {
    const int row = idx / 8, chunk = idx % 8;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(tile + swizzled<8>(row, chunk))),
                 "l"(src + row * ld + chunk * 8));
  }
}

// Waits for this thread's load_tile copies, then for the block's.
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_all;\n" ::);
  __syncthreads();
}

// Closes the group of this thread's load_tile copies started since the last group (wait_older_copies waits for them).
__device__ __forceinline__ void end_copy_group() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits for every group of this thread's copies but the newest, then for the block's.
__device__ __forceinline__ void wait_older_copies() {
  asm volatile("cp.async.wait_group 1;\n" ::);
  __syncthreads();
}

// The key bias row of this block's sequence as floats in shared memory (kMaxS of them, 0 past key n), written by the
// block's first threads, visible to all after the block's next barrier: the softmax then reads each key's bias from
// shared memory, not from global memory in the middle of its arithmetic.
template <typename T>
__device__ __forceinline__ void stage_bias(float* sbias, const T* bias, int n) {
  for (int j = threadIdx.x; j < kMaxS; j += kThreads) sbias[j] = j < n ? to_float(bias[j]) : 0.0f;
}

// The 4 keep decisions of elements 4 e4 .. 4 e4 + 3 of the draw (internal::dropout's numbering), as bits 0..3.
__device__ __forceinline__ uint32_t keep_bits(const GeneratorState& draw, philox::KeepThreshold keep, uint64_t e4) {
  uint32_t w[4];
  philox::block(draw.seed, e4, draw.offset, w);
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) bits |= static_cast<uint32_t>(philox::keep_float(w[j], keep.below24)) << j;
  return bits;
}

// The keep decisions of the two elements (row0, j0), (row0, j0 + 1) of one lane (bits 0, 1) and of the same columns
// of row1 (bits 2, 3), j0 = 8 t + 2 (lane % 4); row_first0/1: the index of each row's first element. Lanes l and
// l ^ 1 need the same two Philox blocks (columns j0 & ~3 .. + 3 of both rows): each draws one and they swap.
// Every lane of the warp calls it together.
__device__ __forceinline__ uint32_t lane_keep_bits(const GeneratorState& draw, philox::KeepThreshold keep,
                                                   uint64_t row_first0, uint64_t row_first1, int j0) {
  const bool odd = threadIdx.x % 2 != 0;  // lane % 4 odd: this lane draws row1's block
  const uint32_t mine = keep_bits(draw, keep, ((odd ? row_first1 : row_first0) + (j0 & ~3)) / 4);
  const uint32_t other = __shfl_xor_sync(0xffffffffu, mine, 1);
  const uint32_t b0 = odd ? other : mine, b1 = odd ? mine : other;
  const int shift = j0 & 3;  // 0 or 2
  return ((b0 >> shift) & 3u) | (((b1 >> shift) & 3u) << 2);
}

// The keep decisions as the forward stores them for its backward: one bit per score, bit j % 8 of byte j / 8 of row
// i's kKeepRowBytes bytes (rows numbered b H L + h L + i), so that the backward reads 1 bit per score instead of
// drawing Philox again.
constexpr int kKeepRowBytes = kMaxS / 8;
static_assert(kKeepRowBytes == kShortAttentionKeepBytes);

// Stores the keep decisions of keys key8 .. key8 + 7 (key8 % 8 == 0) of rows row0 and row1, each as one byte, from the
// bits of lane_keep_bits (columns c, c + 1 of each row, c = 2 (lane % 4)). Every lane of the warp calls it together.
__device__ __forceinline__ void store_keep_bits(uint8_t* keep, int64_t row0, int64_t row1, int key8, uint32_t bits) {
  const int quad_lane = threadIdx.x % 4, c = 2 * quad_lane;
  uint32_t x = ((bits & 3u) << c) | (((bits >> 2) & 3u) << (c + 8));  // row0's byte, then row1's
  x |= __shfl_xor_sync(0xffffffffu, x, 1);
  x |= __shfl_xor_sync(0xffffffffu, x, 2);
  if (quad_lane < 2)
    keep[(quad_lane == 0 ? row0 : row1) * kKeepRowBytes + key8 / 8] = static_cast<uint8_t>(x >> (8 * quad_lane));
}

// The keep decisions lane_keep_bits gives, read from the forward's bits: columns j0, j0 + 1 (j0 even) of row0 as bits
// 0, 1 and of row1 as bits 2, 3.
__device__ __forceinline__ uint32_t stored_keep_bits(const uint8_t* keep, int64_t row0, int64_t row1, int j0) {
  const uint32_t b0 = __ldg(keep + row0 * kKeepRowBytes + j0 / 8), b1 = __ldg(keep + row1 * kKeepRowBytes + j0 / 8);
  const int shift = j0 % 8;
  return ((b0 >> shift) & 3u) | (((b1 >> shift) & 3u) << 2);
}

// The scores of one warp's 16 queries (rows r0 ..) against keys 8 t .. 8 t + 7 for t in [t_begin, t_begin + kT):
// s[t][..] = q k^T as accumulators (unscaled).
template <typename T, int kT>
__device__ __forceinline__ void scores(float (&s)[kT][4], const T* sq, const T* sk, int r0, int t_begin, int n_keys) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[t][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, sq + swizzled<8>(r0 + (lane % 8) + ((lane / 8) % 2) * 8, 2 * kk + lane / 16));
#pragma unroll
    for (int t2 = 0; t2 < kT / 2; ++t2) {
      const int n0 = 8 * t_begin + 16 * t2;
      if (n0 >= n_keys) continue;
      uint32_t b[4];
      ldmatrix_x4(b, sk + swizzled<8>(n0 + (lane % 8) + (lane / 16) * 8, 2 * kk + (lane / 8) % 2));
      mma<T>(s[2 * t2], a, b[0], b[1]);
      mma<T>(s[2 * t2 + 1], a, b[2], b[3]);
    }
  }
}

// scale * s + bias_j, -inf where causality or the sequence's end forbids key j (row i).
template <bool kCausal>
__device__ __forceinline__ float logit(float s, float scale, float bias_j, int i, int j, int n_keys) {
  if (j >= n_keys || (kCausal && j > i)) return -std::numeric_limits<float>::infinity();
  return s * scale + bias_j;
}

// The softmax of a warp's rows from their logits s (accumulator fragments: a quad of lanes holds rows r and r + 8)
// and each lane's maxima of them mx: mx becomes each row's maximum, s exp(s - mx), sum each row's sum of those.
template <int kT>
__device__ __forceinline__ void softmax_rows(float (&s)[kT][4], float (&mx)[2], float (&sum)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 1));
    mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 2));
    sum[half] = 0.0f;
  }
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[t][e] = exp2f((s[t][e] - mx[e / 2]) * kLog2e);
      sum[e / 2] += s[t][e];
    }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    sum[half] += __shfl_xor_sync(0xffffffffu, sum[half], 1);
    sum[half] += __shfl_xor_sync(0xffffffffu, sum[half], 2);
  }
}

template <typename T, bool kBias, bool kCausal, bool kDrop>
__global__ void __launch_bounds__(kThreads) short_attention_forward_kernel(Params p) {
  extern __shared__ uint4 shared_raw[];
  T* sq = reinterpret_cast<T*>(shared_raw);
  T* sk = sq + kTile64;
  T* sv = sk + kTile64;
  float* sbias = reinterpret_cast<float*>(sv + kTile64);  // kMaxS floats (kBias)
  const int n = p.length;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  // Q and K in one group of copies, V in a second: the scores and the softmax start before V has arrived.
  load_tile(sq, static_cast<const T*>(p.q) + b * p.qs.b + h * p.qs.h, p.qs.x, n);
  load_tile(sk, static_cast<const T*>(p.k) + b * p.ks.b + h * p.ks.h, p.ks.x, n);
  end_copy_group();
  load_tile(sv, static_cast<const T*>(p.v) + b * p.vs.b + h * p.vs.h, p.vs.x, n);
  end_copy_group();
  if constexpr (kBias) stage_bias(sbias, static_cast<const T*>(p.bias) + b * p.bias_b, n);
  wait_older_copies();  // Q, K and the bias row
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = 16 * warp;
  if (r0 >= n) {  // no queries for this warp; it still takes part in the block's barrier for V
    wait_copies();
    return;
  }
  GeneratorState draw = p.draw;
  if constexpr (kDrop) {
    if (draw.device_offset != nullptr) draw.offset = *draw.device_offset;  // a CUDA graph's draw
  }
  constexpr int kT = kMaxS / 8;
  float s[kT][4];
  scores<T, kT>(s, sq, sk, r0, 0, n);

  const int c = 2 * (lane % 4);
  const int rows[2] = {r0 + lane / 4, r0 + lane / 4 + 8};
  float mx[2] = {-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int j = 8 * t + c + e;
      const float bj = kBias ? sbias[j] : 0.0f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        s[t][2 * half + e] = logit<kCausal>(s[t][2 * half + e], p.scale, bj, rows[half], j, n);
        mx[half] = fmaxf(mx[half], s[t][2 * half + e]);
      }
    }
  float sum[2];
  softmax_rows<kT>(s, mx, sum);
  const float inv[2] = {1.0f / sum[0], 1.0f / sum[1]};
  if (p.stats != nullptr && lane % 4 == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (rows[half] < n) p.stats[static_cast<int64_t>(bh) * n + rows[half]] = mx[half] + logf(sum[half]);
    }
  }
  // Probabilities, with the dropout applied, as the A operand of P V.
  const uint64_t row_first[2] = {(static_cast<uint64_t>(bh) * n + rows[0]) * n,
                                 (static_cast<uint64_t>(bh) * n + rows[1]) * n};
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    if (8 * t >= n) continue;  // the same for the whole warp
    uint32_t bits = 15u;
    if constexpr (kDrop) {
      bits = lane_keep_bits(draw, p.keep, row_first[0], row_first[1], 8 * t + c);
      store_keep_bits(p.keep_bits, static_cast<int64_t>(bh) * n + rows[0], static_cast<int64_t>(bh) * n + rows[1],
                      8 * t, bits);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float f0 = inv[half], f1 = inv[half];
      if constexpr (kDrop) {
        f0 = bits >> (2 * half) & 1u ? f0 * p.keep_scale : 0.0f;
        f1 = bits >> (2 * half) & 2u ? f1 * p.keep_scale : 0.0f;
      }
      s[t][2 * half] *= f0;
      s[t][2 * half + 1] *= f1;
    }
  }
  wait_copies();  // V
  float o[kD / 8][4];
#pragma unroll
  for (int t = 0; t < kD / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[t][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kMaxS / 16; ++kk) {
    if (16 * kk >= n) continue;
    const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                           pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int n2 = 0; n2 < kD / 16; ++n2) {
      uint32_t bm[4];
      ldmatrix_x4_trans(bm, sv + swizzled<8>(16 * kk + (lane % 8) + ((lane / 8) % 2) * 8, 2 * n2 + lane / 16));
      mma<T>(o[2 * n2], a, bm[0], bm[1]);
      mma<T>(o[2 * n2 + 1], a, bm[2], bm[3]);
    }
  }
  T* out = static_cast<T*>(p.out) + b * p.os.b + h * p.os.h;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (rows[half] >= n) continue;
#pragma unroll
    for (int t = 0; t < kD / 8; ++t) {
      *reinterpret_cast<uint32_t*>(out + rows[half] * p.os.x + 8 * t + c) =
          pack2<T>(o[t][2 * half], o[t][2 * half + 1]);
    }
  }
}

// Backward, over the keys in two halves of 64, so that Z and dS of one half (2 x 16 KiB) sit in shared memory beside
// Q, K, V and dO (64 KiB) and two blocks share an SM (one loads while the other computes). First D_i = rowsum(dO * O)
// for every query. Then per half: warp w on queries 16 w ..: P from the statistics, dZ = dO V^T, the keep mask;
// Z = P * mask / (1 - p) and dS = P * (dZ * mask / (1 - p) - D_i) to shared memory; then warp w adds dS K over the
// half's keys to dQ of its queries, and computes dK and dV (dS^T Q, Z^T dO) of the half's keys 16 (w % 4) .. for head
// columns 32 (w / 4) .. + 31.
template <typename T, bool kBias, bool kCausal, bool kDrop>
__global__ void __launch_bounds__(kThreads, 2) short_attention_backward_kernel(Params p) {
  extern __shared__ uint4 shared_raw[];
  T* sq = reinterpret_cast<T*>(shared_raw);
  T* sk = sq + kTile64;
  T* sv = sk + kTile64;
  T* sdo = sv + kTile64;
  T* sz = sdo + kTile64;  // (128, 64): queries x the half's keys
  T* sds = sz + kTile64;
  float* sbias = reinterpret_cast<float*>(sds + kTile64);  // kMaxS floats (kBias)
  const int n = p.length;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  load_tile(sq, static_cast<const T*>(p.q) + b * p.qs.b + h * p.qs.h, p.qs.x, n);
  load_tile(sk, static_cast<const T*>(p.k) + b * p.ks.b + h * p.ks.h, p.ks.x, n);
  load_tile(sv, static_cast<const T*>(p.v) + b * p.vs.b + h * p.vs.h, p.vs.x, n);
  load_tile(sdo, static_cast<const T*>(p.d_o) + b * p.dos.b + h * p.dos.h, p.dos.x, n);
  if constexpr (kBias) stage_bias(sbias, static_cast<const T*>(p.bias) + b * p.bias_b, n);
  wait_copies();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = 16 * warp;
  const int c = 2 * (lane % 4);
  const bool active = r0 < n;  // this warp has queries (no early return: the block synchronises per half)
  const int rows[2] = {r0 + lane / 4, r0 + lane / 4 + 8};
  // D_i: lane l of a quad sums columns 16 (l % 4) .. + 15 of its rows.
  float d_row[2] = {0.0f, 0.0f}, lse[2] = {0.0f, 0.0f};
  if (active) {
    const T* o = static_cast<const T*>(p.o) + b * p.os.b + h * p.os.h;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float acc = 0.0f;
#pragma unroll
      for (int ch = 0; ch < 2; ++ch) {
        const int chunk = 2 * (lane % 4) + ch;
        const uint4 ov = *reinterpret_cast<const uint4*>(o + rows[half] * p.os.x + 8 * chunk);
        const uint4 gv = *reinterpret_cast<const uint4*>(sdo + swizzled<8>(rows[half], chunk));
        const uint32_t* ow = reinterpret_cast<const uint32_t*>(&ov);
        const uint32_t* gw = reinterpret_cast<const uint32_t*>(&gv);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float2 of = unpack2<T>(ow[w]), gf = unpack2<T>(gw[w]);
          acc += of.x * gf.x + of.y * gf.y;
        }
      }
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc += __shfl_xor_sync(0xffffffffu, acc, 2);
      d_row[half] = acc;
      lse[half] = p.stats[static_cast<int64_t>(bh) * n + rows[half]];
    }
  }
  T* dq = static_cast<T*>(p.dq) + b * p.dqs.b + h * p.dqs.h;
  T* dk = static_cast<T*>(p.dk) + b * p.dks.b + h * p.dks.h;
  T* dv = static_cast<T*>(p.dv) + b * p.dvs.b + h * p.dvs.h;
  const int kt = warp % 4, dh = warp / 4;  // this warp's key tile and head columns in each half
  float acc_q[kD / 8][4];
#pragma unroll
  for (int t = 0; t < kD / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_q[t][e] = 0.0f;
  float sums_kv[2][4][2];  // with p.partial: this thread's sums of dK and dV (as stored) over its keys, per column
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < 4; ++t) sums_kv[m][t][0] = sums_kv[m][t][1] = 0.0f;

  for (int kh = 0; kh < kMaxS / 64; ++kh) {
    const int key0 = 64 * kh;
    if (key0 >= n) break;  // the same for the whole block
    const int keys_here = min(64, n - key0);
    if (active) {
#pragma unroll
      for (int sub = 0; sub < 2; ++sub) {  // 32 keys at a time: fewer registers
        constexpr int kT = 4;
        const int t_begin = 8 * kh + kT * sub;
        if (8 * t_begin >= n) continue;
        float s[kT][4], dz[kT][4];
        scores<T, kT>(s, sq, sk, r0, t_begin, n);
        scores<T, kT>(dz, sdo, sv, r0, t_begin, n);  // dO V^T: the same product shape as q k^T
#pragma unroll
        for (int t = 0; t < kT; ++t) {
          const int j0 = 8 * (t_begin + t) + c;
          if (j0 >= n) continue;  // the same for the whole warp (n is a multiple of 16)
          uint32_t both = 15u;
          if constexpr (kDrop) {
            both = stored_keep_bits(p.keep_bits, static_cast<int64_t>(bh) * n + rows[0],
                                    static_cast<int64_t>(bh) * n + rows[1], j0);
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int i = rows[half];
            const uint32_t bits = both >> (2 * half);
            float z[2], ds[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = j0 + e;
              const float bj = kBias ? sbias[j] : 0.0f;
              const float x = logit<kCausal>(s[t][2 * half + e], p.scale, bj, i, j, n);
              const float prob = exp2f((x - lse[half]) * kLog2e);
              const float m = kDrop ? (bits >> e & 1u ? p.keep_scale : 0.0f) : 1.0f;
              z[e] = prob * m;
              ds[e] = prob * (dz[t][2 * half + e] * m - d_row[half]);
            }
            const int jl = j0 - key0;  // the column within the half
            const int off = swizzled<8>(i, jl >> 3) + (jl & 7);
            *reinterpret_cast<uint32_t*>(sz + off) = pack2<T>(z[0], z[1]);
            *reinterpret_cast<uint32_t*>(sds + off) = pack2<T>(ds[0], ds[1]);
          }
        }
      }
    }
    __syncthreads();
    if (active) {  // dQ of this warp's queries += dS K over the half's keys
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (16 * kk >= keys_here) continue;
        uint32_t a[4];
        ldmatrix_x4(a, sds + swizzled<8>(r0 + (lane % 8) + ((lane / 8) % 2) * 8, 2 * kk + lane / 16));
#pragma unroll
        for (int n2 = 0; n2 < kD / 16; ++n2) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk,
                            sk + swizzled<8>(key0 + 16 * kk + (lane % 8) + ((lane / 8) % 2) * 8, 2 * n2 + lane / 16));
          mma<T>(acc_q[2 * n2], a, bk[0], bk[1]);
          mma<T>(acc_q[2 * n2 + 1], a, bk[2], bk[3]);
        }
      }
    }
    const int m0 = 16 * kt;  // this warp's keys within the half
    if (m0 < keys_here) {
      float acc_k[4][4], acc_v[4][4];
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_k[t][e] = acc_v[t][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kMaxS / 16; ++kk) {  // queries, 16 at a time
        if (16 * kk >= n) continue;
        const int row_t = 16 * kk + (lane % 8) + (lane / 16) * 8, chunk_t = m0 / 8 + (lane / 8) % 2;
        uint32_t a_dst[4], a_zt[4];
        ldmatrix_x4_trans(a_dst, sds + swizzled<8>(row_t, chunk_t));
        ldmatrix_x4_trans(a_zt, sz + swizzled<8>(row_t, chunk_t));
#pragma unroll
        for (int n2 = 0; n2 < 2; ++n2) {
          const int row_b = 16 * kk + (lane % 8) + ((lane / 8) % 2) * 8, chunk_b = 4 * dh + 2 * n2 + lane / 16;
          uint32_t bq[4], bdo[4];
          ldmatrix_x4_trans(bq, sq + swizzled<8>(row_b, chunk_b));
          ldmatrix_x4_trans(bdo, sdo + swizzled<8>(row_b, chunk_b));
          mma<T>(acc_k[2 * n2], a_dst, bq[0], bq[1]);
          mma<T>(acc_k[2 * n2 + 1], a_dst, bq[2], bq[3]);
          mma<T>(acc_v[2 * n2], a_zt, bdo[0], bdo[1]);
          mma<T>(acc_v[2 * n2 + 1], a_zt, bdo[2], bdo[3]);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = key0 + m0 + lane / 4 + 8 * half;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const int col = 32 * dh + 8 * t + c;
          const uint32_t wk = pack2<T>(acc_k[t][2 * half] * p.scale, acc_k[t][2 * half + 1] * p.scale);
          const uint32_t wv = pack2<T>(acc_v[t][2 * half], acc_v[t][2 * half + 1]);
          *reinterpret_cast<uint32_t*>(dk + row * p.dks.x + col) = wk;
          *reinterpret_cast<uint32_t*>(dv + row * p.dvs.x + col) = wv;
          const float2 fk = unpack2<T>(wk), fv = unpack2<T>(wv);
          sums_kv[0][t][0] += fk.x;
          sums_kv[0][t][1] += fk.y;
          sums_kv[1][t][0] += fv.x;
          sums_kv[1][t][1] += fv.y;
        }
      }
    }
    __syncthreads();  // every warp has read this half's Z and dS before the next half writes them
  }
  float sums_q[kD / 8][2];  // with p.partial: this thread's sums of dQ (as stored) over its two rows, per column
#pragma unroll
  for (int t = 0; t < kD / 8; ++t) {
    sums_q[t][0] = sums_q[t][1] = 0.0f;
    if (!active) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t wq = pack2<T>(acc_q[t][2 * half] * p.scale, acc_q[t][2 * half + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dq + rows[half] * p.dqs.x + 8 * t + c) = wq;
      const float2 f = unpack2<T>(wq);
      sums_q[t][0] += f.x;
      sums_q[t][1] += f.y;
    }
  }
  if (p.partial == nullptr) return;  // the same for the whole block
  // Z's memory (free since the loop's last synchronisation) takes the warps' sums: (kWarps, 3, 64).
  float* warp_sums = reinterpret_cast<float*>(sz);
#pragma unroll
  for (int t = 0; t < kD / 8; ++t)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = sums_q[t][e];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (lane < 4) warp_sums[(warp * 3) * kD + 8 * t + c + e] = v;
    }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = sums_kv[m][t][e];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (lane < 4) {
          float* row = warp_sums + (warp * 3 + 1 + m) * kD;
          row[32 * dh + 8 * t + c + e] = v;           // this warp's head columns
          row[32 * (1 - dh) + 8 * t + c + e] = 0.0f;  // the others, which it did not compute
        }
      }
  __syncthreads();
  if (threadIdx.x < 3 * kD) {
    const int m = threadIdx.x / kD, col = threadIdx.x % kD;
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += warp_sums[(w * 3 + m) * kD + col];  // in warp order: deterministic
    p.partial[((static_cast<int64_t>(b) * 3 + m) * p.heads + h) * kD + col] = total;
  }
}

// out[col] = the sum over b of partial[b][col] (B rows of `cols`), in order of b.
__global__ void sum_over_sequences_kernel(const float* __restrict__ partial, float* __restrict__ out, int batch,
                                          int cols) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float total = 0.0f;
  for (int b = 0; b < batch; ++b) total += partial[static_cast<int64_t>(b) * cols + col];
  out[col] = total;
}

// ---------------------------------------------------------------- float32 in TF32
// The same computations for float32 q, k, v where TF32 is allowed (cuda::allow_tf32(), as for kiln's float32
// products): mma.sync m16n8k8 on TF32-rounded operands, read from shared memory one element at a time, rows padded to
// 68 floats so that a fragment's 32 reads fall in distinct banks (or two to a bank). Fragments (g = lane / 4,
// t = lane % 4): A (16 x 8) rows g and g + 8 of columns t and t + 4; B (8 x 8) rows t and t + 4 of column g;
// accumulators as m16n8k16's (rows g and g + 8, columns 2 t and 2 t + 1).
constexpr int kLd32 = 68;               // floats a padded row
constexpr int kTile32 = kMaxS * kLd32;  // floats of a (128, 64) tile

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Starts copying rows [0, n) of a (n, 64) float32 operand of row stride `ld` into a padded tile (16 bytes a copy).
__device__ __forceinline__ void load_tile32(float* tile, const float* src, int64_t ld, int n) {
  for (int idx = threadIdx.x; idx < n * 16; idx += kThreads) {
    const int row = idx / 16, chunk = idx % 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(tile + row * kLd32 + chunk * 4)),
                 "l"(src + row * ld + chunk * 4));
  }
}

// A fragment of rows r0 .. r0 + 15, columns k0 .. k0 + 7 of a padded tile.
__device__ __forceinline__ void frag_a32(uint32_t (&a)[4], const float* tile, int r0, int k0) {
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  a[0] = to_tf32(tile[(r0 + g) * kLd32 + k0 + t]);
  a[1] = to_tf32(tile[(r0 + g + 8) * kLd32 + k0 + t]);
  a[2] = to_tf32(tile[(r0 + g) * kLd32 + k0 + t + 4]);
  a[3] = to_tf32(tile[(r0 + g + 8) * kLd32 + k0 + t + 4]);
}

// A fragment of the transpose: A[m][k] = tile[k0 + k][m0 + m], m < 16, k < 8.
__device__ __forceinline__ void frag_at32(uint32_t (&a)[4], const float* tile, int m0, int k0) {
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  a[0] = to_tf32(tile[(k0 + t) * kLd32 + m0 + g]);
  a[1] = to_tf32(tile[(k0 + t) * kLd32 + m0 + g + 8]);
  a[2] = to_tf32(tile[(k0 + t + 4) * kLd32 + m0 + g]);
  a[3] = to_tf32(tile[(k0 + t + 4) * kLd32 + m0 + g + 8]);
}

// The float32 forward: as short_attention_forward_kernel. Column g of key tile j of q k^T is key
// 8 j + g / 2 + 4 (g % 2), so that the accumulators hold keys 8 j + t and 8 j + t + 4: the A fragment of P V as they
// stand, with no shuffle.
template <bool kBias, bool kCausal, bool kDrop>
__global__ void __launch_bounds__(kThreads) short_attention_forward_tf32_kernel(Params p) {
  extern __shared__ uint4 shared_raw[];
  float* sq = reinterpret_cast<float*>(shared_raw);
  float* sk = sq + kTile32;
  float* sv = sk + kTile32;
  const int n = p.length;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  load_tile32(sq, static_cast<const float*>(p.q) + b * p.qs.b + h * p.qs.h, p.qs.x, n);
  load_tile32(sk, static_cast<const float*>(p.k) + b * p.ks.b + h * p.ks.h, p.ks.x, n);
  load_tile32(sv, static_cast<const float*>(p.v) + b * p.vs.b + h * p.vs.h, p.vs.x, n);
  wait_copies();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int r0 = 16 * warp;
  if (r0 >= n) return;
  GeneratorState draw = p.draw;
  if constexpr (kDrop) {
    if (draw.device_offset != nullptr) draw.offset = *draw.device_offset;  // a CUDA graph's draw
  }
  constexpr int kT = kMaxS / 8;
  float s[kT][4];
#pragma unroll
  for (int j = 0; j < kT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kD / 8; ++kk) {
    uint32_t a[4];
    frag_a32(a, sq, r0, 8 * kk);
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      if (8 * j >= n) continue;
      const float* key_row = sk + (8 * j + g / 2 + 4 * (g % 2)) * kLd32 + 8 * kk;
      mma_tf32(s[j], a, to_tf32(key_row[t]), to_tf32(key_row[t + 4]));
    }
  }
  // s[j][2 half + e]: query rows[half], key 8 j + t + 4 e.
  const int rows[2] = {r0 + g, r0 + g + 8};
  const float* bias = kBias ? static_cast<const float*>(p.bias) + b * p.bias_b : nullptr;
  float mx[2] = {-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
#pragma unroll
  for (int j = 0; j < kT; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = 8 * j + t + 4 * e;
      const float bj = kBias && key < n ? bias[key] : 0.0f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        s[j][2 * half + e] = logit<kCausal>(s[j][2 * half + e], p.scale, bj, rows[half], key, n);
        mx[half] = fmaxf(mx[half], s[j][2 * half + e]);
      }
    }
  float sum[2];
  softmax_rows<kT>(s, mx, sum);
  const float inv[2] = {1.0f / sum[0], 1.0f / sum[1]};
  if (t == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half)
      p.stats[static_cast<int64_t>(bh) * n + rows[half]] = mx[half] + logf(sum[half]);
  }
  const uint64_t row_first[2] = {(static_cast<uint64_t>(bh) * n + rows[0]) * n,
                                 (static_cast<uint64_t>(bh) * n + rows[1]) * n};
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    if (8 * j >= n) continue;  // the same for the whole warp
    // The quad's four Philox blocks (rows[0] and rows[1], keys 8 j .. + 3 and 8 j + 4 .. + 7): one a lane.
    uint32_t blocks[4] = {15u, 15u, 15u, 15u};
    if constexpr (kDrop) {
      const uint32_t mine = keep_bits(draw, p.keep, (row_first[t / 2] + 8 * j + 4 * (t % 2)) / 4);
#pragma unroll
      for (int x = 0; x < 4; ++x) blocks[x] = __shfl_sync(0xffffffffu, mine, (lane & ~3) + x);
      // Row half's keys 8 j .. + 7 are blocks 2 half and 2 half + 1: lane t < 2 of the quad stores row t's byte.
      if (t < 2) {  // (selects, not blocks[2 t]: an index known only at run time would put the arrays in local memory)
        const uint32_t lo = t == 0 ? blocks[0] : blocks[2], hi = t == 0 ? blocks[1] : blocks[3];
        const int row = t == 0 ? rows[0] : rows[1];
        p.keep_bits[(static_cast<int64_t>(bh) * n + row) * kKeepRowBytes + j] = static_cast<uint8_t>(lo | hi << 4);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float f = inv[half];
        if constexpr (kDrop) f = blocks[2 * half + e] >> t & 1u ? f * p.keep_scale : 0.0f;
        s[j][2 * half + e] *= f;
      }
  }
  float o[kD / 8][4];
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    if (8 * j >= n) continue;
    const uint32_t a[4] = {to_tf32(s[j][0]), to_tf32(s[j][2]), to_tf32(s[j][1]), to_tf32(s[j][3])};
#pragma unroll
    for (int nt = 0; nt < kD / 8; ++nt) {
      mma_tf32(o[nt], a, to_tf32(sv[(8 * j + t) * kLd32 + 8 * nt + g]),
               to_tf32(sv[(8 * j + t + 4) * kLd32 + 8 * nt + g]));
    }
  }
  float* out = static_cast<float*>(p.out) + b * p.os.b + h * p.os.h;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int nt = 0; nt < kD / 8; ++nt) {
      *reinterpret_cast<float2*>(out + rows[half] * p.os.x + 8 * nt + 2 * t) =
          make_float2(o[nt][2 * half], o[nt][2 * half + 1]);
    }
}

// The float32 backward: as short_attention_backward_kernel (two halves of the keys), with Z and dS kept in float.
template <bool kBias, bool kCausal, bool kDrop>
__global__ void __launch_bounds__(kThreads) short_attention_backward_tf32_kernel(Params p) {
  extern __shared__ uint4 shared_raw[];
  float* sq = reinterpret_cast<float*>(shared_raw);
  float* sk = sq + kTile32;
  float* sv = sk + kTile32;
  float* sdo = sv + kTile32;
  float* sz = sdo + kTile32;  // (128, 64): queries x the half's keys
  float* sds = sz + kTile32;
  const int n = p.length;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  load_tile32(sq, static_cast<const float*>(p.q) + b * p.qs.b + h * p.qs.h, p.qs.x, n);
  load_tile32(sk, static_cast<const float*>(p.k) + b * p.ks.b + h * p.ks.h, p.ks.x, n);
  load_tile32(sv, static_cast<const float*>(p.v) + b * p.vs.b + h * p.vs.h, p.vs.x, n);
  load_tile32(sdo, static_cast<const float*>(p.d_o) + b * p.dos.b + h * p.dos.h, p.dos.x, n);
  wait_copies();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int r0 = 16 * warp;
  const bool active = r0 < n;  // no early return: the block synchronises per half
  const int rows[2] = {r0 + g, r0 + g + 8};
  float d_row[2] = {0.0f, 0.0f}, lse[2] = {0.0f, 0.0f};
  if (active) {  // D_i: lane t of a quad sums columns 16 t .. + 15 of its rows
    const float* o = static_cast<const float*>(p.o) + b * p.os.b + h * p.os.h;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float acc = 0.0f;
#pragma unroll
      for (int ch = 0; ch < 4; ++ch) {
        const float4 ov = *reinterpret_cast<const float4*>(o + rows[half] * p.os.x + 16 * t + 4 * ch);
        const float4 gv = *reinterpret_cast<const float4*>(sdo + rows[half] * kLd32 + 16 * t + 4 * ch);
        acc += ov.x * gv.x + ov.y * gv.y + ov.z * gv.z + ov.w * gv.w;
      }
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc += __shfl_xor_sync(0xffffffffu, acc, 2);
      d_row[half] = acc;
      lse[half] = p.stats[static_cast<int64_t>(bh) * n + rows[half]];
    }
  }
  const float* bias = kBias ? static_cast<const float*>(p.bias) + b * p.bias_b : nullptr;
  float* dq = static_cast<float*>(p.dq) + b * p.dqs.b + h * p.dqs.h;
  float* dk = static_cast<float*>(p.dk) + b * p.dks.b + h * p.dks.h;
  float* dv = static_cast<float*>(p.dv) + b * p.dvs.b + h * p.dvs.h;
  const int kt = warp % 4, dh = warp / 4;  // this warp's key tile and head columns in each half
  const int c = 2 * t;
  float acc_q[kD / 8][4];
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_q[nt][e] = 0.0f;
  float sums_kv[2][4][2];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) sums_kv[m][nt][0] = sums_kv[m][nt][1] = 0.0f;

  for (int kh = 0; kh < kMaxS / 64; ++kh) {
    const int key0 = 64 * kh;
    if (key0 >= n) break;  // the same for the whole block
    const int keys_here = min(64, n - key0);
    if (active) {
#pragma unroll
      for (int sub = 0; sub < 2; ++sub) {  // 32 keys at a time
        constexpr int kT = 4;
        const int first = key0 + 32 * sub;
        if (first >= n) continue;
        float s[kT][4], dz[kT][4];
#pragma unroll
        for (int j = 0; j < kT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[j][e] = dz[j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kD / 8; ++kk) {
          uint32_t aq[4], ado[4];
          frag_a32(aq, sq, r0, 8 * kk);
          frag_a32(ado, sdo, r0, 8 * kk);
#pragma unroll
          for (int j = 0; j < kT; ++j) {
            if (first + 8 * j >= n) continue;
            const float* key_row = sk + (first + 8 * j + g) * kLd32 + 8 * kk;
            const float* value_row = sv + (first + 8 * j + g) * kLd32 + 8 * kk;
            mma_tf32(s[j], aq, to_tf32(key_row[t]), to_tf32(key_row[t + 4]));
            mma_tf32(dz[j], ado, to_tf32(value_row[t]), to_tf32(value_row[t + 4]));
          }
        }
#pragma unroll
        for (int j = 0; j < kT; ++j) {
          const int j0 = first + 8 * j + c;
          if (first + 8 * j >= n) continue;  // the same for the whole warp
          uint32_t both = 15u;
          if constexpr (kDrop) {
            both = stored_keep_bits(p.keep_bits, static_cast<int64_t>(bh) * n + rows[0],
                                    static_cast<int64_t>(bh) * n + rows[1], j0);
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int i = rows[half];
            const uint32_t bits = both >> (2 * half);
            float z[2], ds[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = j0 + e;
              const float bj = kBias ? bias[key] : 0.0f;
              const float x = logit<kCausal>(s[j][2 * half + e], p.scale, bj, i, key, n);
              const float prob = exp2f((x - lse[half]) * kLog2e);
              const float m = kDrop ? (bits >> e & 1u ? p.keep_scale : 0.0f) : 1.0f;
              z[e] = prob * m;
              ds[e] = prob * (dz[j][2 * half + e] * m - d_row[half]);
            }
            *reinterpret_cast<float2*>(sz + i * kLd32 + (j0 - key0)) = make_float2(z[0], z[1]);
            *reinterpret_cast<float2*>(sds + i * kLd32 + (j0 - key0)) = make_float2(ds[0], ds[1]);
          }
        }
      }
    }
    __syncthreads();
    if (active) {  // dQ of this warp's queries += dS K over the half's keys
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        if (8 * kk >= keys_here) continue;
        uint32_t a[4];
        frag_a32(a, sds, r0, 8 * kk);
#pragma unroll
        for (int nt = 0; nt < kD / 8; ++nt) {
          mma_tf32(acc_q[nt], a, to_tf32(sk[(key0 + 8 * kk + t) * kLd32 + 8 * nt + g]),
                   to_tf32(sk[(key0 + 8 * kk + t + 4) * kLd32 + 8 * nt + g]));
        }
      }
    }
    const int m0 = 16 * kt;  // this warp's keys within the half
    if (m0 < keys_here) {
      float acc_k[4][4], acc_v[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_k[nt][e] = acc_v[nt][e] = 0.0f;
#pragma unroll 4
      for (int kk = 0; kk < kMaxS / 8; ++kk) {  // queries, 8 at a time
        if (8 * kk >= n) continue;
        uint32_t a_ds[4], a_z[4];
        frag_at32(a_ds, sds, m0, 8 * kk);
        frag_at32(a_z, sz, m0, 8 * kk);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int col = 32 * dh + 8 * nt + g;
          mma_tf32(acc_k[nt], a_ds, to_tf32(sq[(8 * kk + t) * kLd32 + col]),
                   to_tf32(sq[(8 * kk + t + 4) * kLd32 + col]));
          mma_tf32(acc_v[nt], a_z, to_tf32(sdo[(8 * kk + t) * kLd32 + col]),
                   to_tf32(sdo[(8 * kk + t + 4) * kLd32 + col]));
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = key0 + m0 + g + 8 * half;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int col = 32 * dh + 8 * nt + c;
          const float2 wk = make_float2(acc_k[nt][2 * half] * p.scale, acc_k[nt][2 * half + 1] * p.scale);
          const float2 wv = make_float2(acc_v[nt][2 * half], acc_v[nt][2 * half + 1]);
          *reinterpret_cast<float2*>(dk + row * p.dks.x + col) = wk;
          *reinterpret_cast<float2*>(dv + row * p.dvs.x + col) = wv;
          sums_kv[0][nt][0] += wk.x;
          sums_kv[0][nt][1] += wk.y;
          sums_kv[1][nt][0] += wv.x;
          sums_kv[1][nt][1] += wv.y;
        }
      }
    }
    __syncthreads();  // every warp has read this half's Z and dS before the next half writes them
  }
  float sums_q[kD / 8][2];
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt) {
    sums_q[nt][0] = sums_q[nt][1] = 0.0f;
    if (!active) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float2 wq = make_float2(acc_q[nt][2 * half] * p.scale, acc_q[nt][2 * half + 1] * p.scale);
      *reinterpret_cast<float2*>(dq + rows[half] * p.dqs.x + 8 * nt + c) = wq;
      sums_q[nt][0] += wq.x;
      sums_q[nt][1] += wq.y;
    }
  }
  if (p.partial == nullptr) return;  // the same for the whole block
  float* warp_sums = sz;             // (kWarps, 3, 64), free since the loop's last synchronisation
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = sums_q[nt][e];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (lane < 4) warp_sums[(warp * 3) * kD + 8 * nt + c + e] = v;
    }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = sums_kv[m][nt][e];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (lane < 4) {
          float* row = warp_sums + (warp * 3 + 1 + m) * kD;
          row[32 * dh + 8 * nt + c + e] = v;
          row[32 * (1 - dh) + 8 * nt + c + e] = 0.0f;
        }
      }
  __syncthreads();
  if (threadIdx.x < 3 * kD) {
    const int m = threadIdx.x / kD, col = threadIdx.x % kD;
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += warp_sums[(w * 3 + m) * kD + col];  // in warp order: deterministic
    p.partial[((static_cast<int64_t>(b) * 3 + m) * p.heads + h) * kD + col] = total;
  }
}

constexpr size_t kForwardShared32 = 3 * kTile32 * 4;   // Q, K, V: 102 KiB
constexpr size_t kBackwardShared32 = 6 * kTile32 * 4;  // Q, K, V, dO, Z and dS of half the keys: 204 KiB

constexpr size_t kBiasShared = kMaxS * sizeof(float);              // the key bias row (stage_bias)
constexpr size_t kForwardShared = 3 * kTile64 * 2 + kBiasShared;   // Q, K, V: 48 KiB, and the bias
constexpr size_t kBackwardShared = 6 * kTile64 * 2 + kBiasShared;  // Q, K, V, dO, Z and dS of half the keys: 96 KiB

// The shared memory a block of either kernel needs for q's dtype (the backward's, the larger).
size_t shared_needed(DType dtype) { return dtype == DType::Float32 ? kBackwardShared32 : kBackwardShared; }

// The most shared memory a block may opt into on `device` (cudaDevAttrMaxSharedMemoryPerBlockOptin), asked once.
size_t shared_optin(int device) {
  static std::mutex mutex;
  static std::map<int, size_t> known;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(device);
  if (it == known.end()) {
    int bytes = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "short_attention");
    it = known.emplace(device, static_cast<size_t>(bytes)).first;
  }
  return it->second;
}

Strides strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

bool rows_ok(const Tensor& t) {
  if (t.stride(3) != 1 || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d) {
    if (t.size(d) != 1 && t.stride(d) % 8 != 0) return false;
  }
  return true;
}

// Calls f(tag, bias, causal, drop) with T's device type and the three flags as compile-time constants.
template <typename F>
void with_variant(DType dtype, bool bias, bool causal, bool drop, F&& f) {
  auto flags = [&](auto tag) {
    auto b2 = [&](auto kb) {
      auto c2 = [&](auto kc) {
        if (drop) {
          f(tag, kb, kc, std::true_type{});
        } else {
          f(tag, kb, kc, std::false_type{});
        }
      };
      if (causal) {
        c2(std::true_type{});
      } else {
        c2(std::false_type{});
      }
    };
    if (bias) {
      b2(std::true_type{});
    } else {
      b2(std::false_type{});
    }
  };
  if (dtype == DType::BFloat16) {
    flags(std::type_identity<__nv_bfloat16>{});
  } else if (dtype == DType::Float16) {
    flags(std::type_identity<__half>{});
  } else {
    flags(std::type_identity<float>{});
  }
}

template <typename Kernel>
void launch(Kernel kernel, size_t shared, unsigned blocks, cudaStream_t stream, const Params& p) {
  if (shared > 48 * 1024) {
    // More than the default: the kernel's limit is raised once per device (the warm-up's eager launches do it
    // before any CUDA graph capture).
    static std::mutex mutex;
    static std::set<std::pair<const void*, int>> raised;
    int device = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device), "short_attention");
    const std::lock_guard<std::mutex> lock(mutex);
    const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), device};
    if (!raised.contains(key)) {  // remembered only once raised, so that a failure is reported again next time
      KILN_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)),
          "short_attention");
      raised.insert(key);
    }
  }
  kernel<<<blocks, kThreads, shared, stream>>>(p);
}

Params common_params(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                     const ShortAttentionConfig& cfg, const GeneratorState& draw) {
  Params p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.qs = strides_of(q);
  p.ks = strides_of(k);
  p.vs = strides_of(v);
  if (bias.defined()) {
    p.bias = bias.data_ptr();
    p.bias_b = bias.size(0) == 1 ? 0 : bias.stride(0);
  }
  p.heads = static_cast<int>(q.size(1));
  p.length = static_cast<int>(q.size(2));
  p.scale = static_cast<float>(cfg.scale);
  if (cfg.dropout_p > 0) {
    p.keep_scale = static_cast<float>(1.0 / (1.0 - cfg.dropout_p));
    p.keep = philox::keep_threshold(1.0 - cfg.dropout_p);
    p.draw = draw;
  }
  return p;
}

}  // namespace

Tensor empty_bxhd(int64_t B, int64_t H, int64_t X, int64_t D, const TensorOptions& options) {
  return internal::empty({B, X, H, D}, options).permute({0, 2, 1, 3});
}

bool packed_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), E = q.size(3);
  if (k.shape() != q.shape() || v.shape() != q.shape()) return false;
  const Strides s{L * 3 * H * E, E, 3 * H * E};
  auto same = [&](const Tensor& t) {
    return t.stride(0) == s.b && t.stride(1) == s.h && t.stride(2) == s.x && t.stride(3) == 1;
  };
  if (!same(q) || !same(k) || !same(v)) return false;
  if (q.impl().storage() != k.impl().storage() || q.impl().storage() != v.impl().storage()) return false;
  return B > 0 && k.offset() == q.offset() + H * E && v.offset() == q.offset() + 2 * H * E;
}

FusedAttentionGrads empty_attention_grads(const Tensor& q, const Tensor& k, const Tensor& v, bool packed) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2), E = q.size(3), Ev = v.size(3);
  if (packed) {
    const Tensor buffer = internal::empty({B, L, 3, H, E}, q.options());
    return {buffer.select(2, 0).permute({0, 2, 1, 3}), buffer.select(2, 1).permute({0, 2, 1, 3}),
            buffer.select(2, 2).permute({0, 2, 1, 3}), buffer, Tensor()};
  }
  return {empty_bxhd(B, H, L, E, q.options()), empty_bxhd(B, H, S, E, q.options()),
          empty_bxhd(B, H, S, Ev, q.options()), Tensor(), Tensor()};
}

namespace {

// short_attention_supported's checks; the backward's skip the TF32 setting, since it follows its forward.
bool supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, bool ask_tf32,
               std::string* why_not) {
  auto no = [&](const char* why) {
    if (why_not != nullptr) *why_not = why;
    return false;
  };
  if (!q.defined() || !q.is_cuda() || !k.is_cuda() || !v.is_cuda()) return no("not on a GPU");
  if (q.dtype() == DType::Float32) {
    if (ask_tf32 && !cuda::allow_tf32()) return no("float32 with TF32 products off (cuda::set_allow_tf32)");
  } else if (q.dtype() != DType::BFloat16 && q.dtype() != DType::Float16) {
    return no("not float16, bfloat16 or float32");
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) return no("q, k and v differ in dtype");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return no("not (B, H, L, E)");
  if (k.device() != q.device() || v.device() != q.device()) return no("q, k and v on different devices");
  const int64_t L = q.size(2);
  if (q.size(3) != kShortAttentionHeadDim || k.shape() != q.shape() || v.shape() != q.shape()) {
    return no("not 64 per head with keys and values shaped as the queries");
  }
  if (L < 16 || L > kShortAttentionMaxLength || L % 16 != 0) return no("the length is not a multiple of 16 up to 128");
  if (q.size(0) * q.size(1) == 0) return no("empty input");
  if (q.size(0) * q.size(1) > std::numeric_limits<int32_t>::max()) return no("more than 2^31 heads");
  if (!rows_ok(q) || !rows_ok(k) || !rows_ok(v)) return no("rows not contiguous and 16-byte aligned");
  if (bias.defined()) {
    if (bias.dtype() != q.dtype() || bias.dim() != 4 || !bias.is_contiguous() || bias.size(1) != 1 ||
        bias.size(2) != 1 || bias.size(3) != L || (bias.size(0) != 1 && bias.size(0) != q.size(0))) {
      return no("the mask is not one row of keys per sequence");
    }
  }
  if (cuda::compute_capability(q.device().index()) < 80) return no("needs compute capability 8.0 or later");
  if (shared_optin(q.device().index()) < shared_needed(q.dtype())) return no("the GPU has too little shared memory");
  return true;
}

}  // namespace

bool short_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, bool causal,
                               std::string* why_not) {
  (void)causal;  // both forms run
  return supported(q, k, v, bias, true, why_not);
}

ShortAttentionForward short_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                              const ShortAttentionConfig& cfg, const GeneratorState& draw) {
  trace::Scope range(trace::Kind::Op, "short_attention_forward", q.device(), {&q, &k, &v, &bias});
  std::string why;
  KILN_CHECK(short_attention_supported(q, k, v, bias, cfg.causal, &why), "short_attention_forward: ", why, "; shapes ",
             q.shape(), ", ", k.shape(), ", ", v.shape());
  KILN_CHECK(cfg.dropout_p >= 0 && cfg.dropout_p < 1, "short_attention_forward: dropout_p must lie in [0, 1)");
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2);
  ShortAttentionForward r;
  r.out = empty_bxhd(B, H, L, kShortAttentionHeadDim, q.options());
  r.stats = internal::empty({B, H, L, 1}, {.dtype = DType::Float32, .device = q.device()});
  Params p = common_params(q, k, v, bias, cfg, draw);
  p.out = r.out.data_ptr();
  p.os = strides_of(r.out);
  p.stats = r.stats.data_ptr<float>();
  if (cfg.dropout_p > 0) {
    r.keep = internal::empty({B, H, L, kShortAttentionKeepBytes}, {.dtype = DType::UInt8, .device = q.device()});
    p.keep_bits = r.keep.data_ptr<uint8_t>();
  }
  cudaStream_t stream = cuda::stream_for(q);
  with_variant(q.dtype(), bias.defined(), cfg.causal, cfg.dropout_p > 0, [&](auto tag, auto kb, auto kc, auto kd) {
    using T = typename decltype(tag)::type;
    constexpr bool kb_ = decltype(kb)::value, kc_ = decltype(kc)::value, kd_ = decltype(kd)::value;
    if constexpr (std::is_same_v<T, float>) {
      launch(short_attention_forward_tf32_kernel<kb_, kc_, kd_>, kForwardShared32, static_cast<unsigned>(B * H), stream,
             p);
    } else {
      launch(short_attention_forward_kernel<T, kb_, kc_, kd_>, kForwardShared, static_cast<unsigned>(B * H), stream, p);
    }
    KILN_CUDA_CHECK_LAUNCH("short_attention_forward");
  });
  return r;
}

FusedAttentionGrads short_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& d_out, const Tensor& stats, const Tensor& keep,
                                             const Tensor& bias, const ShortAttentionConfig& cfg) {
  trace::Scope range(trace::Kind::Op, "short_attention_backward", q.device(), {&q, &k, &v, &bias});
  std::string why;
  KILN_CHECK(supported(q, k, v, bias, false, &why), "short_attention_backward: ", why);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2);
  KILN_CHECK(out.shape() == q.shape() && out.dtype() == q.dtype() && rows_ok(out),
             "short_attention_backward: ", "needs the output of short_attention_forward, got ", out.shape(), " ",
             out.dtype());
  KILN_CHECK(stats.defined() && stats.dtype() == DType::Float32 && stats.numel() == B * H * L && stats.is_contiguous(),
             "short_attention_backward: needs the Float32 statistics of short_attention_forward");
  KILN_CHECK(d_out.shape() == q.shape(), "short_attention_backward: the output gradient has shape ", d_out.shape(),
             ", expected ", q.shape());
  if (cfg.dropout_p > 0) {
    KILN_CHECK(keep.defined(),
               "short_attention_backward: with dropout it needs the keep bits that "
               "short_attention_forward returned (ShortAttentionForward::keep), got an undefined tensor");
    KILN_CHECK(keep.dtype() == DType::UInt8 && keep.is_contiguous() && keep.device() == q.device() &&
                   keep.shape() == Shape({B, H, L, kShortAttentionKeepBytes}),
               "short_attention_backward: the keep bits must be the contiguous UInt8 (", B, ", ", H, ", ", L, ", ",
               kShortAttentionKeepBytes, ") on ", q.device(), " that short_attention_forward returned, got ",
               keep.shape(), " ", keep.dtype(), " on ", keep.device());
  }
  Tensor d_o = d_out;
  if (d_o.dtype() != q.dtype() || !rows_ok(d_o)) {
    d_o = empty_bxhd(B, H, L, kShortAttentionHeadDim, q.options());
    d_o.copy_(d_out);
  }
  const bool packed = packed_qkv(q, k, v);
  FusedAttentionGrads g = empty_attention_grads(q, k, v, packed);
  Params p = common_params(q, k, v, bias, cfg, GeneratorState{});
  if (cfg.dropout_p > 0) p.keep_bits = const_cast<uint8_t*>(keep.data_ptr<uint8_t>());
  Tensor partial;
  const int64_t cols = 3 * H * kShortAttentionHeadDim;
  if (packed) {  // the buffer's column sums too: per sequence in the kernel, then over the batch
    partial = internal::empty({B, cols}, {.dtype = DType::Float32, .device = q.device()});
    g.packed_sums = internal::empty({cols}, {.dtype = DType::Float32, .device = q.device()});
    p.partial = partial.data_ptr<float>();
  }
  p.stats = const_cast<float*>(stats.data_ptr<float>());
  p.o = out.data_ptr();
  p.os = strides_of(out);
  p.d_o = d_o.data_ptr();
  p.dos = strides_of(d_o);
  p.dq = g.dq.data_ptr();
  p.dk = g.dk.data_ptr();
  p.dv = g.dv.data_ptr();
  p.dqs = strides_of(g.dq);
  p.dks = strides_of(g.dk);
  p.dvs = strides_of(g.dv);
  cudaStream_t stream = cuda::stream_for(q);
  with_variant(q.dtype(), bias.defined(), cfg.causal, cfg.dropout_p > 0, [&](auto tag, auto kb, auto kc, auto kd) {
    using T = typename decltype(tag)::type;
    constexpr bool kb_ = decltype(kb)::value, kc_ = decltype(kc)::value, kd_ = decltype(kd)::value;
    if constexpr (std::is_same_v<T, float>) {
      launch(short_attention_backward_tf32_kernel<kb_, kc_, kd_>, kBackwardShared32, static_cast<unsigned>(B * H),
             stream, p);
    } else {
      launch(short_attention_backward_kernel<T, kb_, kc_, kd_>, kBackwardShared, static_cast<unsigned>(B * H), stream,
             p);
    }
    KILN_CUDA_CHECK_LAUNCH("short_attention_backward");
  });
  if (packed) {
    sum_over_sequences_kernel<<<static_cast<unsigned>((cols + 255) / 256), 256, 0, stream>>>(
        partial.data_ptr<float>(), g.packed_sums.data_ptr<float>(), static_cast<int>(B), static_cast<int>(cols));
    KILN_CUDA_CHECK_LAUNCH("short_attention_backward: column sums");
  }
  return g;
}

}  // namespace kiln::nn::cuda_impl
