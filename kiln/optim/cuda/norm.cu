// fused_l2_norm and fused_scale (fused.h).
//
// fused_l2_norm: one block per (tensor, chunk) writes the chunk's sum of squares (float32 per thread, then
// a fixed block tree) into a partials buffer at the chunk's global index; then one block of kBlock threads
// adds the partials in float64 (thread t takes partials t, t + kBlock, ... in order; then a fixed tree) and
// writes sqrt as float32. Same inputs, same launch geometry: the same bits (deterministic, no atomics).
// Lists of mixed dtypes launch the first pass once per dtype into one partials buffer.
#include "kiln/optim/cuda/multi_tensor.cuh"
#include "kiln/tensor/internal_ops.h"  // internal::empty
#include "kiln/tensor/trace.h"         // a range per kernel entry

namespace kiln::optim::cuda_impl {
namespace {

template <typename T>
struct SumSquares {
  float* partials;  // (chunks)

  template <int D>
  __device__ void operator()(const mt::Meta<D>& m, int slot, int64_t chunk) const {
    const T* x = static_cast<const T*>(m.ptr[0][slot]) + chunk * mt::kChunk;
    float s = 0.f;
    mt::for_each_group(mt::chunk_len(m, slot, chunk), mt::all_aligned(m, slot), [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float r[mt::kVec];
      mt::load<W>(x + i, r);
#pragma unroll
      for (int k = 0; k < W; ++k) s += r[k] * r[k];
    });
    s = mt::block_sum(s);
    if (threadIdx.x == 0) partials[m.chunk_base[slot] + chunk] = s;
  }
};

// out[0] = sqrt(sum of partials[0, n)), one block of kBlock threads.
__global__ void __launch_bounds__(mt::kBlock) finish_l2_norm(const float* partials, int64_t n, float* out) {
  __shared__ double sums[mt::kBlock];
  double s = 0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) s += static_cast<double>(partials[k]);
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int half = mt::kBlock / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = static_cast<float>(sqrt(sums[0]));
}

template <typename T>
struct Scale {
  const float* factor;

  template <int D>
  __device__ void operator()(const mt::Meta<D>& m, int slot, int64_t chunk) const {
    T* x = static_cast<T*>(m.ptr[0][slot]) + chunk * mt::kChunk;
    const float f = *factor;
    mt::for_each_group(mt::chunk_len(m, slot, chunk), mt::all_aligned(m, slot), [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float r[mt::kVec];
      mt::load<W>(x + i, r);
#pragma unroll
      for (int k = 0; k < W; ++k) r[k] *= f;
      mt::store<W>(x + i, r);
    });
  }
};

}  // namespace

Tensor fused_l2_norm(const TensorVec& tensors) {
  trace::Scope range(trace::Kind::Op, "fused_l2_norm", tensors.empty() ? Device::cpu() : tensors[0].device());
  constexpr const char* kOp = "fused_l2_norm";
  KILN_CHECK(!tensors.empty(), kOp, ": needs at least one tensor (the result's device comes from it)");
  const Device dev = check_tensors(tensors, kOp, "tensors");
  cudaStream_t stream = cuda::stream_for(tensors[0]);
  int64_t chunks = 0;
  for (const Tensor& t : tensors) chunks += mt::num_chunks(t.numel());
  const TensorOptions f32{.dtype = DType::Float32, .device = dev};
  // (chunks) float32 from the caching allocator, each written once by the first pass.
  const Tensor partials = internal::empty({chunks > 0 ? chunks : 1}, f32);
  Tensor out = internal::empty({}, f32);
  int64_t base = 0;
  mt::for_each_dtype_group(tensors, [&](DType dtype, const TensorVec& group) {
    mt::dispatch_fused(dtype, kOp, [&](auto tag) {
      using T = decltype(tag);
      base += mt::apply<1>({&group}, nullptr, stream, SumSquares<T>{partials.data_ptr<float>()}, kOp, base);
    });
  });
  finish_l2_norm<<<1, mt::kBlock, 0, stream>>>(partials.data_ptr<float>(), chunks, out.data_ptr<float>());
  KILN_CUDA_CHECK_LAUNCH(kOp);
  return out;
}

void fused_scale(const TensorVec& tensors, const Tensor& factor) {
  trace::Scope range(trace::Kind::Op, "fused_scale", tensors.empty() ? Device::cpu() : tensors[0].device());
  constexpr const char* kOp = "fused_scale";
  const Device dev = check_tensors(tensors, kOp, "tensors");
  if (tensors.empty()) return;
  check_scalar(factor, kOp, "factor", dev, true);
  cudaStream_t stream = cuda::stream_for(tensors[0]);
  mt::for_each_dtype_group(tensors, [&](DType dtype, const TensorVec& group) {
    mt::dispatch_fused(dtype, kOp, [&](auto tag) {
      using T = decltype(tag);
      mt::apply<1>({&group}, nullptr, stream, Scale<T>{factor.data_ptr<float>()}, kOp);
    });
  });
}

}  // namespace kiln::optim::cuda_impl
