// Layer norm kernels (layer_norm.h). Rows of D contiguous elements.
//  rows of at most 1024 elements (BERT's 768 and 1024): one warp per row holding the row in registers, so x is read
//            once forward and x and dy once backward; backward's dw and db are summed per block in the same kernel.
//            The forward can add a residual first (s = x + residual, saved for backward), and the backward can
//            write dx in a second, lower-precision dtype too (the gradient of the low-precision addend).
//  longer rows, forward:  one block per row; mean, then the variance around it (two passes over the row, the second
//            from cache), then y = (x - mean) * rstd * w + b. mean and rstd are saved for backward.
//  backward: one block per row for dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w; and a
//            column kernel for dw = sum_rows dy xhat, db = sum_rows dy: each block sums a chunk of rows
//            for a strip of columns into a (chunks, D) partial, which kiln's sum reduces in a fixed order.
#include "kiln/layers/cuda/layer_norm.h"
#include "kiln/tensor/trace.h"  // a range per kernel entry

#include <algorithm>
#include <type_traits>

#include "kiln/tensor/cuda/kernel_util.cuh"  // load_compute, store_as, stream_for, KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/ops.h"                 // ops::empty, ops::sum

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

// ---- rows of at most kWarpMaxD elements: one warp per row, the row in registers (one read of x, one of dy) ----
// J, the elements per lane, is a template argument (8, 16, 24 or 32: the smallest that holds the row), so that a
// kernel holds no more registers than its rows need and enough warps stay resident to keep memory busy.
constexpr int kWarpMaxD = 1024;
constexpr int kForwardRows = 8;    // warps (rows) per block, forward
constexpr int kBackwardWarps = 4;  // warps per block, backward

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// s = x (+ residual), y = (s - mean) * rstd * w + b. X: x's type; S: the residual's, s's and y's type (X when there
// is no residual). Lane l holds elements l, l + 32, ... of its row.
template <int J, typename X, typename S, typename A>
__global__ void layer_norm_forward_warp(const X* x, const S* residual, const S* w, const S* b, S* y, S* sum_out,
                                        A* mean_out, A* rstd_out, int64_t rows, int d, A eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kForwardRows + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const X* xr = x + row * d;
  A v[J];
  A s = 0;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int i = lane + 32 * j;
    v[j] = 0;
    if (i < d) {
      v[j] = static_cast<A>(load_compute(xr + i));
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
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w, written in x's type T and, when dx_low is given, also in
// the type L (the gradient of a lower-precision input that was added to the residual). Each block also sums
// dy * xhat and dy over its rows for dw and db: each warp adds its rows into its own rows of shared memory, the block
// adds its warps' sums in a fixed order into one (d) partial per block, and kiln's sum adds the blocks' partials.
template <int J, typename T, typename L, typename A>
__global__ void layer_norm_backward_warp(const T* dy, const T* x, const T* w, const A* mean, const A* rstd, T* dx,
                                         L* dx_low, A* partial_w, A* partial_b, int64_t rows, int d) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* acc_w = reinterpret_cast<A*>(smem_raw);  // (kBackwardWarps, d)
  A* acc_b = acc_w + kBackwardWarps * d;      // (kBackwardWarps, d)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool sums = partial_w != nullptr || partial_b != nullptr;
  if (sums) {
    for (int i = threadIdx.x; i < kBackwardWarps * d; i += blockDim.x) acc_w[i] = acc_b[i] = 0;
    __syncthreads();
  }
  A* my_w = acc_w + warp * d;
  A* my_b = acc_b + warp * d;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kBackwardWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kBackwardWarps) {
    const A m = mean[row], r = rstd[row];
    A gy[J], xh[J];
    A sg = 0, sgx = 0;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int i = lane + 32 * j;
      gy[j] = xh[j] = 0;
      if (i < d) {
        gy[j] = static_cast<A>(load_compute(dy + row * d + i));
        xh[j] = (static_cast<A>(load_compute(x + row * d + i)) - m) * r;
        if (sums) {
          my_w[i] += gy[j] * xh[j];
          my_b[i] += gy[j];
        }
        const A g = w != nullptr ? gy[j] * static_cast<A>(load_compute(w + i)) : gy[j];
        sg += g;
        sgx += g * xh[j];
      }
    }
    if (dx == nullptr && dx_low == nullptr) continue;
    const A mg = warp_sum(sg) / static_cast<A>(d), mgx = warp_sum(sgx) / static_cast<A>(d);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int i = lane + 32 * j;
      if (i >= d) continue;
      const A g = w != nullptr ? gy[j] * static_cast<A>(load_compute(w + i)) : gy[j];
      const A v = r * (g - mg - xh[j] * mgx);
      if (dx != nullptr) store_as(dx + row * d + i, v);
      if (dx_low != nullptr) store_as(dx_low + row * d + i, v);
    }
  }
  if (!sums) return;
  __syncthreads();
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    A tw = 0, tb = 0;
    for (int k = 0; k < kBackwardWarps; ++k) {
      tw += acc_w[k * d + i];
      tb += acc_b[k * d + i];
    }
    if (partial_w != nullptr) partial_w[static_cast<int64_t>(blockIdx.x) * d + i] = tw;
    if (partial_b != nullptr) partial_b[static_cast<int64_t>(blockIdx.x) * d + i] = tb;
  }
}

