// CUDA kernels: random numbers with the element numbering of generator.h, so that a seed gives the
// same tensor on the GPU as on the CPU (cpu/random.cpp uses the same formulas, element i being the
// i-th in row-major order whatever the strides).
#include "kiln/tensor/cuda/kernel_util.cuh"

namespace kiln::cuda {
namespace {

using kdetail::Offsets;

// Value of element i, exactly as cpu/random.cpp computes it. The explicit _rn intrinsics stop nvcc
// from contracting a + d * u into an FMA, which would round differently from the CPU.
template <typename T>
__device__ __forceinline__ void draw_one(T* p, RandomParams params, GeneratorState draw, uint64_t i) {
  constexpr bool kDouble = std::is_same_v<T, double>;
  switch (params.kind) {
    case RandomKind::Uniform: {
      if constexpr (kDouble) {
        const double u = philox::uniform_double(draw.seed, draw.offset, i);
        *p = __dadd_rn(params.a, __dmul_rn(params.b - params.a, u));
      } else {
        const float u = philox::uniform_float(draw.seed, draw.offset, i);
        kdetail::store_as(
            p, __fadd_rn(static_cast<float>(params.a), __fmul_rn(static_cast<float>(params.b - params.a), u)));
      }
      return;
    }
    case RandomKind::Normal: {
      const double z = philox::normal_value(draw.seed, draw.offset, i, kDouble);
      const double v = __dadd_rn(params.a, __dmul_rn(params.b, z));
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        kdetail::store_as(p, static_cast<float>(v));  // double -> float -> 16 bits, as Half(float) on the CPU
      } else {
        *p = static_cast<T>(v);
      }
      return;
    }
    case RandomKind::Randint: {
      const uint64_t range = static_cast<uint64_t>(params.high - params.low);
      const int64_t v = params.low + static_cast<int64_t>(philox::bits64(draw.seed, draw.offset, i) % range);
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        kdetail::store_as(p, static_cast<float>(v));
      } else {
        *p = static_cast<T>(v);
      }
      return;
    }
    case RandomKind::Bernoulli: {
      const double u = kDouble ? philox::uniform_double(draw.seed, draw.offset, i)
                               : static_cast<double>(philox::uniform_float(draw.seed, draw.offset, i));
      kdetail::store_as(p, u < params.a ? 1.0f : 0.0f);
      return;
    }
  }
}

// One thread per 4 consecutive logical elements (one Philox block for the float numberings).
template <typename T>
__global__ void random_kernel(T* out, Offsets layout, int64_t n, RandomParams params, GeneratorState draw) {
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  for (int64_t i = first; i < first + 4 && i < n; ++i)
    draw_one(out + layout(i), params, draw, static_cast<uint64_t>(i));
}

}  // namespace

void CudaBackend::random(const Tensor& out, const RandomParams& params, GeneratorState draw) {
  const int64_t n = out.numel();
  // Drop size-1 dims and merge dims that step like one, keeping the row-major order of the elements.
  Offsets layout;
  int64_t sizes[64], strides[64];
  int nd = 0;
  for (size_t d = 0; d < out.shape().size(); ++d) {
    const int64_t size = out.shape()[d], stride = out.strides()[d];
    if (size == 1) continue;
    if (nd > 0 && strides[nd - 1] == stride * size) {
      sizes[nd - 1] *= size;
      strides[nd - 1] = stride;
    } else {
      KILN_CHECK(nd < kdetail::kMaxDims, "cuda::random: too many dims (", out.dim(), ")");
      sizes[nd] = size;
      strides[nd] = stride;
      ++nd;
    }
  }
  layout.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    layout.sizes[d] = sizes[d];
    layout.strides[d] = strides[d];
  }
  cudaStream_t stream = stream_for(out);
  constexpr int kThreads = 256;
  const int64_t blocks = kdetail::ceil_div(kdetail::ceil_div(n, 4), kThreads);
  KILN_CHECK(blocks < (int64_t{1} << 31), "cuda::random: tensor too large (", n, " elements)");
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    random_kernel<T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(out.data_ptr<T>(), layout, n, params, draw);
    KILN_CUDA_CHECK_LAUNCH("random");
  });
}

}  // namespace kiln::cuda
