// kiln/tensor/cuda/reduce_engine.cuh — the CUDA reduction engine (backend-internal), shared by
// reduce.cu (sum, mean, prod, max, min, all, any) and reduce_stats.cu (var, std, norm, logsumexp).
//
// A reduction is planned on the host as on the CPU: kept and reduced dims are split apart, each group
// sorted by input stride (largest first) and coalesced, so every output o (row-major over the kept
// dims) reduces n_red elements at in + kept_in(o) + red(r). One kernel then serves every layout:
//  - row mode (the reduced elements of an output are innermost, or no kept dim is contiguous): the
//    lanes threadIdx.x of a warp (short rows, 8 outputs per block) or of a whole block (long rows)
//    walk one output's elements; a contiguous row is read with 16-byte vector loads.
//  - column mode (reduced dims outer, innermost kept dim contiguous: a sum over dim 0 of (N, C),
//    channels-last statistics): threadIdx.x runs over consecutive outputs (coalesced), threadIdx.y
//    splits the rows, and shared memory merges them. Where the outputs' elements lie next to each
//    other in every reduced row, 16-byte aligned (a contiguous (N, C) with C a multiple of the pack),
//    each thread takes a pack of 16 / sizeof(T) neighbouring outputs and reads each row's share in
//    one 16-byte load (reduce_columns_packed): a warp moves 512 bytes of a row per load, not 64.
//  - when that leaves too few blocks to fill the GPU (a full reduction, a few huge rows) the rows are
//    also split across blockIdx.y; each block writes a partial to a temporary and a second launch
//    merges the partials of each output in a fixed order (results do not depend on timing).
// An op is a functor: identity(), map(x, center) (center: a per-output value from a first pass, as
// the mean for var or the max for logsumexp), combine(a, b); Finish turns the total into the result.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/tensor/cuda/kernel_util.cuh"
#include "kiln/tensor/internal_ops.h"     // internal::empty for temporaries
#include "kiln/tensor/reduce_geometry.h"  // plan_reduction

