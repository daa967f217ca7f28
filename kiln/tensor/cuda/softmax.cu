// CUDA kernels along one dim: max/min with the index of the first extreme, softmax and log-softmax.
//
// Both see the input as lines: every position of the other dims owns one line of n = size(dim)
// elements, stride(dim) apart. A warp takes a line of up to 1024 elements (8 lines per block); a
// block of 512 threads takes a longer one. Lanes walk the line at a stride of the group size, so a
// line along the innermost dim is read coalesced.
#include "kiln/tensor/cuda/kernel_util.cuh"
#include "kiln/tensor/special_values.h"  // exp_arg, exp_finish: exp's edges, as on the CPU

namespace kiln::cuda {
namespace {

using kdetail::load_compute;
using kdetail::Offsets;

inline constexpr int64_t kWarpLine = 1024;  // longest line one warp takes
inline constexpr int kLinesPerBlock = 8;    // warps (lines) per block for short lines
inline constexpr int kBlockThreads = 512;   // threads per line for long lines

// Offsets of line o in up to three tensors sharing a shape, over every dim but `dim`.
struct Lines {
  Offsets at[3];
  int64_t count = 1;
  Lines(const Shape& shape, int64_t dim, std::initializer_list<const Tensor*> tensors) {
    int nd = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (static_cast<int64_t>(d) == dim || shape[d] == 1) continue;
      KILN_CHECK(nd < kdetail::kMaxDims, "cuda: too many dims (", shape.size(), ")");
      int t = 0;
      for (const Tensor* x : tensors) {
        at[t].sizes[nd] = shape[d];
        at[t].strides[nd] = x->strides()[d];
        ++t;
      }
      count *= shape[d];
      ++nd;
    }
    for (Offsets& o : at) o.ndim = nd;
  }
};

struct Launch {
  dim3 grid, block;
};
inline Launch launch_for(int64_t n, int64_t lines) {
  const int64_t blocks = n <= kWarpLine ? kdetail::ceil_div(lines, kLinesPerBlock) : lines;
  KILN_CHECK(blocks < (int64_t{1} << 31), "cuda: too many lines (", lines, ")");
  if (n <= kWarpLine) return {dim3(static_cast<unsigned>(blocks)), dim3(32, kLinesPerBlock)};
  return {dim3(static_cast<unsigned>(blocks)), dim3(kBlockThreads)};
}

// Combines v over the lanes of a line (a warp, or the whole block when blockDim.x > 32); every lane
// gets the result. The warps' results are combined in a fixed order, so all lanes agree exactly.
template <typename C, typename F>
__device__ __forceinline__ C line_all_reduce(C v, F f) {
  __shared__ C partial[kBlockThreads / 32];
  for (int d = 16; d > 0; d >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, d));
  if (blockDim.x > 32) {
    __syncthreads();  // the previous call's readers are done with `partial`
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    v = partial[0];
    for (int k = 1; k < static_cast<int>(blockDim.x / 32); ++k) v = f(v, partial[k]);
  }
  return v;
}

// Three passes over a line (max, sum of exp, write); the re-reads of a short line mostly hit L1/L2.
// Unrolling keeps 8 loads in flight per lane (caching a 1024-element line in registers was slower on H200).
template <typename T>
__global__ void __launch_bounds__(kBlockThreads)
    softmax_kernel(const T* in, T* out, Lines lines, int64_t n, int64_t in_step, int64_t out_step, bool log_softmax) {
  using C = compute_t<T>;
  const int64_t line = blockDim.x > 32 ? blockIdx.x : static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (line >= lines.count) return;  // whole warps (short lines only) leave together
  const T* x = in + lines.at[0](line);
  T* y = out + lines.at[1](line);
  const int lane = threadIdx.x, lanes = blockDim.x;
  C m = -std::numeric_limits<C>::infinity();
#pragma unroll 8
  for (int64_t i = lane; i < n; i += lanes) m = kdetail::nan_max(m, static_cast<C>(load_compute(x + i * in_step)));
  m = line_all_reduce(m, [](C a, C b) { return kdetail::nan_max(a, b); });
  C s = 0;
#pragma unroll 8
  for (int64_t i = lane; i < n; i += lanes) s += exp(static_cast<C>(load_compute(x + i * in_step)) - m);
  s = line_all_reduce(s, [](C a, C b) { return a + b; });
  const C log_s = log(s);
#pragma unroll 8
  for (int64_t i = lane; i < n; i += lanes) {
    const C shifted = static_cast<C>(load_compute(x + i * in_step)) - m;
    // exp with special_values.h's edges, as the CPU's softmax: exactly 0 at a -inf logit, and the subnormal
    // probabilities of logits ~87 to ~104 below the max computed, not flushed. (The sum is at least 1.)
    if (log_softmax) kdetail::store_as(y + i * out_step, shifted - log_s);
    else kdetail::store_as(y + i * out_step, special::exp_finish(shifted, exp(special::exp_arg(shifted))) / s);
  }
}

