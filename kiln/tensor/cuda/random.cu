// CUDA kernels: random numbers with the element numbering of generator.h, so that a seed gives the
// same tensor on the GPU as on the CPU (cpu/random.cpp uses the same formulas, element i being the
// i-th in row-major order whatever the strides); and the fused dropout, one pass that draws the mask,
// writes it and scales the input.
#include <algorithm>  // std::min

#include "kiln/tensor/cuda/dropout_keep.cuh"  // keep_flags: which elements a dropout draw keeps
#include "kiln/tensor/cuda/kernel_util.cuh"
#include "kiln/tensor/cuda/loops.cuh"  // Vec, load_vec, store_vec, kThreads

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
  if (draw.device_offset != nullptr) draw.offset = *draw.device_offset;  // a CUDA graph's draw
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  for (int64_t i = first; i < first + 4 && i < n; ++i)
    draw_one(out + layout(i), params, draw, static_cast<uint64_t>(i));
}

// ---- dropout (keep_flags, in dropout_keep.cuh, decides which elements stay) ----

// mask = kept ? scale : 0 and out = x * mask, in compute_t and rounded once (binary Mul's rounding; x * 0
// keeps NaN and the sign of zero).
template <typename T>
__device__ __forceinline__ void drop_one(device_t<T>* out, device_t<T>* mask, const device_t<T>* x, bool kept,
                                         compute_t<T> scale) {
  const compute_t<T> m = kept ? scale : compute_t<T>(0);
  *mask = from_compute<T>(m);
  *out = from_compute<T>(to_compute<T>(*x) * m);
}

// out, mask and x contiguous (row-major): each thread takes 16 bytes of each per step (V elements; two Philox
// blocks for 16-bit types, one for float32 and float64), with vector accesses when all three are 16-byte
// aligned and element by element otherwise (and in the last, partial vector).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dropout_contiguous_kernel(device_t<T>* out, device_t<T>* mask, const device_t<T>* x, int64_t n, bool aligned,
                              compute_t<T> scale, philox::KeepThreshold keep, GeneratorState draw) {
  using D = device_t<T>;
  if (draw.device_offset != nullptr) draw.offset = *draw.device_offset;  // a CUDA graph's draw
  constexpr int V = static_cast<int>(16 / sizeof(T));
  const int64_t nvec = (n + V - 1) / V;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < nvec; v += step) {
    const int64_t first = v * V;
    bool kept[V];
    if (aligned && first + V <= n) {
      const Vec<D, V> xv = load_vec<D, V>(reinterpret_cast<const char*>(x + first));  // issued before Philox
      keep_flags<T, V>(kept, draw, keep, static_cast<uint64_t>(first));
      Vec<D, V> ov, mv;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const compute_t<T> m = kept[j] ? scale : compute_t<T>(0);
        mv.v[j] = from_compute<T>(m);
        ov.v[j] = from_compute<T>(to_compute<T>(xv.v[j]) * m);
      }
      store_vec<D, V>(reinterpret_cast<char*>(out + first), ov);
      store_vec<D, V>(reinterpret_cast<char*>(mask + first), mv);
    } else {
      keep_flags<T, V>(kept, draw, keep, static_cast<uint64_t>(first));
      for (int j = 0; j < V && first + j < n; ++j)
        drop_one<T>(out + first + j, mask + first + j, x + first + j, kept[j], scale);
    }
  }
}

// Any strides: element i of each tensor at its own row-major offsets; 4 consecutive elements per thread.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dropout_strided_kernel(device_t<T>* out, device_t<T>* mask, const device_t<T>* x, Offsets out_layout,
                           Offsets mask_layout, Offsets x_layout, int64_t n, compute_t<T> scale,
                           philox::KeepThreshold keep, GeneratorState draw) {
  if (draw.device_offset != nullptr) draw.offset = *draw.device_offset;  // a CUDA graph's draw
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (first >= n) return;
  bool kept[4];
  keep_flags<T, 4>(kept, draw, keep, static_cast<uint64_t>(first));
  for (int j = 0; j < 4 && first + j < n; ++j) {
    const int64_t i = first + j;
    drop_one<T>(out + out_layout(i), mask + mask_layout(i), x + x_layout(i), kept[j], scale);
  }
}

// Row-major index -> element offset of t: size-1 dims dropped, dims that step like one merged.
Offsets row_major_layout(const Tensor& t, const char* op) {
  Offsets layout;
  int64_t sizes[64], strides[64];
  int nd = 0;
  for (size_t d = 0; d < t.shape().size(); ++d) {
    const int64_t size = t.shape()[d], stride = t.strides()[d];
    if (size == 1) continue;
    if (nd > 0 && strides[nd - 1] == stride * size) {
      sizes[nd - 1] *= size;
      strides[nd - 1] = stride;
    } else {
      KILN_CHECK(nd < kdetail::kMaxDims, op, ": too many dims (", t.dim(), ")");
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
  return layout;
}

}  // namespace

void CudaBackend::random(const Tensor& out, const RandomParams& params, GeneratorState draw) {
  const int64_t n = out.numel();
  const Offsets layout = row_major_layout(out, "cuda::random");
  cudaStream_t stream = stream_for(out);
  const int64_t blocks = kdetail::ceil_div(kdetail::ceil_div(n, 4), kThreads);
  KILN_CHECK(blocks < (int64_t{1} << 31), "cuda::random: tensor too large (", n, " elements)");
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    random_kernel<T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(out.data_ptr<T>(), layout, n, params, draw);
    KILN_CUDA_CHECK_LAUNCH("random");
  });
}

void CudaBackend::dropout(const Tensor& out, const Tensor& mask, const Tensor& x, double p, GeneratorState draw) {
  const int64_t n = x.numel();
  const philox::KeepThreshold keep = philox::keep_threshold(1.0 - p);  // bernoulli(1 - p)'s decisions
  cudaStream_t stream = stream_for(x);
  visit_floating_dtype(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using D = device_t<T>;
    // The mask value of a kept element as fill stores it, widened exactly to the compute type.
    const auto scale = static_cast<compute_t<T>>(Scalar(1.0 / (1.0 - p)).to<T>());
    auto* o = static_cast<D*>(out.data_ptr());
    auto* m = static_cast<D*>(mask.data_ptr());
    const auto* in = static_cast<const D*>(x.data_ptr());
    if (out.is_contiguous() && mask.is_contiguous() && x.is_contiguous()) {
      auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
      const bool aligned = aligned16(o) && aligned16(m) && aligned16(in);
      const int64_t nvec = kdetail::ceil_div(n, static_cast<int64_t>(16 / sizeof(T)));
      const int64_t blocks = std::min<int64_t>(kdetail::ceil_div(nvec, kThreads), int64_t{kdetail::sm_count()} * 8);
      dropout_contiguous_kernel<T>
          <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(o, m, in, n, aligned, scale, keep, draw);
    } else {
      const int64_t blocks = kdetail::ceil_div(kdetail::ceil_div(n, 4), kThreads);
      KILN_CHECK(blocks < (int64_t{1} << 31), "cuda::dropout: tensor too large (", n, " elements)");
      dropout_strided_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          o, m, in, row_major_layout(out, "cuda::dropout"), row_major_layout(mask, "cuda::dropout"),
          row_major_layout(x, "cuda::dropout"), n, scale, keep, draw);
    }
    KILN_CUDA_CHECK_LAUNCH("dropout");
  });
}

}  // namespace kiln::cuda