namespace kiln::cuda::rdetail {

using kdetail::ceil_div;
using kdetail::kMaxDims;
using kdetail::load_as;
using kdetail::nan_max;
using kdetail::nan_min;
using kdetail::Offsets;

// ---- ops ----
template <typename Acc>
struct SumOp {
  __device__ Acc identity() const { return Acc(0); }
  __device__ Acc map(Acc x, Acc) const { return x; }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
};
template <typename Acc>
struct ProdOp {
  __device__ Acc identity() const { return Acc(1); }
  __device__ Acc map(Acc x, Acc) const { return x; }
  __device__ Acc combine(Acc a, Acc b) const {
    // Integer products wrap around on overflow (signed overflow would be undefined), as on the CPU.
    if constexpr (std::is_integral_v<Acc>) return static_cast<Acc>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
    else return a * b;
  }
};
template <typename Acc>
struct MaxOp {
  __device__ Acc identity() const {
    if constexpr (std::is_floating_point_v<Acc>) return -std::numeric_limits<Acc>::infinity();
    else return std::numeric_limits<Acc>::lowest();
  }
  __device__ Acc map(Acc x, Acc) const { return x; }
  __device__ Acc combine(Acc a, Acc b) const { return nan_max(a, b); }
};
template <typename Acc>
struct MinOp {
  __device__ Acc identity() const {
    if constexpr (std::is_floating_point_v<Acc>) return std::numeric_limits<Acc>::infinity();
    else return std::numeric_limits<Acc>::max();
  }
  __device__ Acc map(Acc x, Acc) const { return x; }
  __device__ Acc combine(Acc a, Acc b) const { return nan_min(a, b); }
};

// How the total of an output becomes its value (c: the output's center from a first pass).
enum FinishKind : int { kPlain, kDivide, kDivideSqrt, kSqrt, kPow, kLogSumExp };
template <typename Acc>
struct Finish {
  int kind = kPlain;
  Acc divisor = 1;   // kDivide, kDivideSqrt: mean (n), var (n - correction)
  Acc exponent = 1;  // kPow: 1 / p
  __device__ Acc operator()(Acc v, Acc c) const {
    if (kind == kDivide) return v / divisor;
    if constexpr (std::is_floating_point_v<Acc>) {
      switch (kind) {
        case kDivideSqrt: return sqrt(v / divisor);
        case kSqrt: return sqrt(v);
        case kPow: return pow(v, exponent);
        case kLogSumExp: return isfinite(c) ? c + log(v) : c;  // all -inf, any +inf, NaN: the max itself
        default: break;
      }
    }
    return v;
  }
};

// ---- the plan ----
struct Geometry {
  Offsets kept_in, kept_out, red;  // kept_*: of output o; red: of reduced position r, relative to kept_in(o)
  int64_t n_out = 1, n_red = 1;
  bool columns = false;     // column mode applies
  bool contiguous = false;  // one reduced run of stride 1: vector loads
};

inline Geometry make_geometry(const Shape& sizes, const Strides& in_strides, const Strides& out_strides,
                              const std::vector<bool>& reduce) {
  const ReduceGeometry plan = plan_reduction(sizes, in_strides, out_strides, reduce);  // shared with the CPU
  const size_t n_kept = plan.kept_sizes.size(), n_red = plan.red_sizes.size();
  KILN_CHECK(n_kept <= kMaxDims && n_red <= kMaxDims, "cuda::reduce: too many dims (", sizes.size(), ")");
  Geometry g;
  g.kept_in.ndim = g.kept_out.ndim = static_cast<int>(n_kept);
  for (size_t i = 0; i < n_kept; ++i) {
    g.kept_in.sizes[i] = g.kept_out.sizes[i] = plan.kept_sizes[i];
    g.kept_in.strides[i] = plan.kept_in[i];
    g.kept_out.strides[i] = plan.kept_out[i];
  }
  g.red.ndim = static_cast<int>(n_red);
  for (size_t i = 0; i < n_red; ++i) {
    g.red.sizes[i] = plan.red_sizes[i];
    g.red.strides[i] = plan.red_in[i];
  }
  g.n_out = plan.n_out;
  g.n_red = plan.n_red;
  g.contiguous = n_red == 1 && plan.red_in[0] == 1;
  g.columns = !plan.inner_contiguous() && plan.columns_contiguous();
  return g;
}

// The same kept dims with a contiguous output (a first pass writing one center per output).
inline Offsets contiguous_like(const Offsets& kept) {
  Offsets o = kept;
  int64_t step = 1;
  for (int d = kept.ndim - 1; d >= 0; --d) {
    o.strides[d] = step;
    step *= kept.sizes[d];
  }
  return o;
}

struct Plan {
  bool row = true;
  bool contiguous = false;
  int64_t chunk = 0;  // reduced positions per split
  int splits = 1;
};

// Elements of T in one 16-byte load: the pack of neighbouring outputs a thread of reduce_columns_packed takes, for
// floating-point sums (2 to 8 elements; the pack's shared memory stays within 16 KB), else 1: no packing.
template <typename T, typename Acc>
constexpr int column_pack() {
  return std::is_floating_point_v<Acc> && sizeof(T) >= 2 && sizeof(T) <= 8 ? static_cast<int>(16 / sizeof(T)) : 1;
}

// Whether column mode may read packs of V outputs: output o is element o of every reduced row (one kept dim of
// stride 1), the outputs come in whole packs, and every row starts on a 16-byte boundary.
template <typename T>
bool columns_packable(const T* in, const Geometry& g, int V) {
  if (V <= 1 || !g.columns || g.kept_in.ndim != 1 || g.kept_in.strides[0] != 1 || g.n_out % V != 0) return false;
  if (reinterpret_cast<uintptr_t>(in) % 16 != 0) return false;
  for (int d = 0; d < g.red.ndim; ++d)
    if (g.red.strides[d] % V != 0) return false;
  return true;
}

// ---- kernels ----
template <typename Acc, typename Op>
__device__ __forceinline__ Acc warp_combine(const Op& op, Acc v) {
  for (int d = 16; d > 0; d >>= 1) v = op.combine(v, __shfl_down_sync(0xffffffffu, v, d));
  return v;
}

template <typename T, typename O, typename Acc, typename Op>
__global__ void reduce_kernel(const T* in, O* out, Acc* partial, const Acc* center, Geometry g, Plan plan, Op op,
                              Finish<Acc> finish) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* smem = reinterpret_cast<Acc*>(smem_raw);
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int64_t o = plan.row ? static_cast<int64_t>(blockIdx.x) * by + ty : static_cast<int64_t>(blockIdx.x) * bx + tx;
  const int lane = plan.row ? tx : ty, lanes = plan.row ? bx : by;
  const int s = blockIdx.y;
  const int64_t r0 = s * plan.chunk, r1 = min(g.n_red, r0 + plan.chunk);
  const bool valid = o < g.n_out;
  const Acc c = (valid && center) ? center[o] : Acc(0);
  Acc acc = op.identity();
  if (valid) {
    const T* base = in + g.kept_in(o);
    if (plan.contiguous) {
      // A contiguous run: scalar head up to 16-byte alignment, vector body (4 loads in flight), tail.
      constexpr int V = sizeof(T) >= 16 ? 1 : 16 / static_cast<int>(sizeof(T));
      struct alignas(16) Vec {
        T v[V];
      };
      const T* p = base + r0;
      const int64_t len = r1 - r0;
      const int64_t mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % 16) / static_cast<int64_t>(sizeof(T));
      const int64_t head = min(len, mis == 0 ? int64_t{0} : V - mis);
      if (lane < head) acc = op.combine(acc, op.map(load_as<Acc>(p + lane), c));
      const Vec* q = reinterpret_cast<const Vec*>(p + head);
      const int64_t nvec = (len - head) / V;
      int64_t i = lane;
      for (; i + 3 * lanes < nvec; i += 4 * lanes) {
        const Vec a = q[i], b = q[i + lanes], d = q[i + 2 * lanes], e = q[i + 3 * lanes];
#pragma unroll
        for (int k = 0; k < V; ++k) acc = op.combine(acc, op.map(load_as<Acc>(&a.v[k]), c));
#pragma unroll
        for (int k = 0; k < V; ++k) acc = op.combine(acc, op.map(load_as<Acc>(&b.v[k]), c));
#pragma unroll
        for (int k = 0; k < V; ++k) acc = op.combine(acc, op.map(load_as<Acc>(&d.v[k]), c));
#pragma unroll
        for (int k = 0; k < V; ++k) acc = op.combine(acc, op.map(load_as<Acc>(&e.v[k]), c));
      }
      for (; i < nvec; i += lanes) {
        const Vec a = q[i];
#pragma unroll
        for (int k = 0; k < V; ++k) acc = op.combine(acc, op.map(load_as<Acc>(&a.v[k]), c));
      }
      for (int64_t j = head + nvec * V + lane; j < len; j += lanes)
        acc = op.combine(acc, op.map(load_as<Acc>(p + j), c));
    } else {
      // Four independent loads in flight per lane before they are combined (bandwidth, not latency).
      int64_t r = r0 + lane;
      for (; r + 3 * lanes < r1; r += 4 * lanes) {
        const Acc a = load_as<Acc>(base + g.red(r)), b = load_as<Acc>(base + g.red(r + lanes));
        const Acc d = load_as<Acc>(base + g.red(r + 2 * lanes)), e = load_as<Acc>(base + g.red(r + 3 * lanes));
        acc = op.combine(op.combine(acc, op.map(a, c)), op.map(b, c));
        acc = op.combine(op.combine(acc, op.map(d, c)), op.map(e, c));
      }
      for (; r < r1; r += lanes) acc = op.combine(acc, op.map(load_as<Acc>(base + g.red(r)), c));
    }
  }
  // Merge the lanes of each output.
  bool leader;
  if (plan.row) {
    acc = warp_combine(op, acc);  // bx is a multiple of 32
    if (bx > 32) {                // one output per block (by == 1)
      if (tx % 32 == 0) smem[tx / 32] = acc;
      __syncthreads();
      if (tx < 32) {
        acc = tx < bx / 32 ? smem[tx] : op.identity();
        acc = warp_combine(op, acc);
      }
    }
    leader = tx == 0;
  } else {
    smem[ty * bx + tx] = acc;
    __syncthreads();
    for (int h = by / 2; h > 0; h /= 2) {  // by is a power of two
      if (ty < h) smem[ty * bx + tx] = op.combine(smem[ty * bx + tx], smem[(ty + h) * bx + tx]);
      __syncthreads();
    }
    acc = smem[tx];
    leader = ty == 0;
  }
  if (!valid || !leader) return;
  if (plan.splits == 1) kdetail::store_as(out + g.kept_out(o), finish(acc, c));
  else partial[o * plan.splits + s] = acc;
}