// Calls f(std::integral_constant<int, J>{}) with the smallest J of 8, 16, 24, 32 for which 32 J >= d.
template <typename F>
void with_lane_count(int64_t d, F&& f) {
  if (d <= 256) return f(std::integral_constant<int, 8>{});
  if (d <= 512) return f(std::integral_constant<int, 16>{});
  if (d <= 768) return f(std::integral_constant<int, 24>{});
  return f(std::integral_constant<int, 32>{});
}

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
                                  const Tensor& residual) {
  trace::Scope range(trace::Kind::Op, residual.defined() ? "add_layer_norm_forward" : "layer_norm_forward", x.device(),
                     {&x, &weight});
  const int64_t rows = x.numel() / d;
  const DType out_dtype = residual.defined() ? residual.dtype() : x.dtype();
  const DType stat = out_dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  const TensorOptions out_options{.dtype = out_dtype, .device = x.device()};
  LayerNormSaved out{ops::empty(x.shape(), out_options), ops::empty({rows}, {.dtype = stat, .device = x.device()}),
                     ops::empty({rows}, {.dtype = stat, .device = x.device()}),
                     residual.defined() ? ops::empty(x.shape(), out_options) : Tensor()};
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
        with_lane_count(d, [&](auto lanes) {
          layer_norm_forward_warp<decltype(lanes)::value, X, S, A><<<blocks, 32 * kForwardRows, 0, stream>>>(
              x.data_ptr<X>(), ptr_or_null<S>(residual), ptr_or_null<S>(weight), ptr_or_null<S>(bias),
              out.y.data_ptr<S>(), out.sum.defined() ? out.sum.data_ptr<S>() : nullptr, out.mean.data_ptr<A>(),
              out.rstd.data_ptr<A>(), rows, static_cast<int>(d), static_cast<A>(eps));
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
                                   std::optional<DType> dx_also_in) {
  trace::Scope range(trace::Kind::Op, "layer_norm_backward", x.device(), {&dy, &x});
  const int64_t rows = x.numel() / d;
  LayerNormGrads g;
  cudaStream_t stream = cuda::stream_for(x);
  const DType acc = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  const bool low = need_dx && dx_also_in && *dx_also_in != x.dtype();
  KILN_CHECK(!low || (d <= kWarpMaxD && x.dtype() == DType::Float32 &&
                      (*dx_also_in == DType::BFloat16 || *dx_also_in == DType::Float16)),
             "layer_norm backward: a second gradient dtype needs Float32 rows of at most ", kWarpMaxD, " elements");
  // Either path writes (count, d) partial sums of dy * xhat (pw) and of dy (pb), added up at the end.
  Tensor pw, pb;
  auto make_partials = [&](int64_t count) {
    if (need_dweight) pw = ops::empty({count, d}, {.dtype = acc, .device = x.device()});
    if (need_dbias) pb = ops::empty({count, d}, {.dtype = acc, .device = x.device()});
    if (rows == 0) {
      if (pw.defined()) pw.zero_();
      if (pb.defined()) pb.zero_();
    }
  };
  // (Float64 keeps the kernels below: its per-block sums would not fit in shared memory.)
  if (d <= kWarpMaxD && x.dtype() != DType::Float64) {
    if (need_dx) g.dx = ops::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
    if (low) g.dx_low = ops::empty(x.shape(), {.dtype = *dx_also_in, .device = x.device()});
    // Enough blocks to keep every SM's memory pipes busy, each warp with a few rows to spread the partials' cost.
    const int64_t want = 8 * static_cast<int64_t>(cuda::kdetail::sm_count());
    const int64_t blocks = std::clamp<int64_t>((rows + 4 * kBackwardWarps - 1) / (4 * kBackwardWarps), 1, want);
    make_partials(blocks);
    if (rows > 0) {
      visit_floating_dtype(x.dtype(), "layer_norm backward", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
        auto launch = [&](auto low_tag) {
          using L = typename decltype(low_tag)::type;
          const bool sums = pw.defined() || pb.defined();
          const size_t smem = sums ? 2 * static_cast<size_t>(kBackwardWarps) * static_cast<size_t>(d) * sizeof(A) : 0;
          with_lane_count(d, [&](auto lanes) {
            layer_norm_backward_warp<decltype(lanes)::value, T, L, A>
                <<<static_cast<unsigned>(blocks), 32 * kBackwardWarps, smem, stream>>>(
                    dy.data_ptr<T>(), x.data_ptr<T>(), ptr_or_null<T>(weight), mean.data_ptr<A>(), rstd.data_ptr<A>(),
                    need_dx ? g.dx.data_ptr<T>() : nullptr, low ? g.dx_low.data_ptr<L>() : nullptr,
                    pw.defined() ? pw.data_ptr<A>() : nullptr, pb.defined() ? pb.data_ptr<A>() : nullptr, rows,
                    static_cast<int>(d));
          });
          KILN_CUDA_CHECK_LAUNCH("layer_norm backward");
        };
        if constexpr (std::is_same_v<T, float>) {
          if (low && *dx_also_in == DType::BFloat16) return launch(TypeTag<BFloat16>{});
          if (low && *dx_also_in == DType::Float16) return launch(TypeTag<Half>{});
        }
        launch(tag);
      });
    }
  } else {
    visit_floating_dtype(x.dtype(), "layer_norm backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
      if (need_dx) {
        g.dx = ops::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
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
  }
  if (need_dweight) g.dweight = ops::sum(pw, {0}, false).to(x.dtype());
  if (need_dbias) g.dbias = ops::sum(pb, {0}, false).to(x.dtype());
  return g;
}

}  // namespace kiln::nn::cuda_impl
