// Layer norm kernels (layer_norm.h). Rows of D contiguous elements.
//  forward:  one block per row; mean, then the variance around it (two passes over the row, the second
//            from cache), then y = (x - mean) * rstd * w + b. mean and rstd are saved for backward.
//  backward: one block per row for dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w; and a
//            column kernel for dw = sum_rows dy xhat, db = sum_rows dy: each block sums a chunk of rows
//            for a strip of columns into a (chunks, D) partial, which kiln's sum reduces in a fixed order.
#include "kiln/layers/cuda/layer_norm.h"
#include "kiln/tensor/trace.h"  // a range per kernel entry

#include <algorithm>

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

LayerNormSaved layer_norm_forward(const Tensor& x, int64_t d, const Tensor& weight, const Tensor& bias, double eps) {
  trace::Scope range(trace::Kind::Op, "layer_norm_forward", x.device(), {&x, &weight});
  const int64_t rows = x.numel() / d;
  const DType stat = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  LayerNormSaved out{ops::empty(x.shape(), {.dtype = x.dtype(), .device = x.device()}),
                     ops::empty({rows}, {.dtype = stat, .device = x.device()}),
                     ops::empty({rows}, {.dtype = stat, .device = x.device()})};
  if (rows == 0) return out;
  cudaStream_t stream = cuda::stream_for(x);
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
                                   const Tensor& weight, bool need_dx, bool need_dweight, bool need_dbias) {
  trace::Scope range(trace::Kind::Op, "layer_norm_backward", x.device(), {&dy, &x});
  const int64_t rows = x.numel() / d;
  LayerNormGrads g;
  cudaStream_t stream = cuda::stream_for(x);
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
      const DType acc = std::is_same_v<A, double> ? DType::Float64 : DType::Float32;
      Tensor pw = need_dweight ? ops::empty({chunks, d}, {.dtype = acc, .device = x.device()}) : Tensor();
      Tensor pb = need_dbias ? ops::empty({chunks, d}, {.dtype = acc, .device = x.device()}) : Tensor();
      if (rows > 0) {
        const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(chunks));
        layer_norm_dwdb_kernel<T, A><<<grid, kThreads, 0, stream>>>(
            dy.data_ptr<T>(), x.data_ptr<T>(), mean.data_ptr<A>(), rstd.data_ptr<A>(),
            pw.defined() ? pw.data_ptr<A>() : nullptr, pb.defined() ? pb.data_ptr<A>() : nullptr, rows, d, per_chunk);
        KILN_CUDA_CHECK_LAUNCH("layer_norm backward");
      } else {
        if (pw.defined()) pw.zero_();
        if (pb.defined()) pb.zero_();
      }
      if (need_dweight) g.dweight = ops::sum(pw, {0}, false).to(x.dtype());
      if (need_dbias) g.dbias = ops::sum(pb, {0}, false).to(x.dtype());
    }
  });
  return g;
}

}  // namespace kiln::nn::cuda_impl
