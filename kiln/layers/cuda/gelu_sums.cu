// kiln/layers/cuda/gelu_sums.cu — dh = g * gelu'(h) and the float32 column sums of dh in one pass (gelu_sums.h).
//
// A block of 8 warps takes a tile of 64 rows and 32 x V columns (V elements in 16 bytes): each lane one vector of
// V columns, each warp every 8th row of the tile, 4 rows' loads at a time. A lane adds the values it stores, as rounded into dh's dtype, in
// row order; the block adds its 8 warps' sums in warp order and writes one partial per column and tile, (C, tiles)
// float32, so that the sum of a column's partials is a row reduction. The order is fixed by the shape alone.
#include "kiln/layers/cuda/gelu_sums.h"

#include <cstdint>

#include "kiln/layers/cuda/layer_kernels.cuh"  // Vec, load_vec, store_vec, kVecWidth
#include "kiln/tensor/cuda/activations.cuh"    // gelu_erf_grad, gelu_tanh_grad: internal::gelu_backward's functions
#include "kiln/tensor/cuda/cuda_backend.h"     // stream_for
#include "kiln/tensor/cuda/cuda_check.h"       // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/cuda/kernel_util.cuh"    // ceil_div, to_compute, from_compute
#include "kiln/tensor/dispatch.h"              // visit_floating_dtype, compute_t
#include "kiln/tensor/internal_ops.h"          // internal::empty, internal::sum
#include "kiln/tensor/trace.h"                 // a range per kernel entry

namespace kiln::nn::cuda_impl {

namespace {

constexpr int kWarps = 8;
constexpr int kTileRows = 64;
constexpr int kRowsPerWarp = kTileRows / kWarps;
constexpr int kBatch = 4;  // rows a lane loads ahead: 2 x 4 x 16 bytes, so that 3 blocks fit an SM's registers

template <typename T, bool kTanh>
__global__ void __launch_bounds__(32 * kWarps)
    gelu_backward_sums_kernel(const device_t<T>* __restrict__ g, const device_t<T>* __restrict__ h,
                              device_t<T>* __restrict__ dh, float* __restrict__ partial, int64_t rows, int64_t cols) {
  constexpr int V = kVecWidth<T>;
  using C = compute_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * 32 + lane) * V;  // this lane's first column
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTileRows;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.0f;
  if (c0 < cols) {
#pragma unroll 1
    for (int b = 0; b < kRowsPerWarp; b += kBatch) {
      Vec<T, V> gv[kBatch], hv[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {  // the batch's loads issued before the first is used
        const int64_t r = r0 + warp + (b + i) * kWarps;
        if (r < rows) {
          gv[i] = load_vec<T, V>(g + r * cols + c0);
          hv[i] = load_vec<T, V>(h + r * cols + c0);
        }
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int64_t r = r0 + warp + (b + i) * kWarps;
        if (r < rows) {
          Vec<T, V> out;
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const C x = cuda::to_compute<T>(hv[i].v[k]);
            const C d = kTanh ? cuda::gelu_tanh_grad(x) : cuda::gelu_erf_grad(x);
            out.v[k] = cuda::from_compute<T>(cuda::to_compute<T>(gv[i].v[k]) * d);  // as ActivationBackwardF
            acc[k] += static_cast<float>(cuda::to_compute<T>(out.v[k]));
          }
          store_vec<T, V>(dh + r * cols + c0, out);
        }
      }
    }
  }
  __shared__ float warp_sums[kWarps][32 * V];
#pragma unroll
  for (int k = 0; k < V; ++k) warp_sums[warp][lane * V + k] = acc[k];
  __syncthreads();
  for (int j = static_cast<int>(threadIdx.x); j < 32 * V; j += 32 * kWarps) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 * V + j;
    if (c >= cols) break;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w][j];
    partial[c * gridDim.y + blockIdx.y] = total;
  }
}

}  // namespace

bool gelu_backward_sums_fits(const Tensor& g, const Tensor& h) {
  if (!g.defined() || !h.defined() || !g.device().is_cuda() || h.device() != g.device()) return false;
  if (g.dim() != 2 || g.shape() != h.shape() || g.dtype() != h.dtype() || g.numel() == 0) return false;
  if (!g.is_contiguous() || !h.is_contiguous()) return false;
  const int64_t rows = g.size(0), cols = g.size(1);
  if (cuda::kdetail::ceil_div(rows, kTileRows) > 65535) return false;  // gridDim.y
  const auto fits_dtype = [&](auto tag) {
    using T = typename decltype(tag)::type;
    return vector_width<T>({g.data_ptr(), h.data_ptr()}, cols) == kVecWidth<T>;
  };
  switch (g.dtype()) {
    case DType::Float32: return fits_dtype(TypeTag<float>{});
    case DType::BFloat16: return fits_dtype(TypeTag<BFloat16>{});
    case DType::Float16: return fits_dtype(TypeTag<Half>{});
    default: return false;
  }
}

std::pair<Tensor, Tensor> gelu_backward_sums(const Tensor& g, const Tensor& h, bool tanh_approximation) {
  trace::Scope range(trace::Kind::Op, "gelu_backward_with_column_sums", g.device(), {&g, &h});
  const int64_t rows = g.size(0), cols = g.size(1);
  const int64_t tiles = cuda::kdetail::ceil_div(rows, kTileRows);
  Tensor dh = internal::empty(g.shape(), g.options());
  Tensor partial = internal::empty({cols, tiles}, {.dtype = DType::Float32, .device = g.device()});
  cudaStream_t stream = cuda::stream_for(g);
  visit_floating_dtype(g.dtype(), "gelu_backward_with_column_sums", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, double>) {
      constexpr int V = kVecWidth<T>;
      const dim3 grid(static_cast<unsigned>(cuda::kdetail::ceil_div(cols, 32 * V)), static_cast<unsigned>(tiles));
      const auto* gp = reinterpret_cast<const device_t<T>*>(g.data_ptr());
      const auto* hp = reinterpret_cast<const device_t<T>*>(h.data_ptr());
      auto* out = reinterpret_cast<device_t<T>*>(dh.data_ptr());
      auto* pp = static_cast<float*>(partial.data_ptr());
      if (tanh_approximation) {
        gelu_backward_sums_kernel<T, true><<<grid, 32 * kWarps, 0, stream>>>(gp, hp, out, pp, rows, cols);
      } else {
        gelu_backward_sums_kernel<T, false><<<grid, 32 * kWarps, 0, stream>>>(gp, hp, out, pp, rows, cols);
      }
      KILN_CUDA_CHECK_LAUNCH("gelu_backward_with_column_sums");
    }
  });
  return {dh, internal::sum(partial, {1}, false)};  // each column's row of partials
}

}  // namespace kiln::nn::cuda_impl
