// CUDA kernel: the delayed-scaling update of an FP8 scaling state (fp8_update_scales in fp8_ops.h) in one launch,
// in place of the ~15 small tensor ops Fp8ScalingState::update() would otherwise launch per layer and step.
//
// One block per tracked tensor, i.e. per column j of the (L, N) history (N is 3 for a Linear; L up to 2^24). The
// block's threads stride down the column to find the window's maximum (NaN entries read as 0), reduced with warp
// shuffles and one shared-memory step; then, where the column was seen, they roll it in place; then thread 0 writes
// the column's scale and scale_inv. Division and reciprocal are plain `/` in float32, which nvcc compiles to the
// IEEE-rounded operations (kiln does not build with fast math), so the results equal the CPU kernel's bit for bit.
// Nothing is read on the host: the launch can be captured into a CUDA graph.
//
// The in-place roll h[k] <- h[k + 1] for k = 1 .. L-2 runs in chunks of blockDim.x entries: each thread reads its
// h[k0 + 1 + t] into a register, the block meets at a barrier, then each writes h[k0 + t]. A chunk's writes
// (h[k0 .. k0 + B - 1]) never touch what a later chunk reads (h[k0 + B + 1 ..]), and the only entry a chunk reads
// that the next one writes (h[k0 + B]) is read before this chunk's barrier, which precedes the next chunk's writes;
// so one barrier per chunk makes the roll race-free for any L.
#include <cmath>  // isnan, isinf, isfinite
#include <cstdint>
#include <limits>

#include "kiln/tensor/cuda/cuda_backend.h"  // stream_for
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/ops/fp8_kernels.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// history (L, N) row-major, scale, scale_inv, scaled_max (N); block j updates column j. copy, inv_copy: null, or
// where the new scale and scale_inv are copied too (element j at j * its stride).
__global__ void __launch_bounds__(kThreads)
    update_scales_kernel(float* __restrict__ history, float* __restrict__ scale, float* __restrict__ scale_inv,
                         const float* __restrict__ scaled_max, int64_t len, int64_t n, bool most_recent,
                         float* __restrict__ copy, int64_t copy_stride, float* __restrict__ inv_copy,
                         int64_t inv_copy_stride) {
  __shared__ float warp_max[kWarps];
  const int64_t j = blockIdx.x;
  const int t = threadIdx.x;
  float* col = history + j;  // the column: col[i * n], i < len

  // Read phase: c = h[0, j] (every thread, so `seen` is uniform across the block) and the window's maximum.
  const float c = col[0];
  const bool seen = c != 0.0f;  // a NaN c is seen
  float amax = c;
  if (!most_recent) {
    float local = -INFINITY;  // below every value; L >= 1, so the column has at least one
    for (int64_t i = t; i < len; i += kThreads) {
      const float v = col[i * n];
      local = fmaxf(local, isnan(v) ? 0.0f : v);
    }
    for (int o = 16; o > 0; o >>= 1) local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, o));
    if (t % 32 == 0) warp_max[t / 32] = local;
  }
  // Every read of the history above happens before any write below.
  __syncthreads();
  if (!most_recent) {
    amax = warp_max[0];
    for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, warp_max[w]);
  }

  if (seen) {
    // Rows 1 .. L-2 <- rows 2 .. L-1, a chunk of kThreads rows at a time (see the header comment).
    for (int64_t k0 = 1; k0 + 1 < len; k0 += kThreads) {
      const int64_t k = k0 + t;
      const bool active = k + 1 < len;
      const float v = active ? col[(k + 1) * n] : 0.0f;
      __syncthreads();
      if (active) col[k * n] = v;
    }
    // Row L-1 <- the old row 0, row 0 <- 0 (L == 1: row 0 <- 0 only). Row L-1 was last read before the final
    // chunk's barrier, which thread 0 has passed.
    if (t == 0) {
      if (len > 1) col[(len - 1) * n] = c;
      col[0] = 0.0f;
    }
  }

  if (t == 0) {
    const bool usable = seen && isfinite(amax) && amax > 0.0f;
    float next = usable ? scaled_max[j] / amax : scale[j];
    if (isinf(next)) next = std::numeric_limits<float>::max();
    const float inv = 1.0f / next;
    scale[j] = next;
    scale_inv[j] = inv;
    if (copy != nullptr) copy[j * copy_stride] = next;
    if (inv_copy != nullptr) inv_copy[j * inv_copy_stride] = inv;
  }
}

}  // namespace

void fp8_update_scales(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, const Tensor& scaled_max,
                       bool most_recent, const Tensor& scale_copy, const Tensor& scale_inv_copy) {
  const int64_t len = history.size(0), n = history.size(1);
  KILN_CHECK(n <= 0x7fffffff, "fp8_update_scales: ", n, " tracked tensors are too many for one launch on CUDA");
  cudaStream_t stream = stream_for(history);
  update_scales_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      static_cast<float*>(history.data_ptr()), static_cast<float*>(scale.data_ptr()),
      static_cast<float*>(scale_inv.data_ptr()), static_cast<const float*>(scaled_max.data_ptr()), len, n, most_recent,
      scale_copy.defined() ? static_cast<float*>(scale_copy.data_ptr()) : nullptr,
      scale_copy.defined() ? scale_copy.stride(0) : 0,
      scale_inv_copy.defined() ? static_cast<float*>(scale_inv_copy.data_ptr()) : nullptr,
      scale_inv_copy.defined() ? scale_inv_copy.stride(0) : 0);
  KILN_CUDA_CHECK_LAUNCH("fp8_update_scales");
}

}  // namespace kiln::cuda