// The extreme of (va, ia) and (vb, ib), preferring the lower index on ties; index -1 is "none yet".
// NaN counts as the extreme, the first NaN winning (as the CPU backend and PyTorch).
template <bool kMax, typename C>
__device__ __forceinline__ void pick(C& va, int64_t& ia, C vb, int64_t ib) {
  if (ib < 0) return;
  bool take;
  if (ia < 0) {
    take = true;
  } else {
    bool a_nan = false, b_nan = false;
    if constexpr (std::is_floating_point_v<C>) a_nan = va != va, b_nan = vb != vb;
    if (a_nan || b_nan) take = b_nan && (!a_nan || ib < ia);
    else take = (kMax ? vb > va : vb < va) || (vb == va && ib < ia);
  }
  if (take) va = vb, ia = ib;
}

template <bool kMax, typename T>
__global__ void __launch_bounds__(kBlockThreads)
    arg_reduce_kernel(const T* in, T* values, int64_t* indices, Lines lines, int64_t n, int64_t step) {
  using C = compute_t<T>;
  __shared__ C part_v[kBlockThreads / 32];
  __shared__ int64_t part_i[kBlockThreads / 32];
  const int64_t line = blockDim.x > 32 ? blockIdx.x : static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (line >= lines.count) return;
  const T* x = in + lines.at[0](line);
  const int lane = threadIdx.x, lanes = blockDim.x;
  C best = C(0);
  int64_t best_i = -1;
  for (int64_t i = lane; i < n; i += lanes) pick<kMax>(best, best_i, static_cast<C>(load_compute(x + i * step)), i);
  for (int d = 16; d > 0; d >>= 1) {
    const C v = __shfl_down_sync(0xffffffffu, best, d);
    const int64_t j = __shfl_down_sync(0xffffffffu, best_i, d);
    pick<kMax>(best, best_i, v, j);
  }
  if (lanes > 32) {
    if (lane % 32 == 0) part_v[lane / 32] = best, part_i[lane / 32] = best_i;
    __syncthreads();
    if (lane != 0) return;
    for (int k = 1; k < lanes / 32; ++k) pick<kMax>(best, best_i, part_v[k], part_i[k]);
  }
  if (lane != 0) return;
  values[lines.at[1](line)] = x[best_i * step];  // the element itself: exact, NaN payload included
  indices[lines.at[2](line)] = best_i;
}

}  // namespace

void CudaBackend::arg_reduce(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) {
  KILN_CHECK(op == ReduceOp::Max || op == ReduceOp::Min, "cuda::arg_reduce: expected Max or Min, got op ",
             static_cast<int>(op));
  const Lines lines(in.shape(), dim, {&in, &values, &indices});
  const int64_t n = in.size(dim), step = in.stride(dim);
  const Launch l = launch_for(n, lines.count);
  cudaStream_t stream = stream_for(in);
  visit_dtype(in.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (op == ReduceOp::Max) {
      arg_reduce_kernel<true, T><<<l.grid, l.block, 0, stream>>>(in.data_ptr<T>(), values.data_ptr<T>(),
                                                                 indices.data_ptr<int64_t>(), lines, n, step);
    } else {
      arg_reduce_kernel<false, T><<<l.grid, l.block, 0, stream>>>(in.data_ptr<T>(), values.data_ptr<T>(),
                                                                  indices.data_ptr<int64_t>(), lines, n, step);
    }
    KILN_CUDA_CHECK_LAUNCH("arg_reduce");
  });
}

void CudaBackend::softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) {
  const Lines lines(in.shape(), dim, {&in, &out});
  const int64_t n = in.size(dim);
  const Launch l = launch_for(n, lines.count);
  cudaStream_t stream = stream_for(in);
  visit_floating_dtype(in.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_kernel<T><<<l.grid, l.block, 0, stream>>>(in.data_ptr<T>(), out.data_ptr<T>(), lines, n, in.stride(dim),
                                                      out.stride(dim), log);
    KILN_CUDA_CHECK_LAUNCH(log ? "log_softmax" : "softmax");
  });
}

}  // namespace kiln::cuda