// Column mode over packs (columns_packable): thread (tx, ty) of block (bx, s) sums outputs o0 .. o0 + V - 1,
// o0 = V (blockIdx.x * blockDim.x + tx), over rows r0 + ty, r0 + ty + blockDim.y, ... of its split s, reading the V
// elements of a row as one 16-byte load (two in flight); shared memory then merges the threadIdx.y lanes of each
// output in a fixed tree, as the unpacked column mode does.
template <int V, typename T, typename O, typename Acc, typename Op>
__global__ void reduce_columns_packed(const T* in, O* out, Acc* partial, const Acc* center, Geometry g, Plan plan,
                                      Op op, Finish<Acc> finish) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* smem = reinterpret_cast<Acc*>(smem_raw);
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * bx + tx) * V;
  const int s = blockIdx.y;
  const int64_t r0 = s * plan.chunk, r1 = min(g.n_red, r0 + plan.chunk);
  const bool valid = o0 < g.n_out;  // the outputs come in whole packs
  struct alignas(16) Pack {
    T v[V];
  };
  Acc c[V], acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    c[k] = (valid && center) ? center[o0 + k] : Acc(0);
    acc[k] = op.identity();
  }
  if (valid) {
    const T* base = in + o0;
    int64_t r = r0 + ty;
    for (; r + by < r1; r += 2 * by) {
      const Pack a = *reinterpret_cast<const Pack*>(base + g.red(r));
      const Pack b = *reinterpret_cast<const Pack*>(base + g.red(r + by));
#pragma unroll
      for (int k = 0; k < V; ++k)
        acc[k] =
            op.combine(op.combine(acc[k], op.map(load_as<Acc>(&a.v[k]), c[k])), op.map(load_as<Acc>(&b.v[k]), c[k]));
    }
    if (r < r1) {
      const Pack a = *reinterpret_cast<const Pack*>(base + g.red(r));
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = op.combine(acc[k], op.map(load_as<Acc>(&a.v[k]), c[k]));
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) smem[(k * by + ty) * bx + tx] = acc[k];  // consecutive tx: no bank conflicts
  __syncthreads();
  for (int h = by / 2; h > 0; h /= 2) {  // by is a power of two
    if (ty < h) {
#pragma unroll
      for (int k = 0; k < V; ++k)
        smem[(k * by + ty) * bx + tx] = op.combine(smem[(k * by + ty) * bx + tx], smem[(k * by + ty + h) * bx + tx]);
    }
    __syncthreads();
  }
  if (!valid || ty != 0) return;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const Acc total = smem[k * by * bx + tx];
    if (plan.splits == 1) kdetail::store_as(out + g.kept_out(o0 + k), finish(total, c[k]));
    else partial[(o0 + k) * plan.splits + s] = total;
  }
}

// Second stage: a warp per output merges its partials in order.
template <typename O, typename Acc, typename Op>
__global__ void merge_kernel(const Acc* partial, O* out, const Acc* center, Offsets kept_out, int64_t n_out, int splits,
                             Op op, Finish<Acc> finish) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (o >= n_out) return;  // whole warps leave together
  Acc acc = op.identity();
  for (int k = lane; k < splits; k += 32) acc = op.combine(acc, partial[o * splits + k]);
  acc = warp_combine(op, acc);
  if (lane == 0) kdetail::store_as(out + kept_out(o), finish(acc, center ? center[o] : Acc(0)));
}

template <typename Acc>
constexpr DType acc_dtype() {
  if constexpr (std::is_same_v<Acc, float>) return DType::Float32;
  else if constexpr (std::is_same_v<Acc, double>) return DType::Float64;
  else return DType::Int64;
}

inline int next_pow2(int64_t n, int cap) {
  int p = 1;
  while (p < cap && p < n) p *= 2;
  return p;
}

// Reduces in (T) into out (O) with op; center (Acc, one per output, or null) feeds op.map and finish.
// out_layout says where output o goes (g.kept_out for the real output, contiguous for a center pass).
template <typename T, typename O, typename Acc, typename Op>
void run_reduce(const T* in, O* out, const Offsets& out_layout, Geometry g, const Acc* center, const Op& op,
                const Finish<Acc>& finish, cudaStream_t stream, Device device) {
  g.kept_out = out_layout;
  Plan plan;
  plan.row = !g.columns;
  plan.contiguous = plan.row && g.contiguous;
  constexpr int kPack = column_pack<T, Acc>();
  const int pack = !plan.row && columns_packable(in, g, kPack) ? kPack : 1;
  const int64_t columns = g.n_out / pack;  // threads across the outputs, in column mode
  int bx, by;
  if (plan.row) {
    if (g.n_red <= 1024) bx = 32, by = 8;  // a warp per output
    else bx = g.n_red <= 16384 ? 256 : 512, by = 1;
  } else {
    bx = next_pow2(columns, 32);
    by = next_pow2(g.n_red, 512 / bx);
  }
  const int lanes = plan.row ? bx : by;
  const int64_t blocks = ceil_div(plan.row ? g.n_out : columns, plan.row ? by : bx);
  KILN_CHECK(blocks < (int64_t{1} << 31), "cuda::reduce: too many outputs (", g.n_out, ")");
  // Too few blocks to fill the GPU: split the rows too, keeping at least 64 elements per lane (16 packs).
  const int64_t target = 4 * static_cast<int64_t>(kdetail::sm_count());
  const int64_t per_lane = pack > 1 ? 16 : 64;
  int64_t splits = 1;
  if (blocks < target) {
    splits = std::min({ceil_div(target, blocks), ceil_div(g.n_red, per_lane * lanes), int64_t{1024}});
    splits = std::max<int64_t>(splits, 1);
  }
  plan.chunk = ceil_div(g.n_red, splits);
  plan.chunk = ceil_div(plan.chunk, 16) * 16;  // slices start 16-element aligned relative to the row
  plan.splits = static_cast<int>(ceil_div(g.n_red, plan.chunk));
  Tensor partial;
  Acc* partial_ptr = nullptr;
  if (plan.splits > 1) {
    partial = internal::empty({g.n_out * plan.splits}, {.dtype = acc_dtype<Acc>(), .device = device});
    partial_ptr = partial.data_ptr<Acc>();
  }
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(plan.splits)), block(bx, by);
  const size_t smem = static_cast<size_t>(bx) * by * pack * sizeof(Acc);
  if constexpr (kPack > 1) {
    if (pack > 1) {
      reduce_columns_packed<kPack, T, O, Acc, Op>
          <<<grid, block, smem, stream>>>(in, out, partial_ptr, center, g, plan, op, finish);
    } else {
      reduce_kernel<T, O, Acc, Op><<<grid, block, smem, stream>>>(in, out, partial_ptr, center, g, plan, op, finish);
    }
  } else {
    reduce_kernel<T, O, Acc, Op><<<grid, block, smem, stream>>>(in, out, partial_ptr, center, g, plan, op, finish);
  }
  KILN_CUDA_CHECK_LAUNCH("reduce");
  if (plan.splits > 1) {
    constexpr int kWarps = 8;
    const auto merge_blocks = static_cast<unsigned>(ceil_div(g.n_out, kWarps));
    merge_kernel<O, Acc, Op><<<merge_blocks, 32 * kWarps, 0, stream>>>(partial_ptr, out, center, g.kept_out, g.n_out,
                                                                       plan.splits, op, finish);
    KILN_CUDA_CHECK_LAUNCH("reduce");
  }
  // `partial` is released here; the caching allocator hands it out again only in stream order.
}

}  // namespace kiln::cuda::rdetail
