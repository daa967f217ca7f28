// Attention's probabilities, forward and backward in one kernel each (attention_probs.h). One warp per row of S
// scores (per 4 rows where S <= 128, per 2 where S <= 256, their loads issued together): lane l holds elements
// 4 l + 128 j .. + 3 (j < G = ceil(S / 128)) in registers, moved with one 16-byte (float32) or 8-byte (16-bit) access
// each, so the scores are read once and the probabilities written once.
// The dropout draws one Philox block per 4 elements with internal::dropout's numbering (element row * S + col of the
// probabilities), so it keeps exactly the elements internal::dropout(probs, p) would for the same draw. Keep bits:
// word 4 j + k of a row holds, at bit l, the decision for element 128 j + 4 l + k (one ballot per word).
#include "kiln/layers/cuda/attention_probs.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "kiln/layers/cuda/layer_kernels.cuh"  // load_pack, store_pack
#include "kiln/tensor/cuda/dropout_keep.cuh"   // keep_flags: internal::dropout's keep/drop decision of an element
#include "kiln/tensor/cuda/kernel_util.cuh"    // ceil_div, stream_for, KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/dispatch.h"              // visit_floating_dtype, compute_t
#include "kiln/tensor/internal_ops.h"          // internal::empty, internal::contiguous
#include "kiln/tensor/scalar.h"                // Scalar: the mask value as internal::dropout rounds it
#include "kiln/tensor/trace.h"                 // a range per kernel entry

namespace kiln::nn::cuda_impl {
namespace {

constexpr int kWarps = 4;  // rows (warps) per block
constexpr int kMaxLeadingDims = 5;

// Where a row's mask starts: the scores' leading dims (all but the last) and the mask's strides along them.
struct MaskGeometry {
  int dims = 0;
  int64_t size[kMaxLeadingDims] = {}, stride[kMaxLeadingDims] = {};
  int64_t last = 0;  // the mask's stride along the row (0 or 1 in practice)
};

__device__ __forceinline__ int64_t mask_row_offset(const MaskGeometry& g, int64_t row) {
  int64_t offset = 0;
#pragma unroll
  for (int d = kMaxLeadingDims - 1; d >= 0; --d) {  // unrolled: the arrays stay in registers, not in local memory
    if (d >= g.dims) continue;
    offset += (row % g.size[d]) * g.stride[d];
    row /= g.size[d];
  }
  return offset;
}

// max(m, v) where a NaN v wins and a NaN m stays, so that a row with a NaN is NaN (as softmax).
__device__ __forceinline__ float nan_max(float m, float v) { return (v > m || v != v) ? v : m; }

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// v rounded to T and widened back: the value a tensor of T holds.
template <typename T>
__device__ __forceinline__ float as_stored(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return static_cast<float>(cuda::to_compute<T>(cuda::from_compute<T>(v)));
  }
}

// This lane's forbidden flags for elements c .. c + 3 of the row (c < S).
template <bool kMask>
__device__ __forceinline__ void forbidden_flags(bool (&f)[4], const bool* row_mask, int64_t last, int c) {
#pragma unroll
  for (int k = 0; k < 4; ++k) f[k] = kMask && row_mask[(c + k) * last];
}

// Rows per warp: short rows are taken several at a time, every load of them issued before any is used, so that
// enough bytes are in flight for memory to stay busy (one 128-key row is only 512 bytes of float32 per warp).
template <int G>
inline constexpr int kRowsPerWarp = G == 1   ? 4
                                    : G == 2 ? 2
                                             : 1;

template <typename T, int G, bool kMask, bool kDrop>
__global__ void __launch_bounds__(32 * kWarps)
    probs_forward(const T* __restrict__ scores, const bool* __restrict__ mask, MaskGeometry mg, T* __restrict__ probs,
                  T* __restrict__ dropped, uint32_t* __restrict__ keep_bits, int64_t rows, int s, GeneratorState draw,
                  philox::KeepThreshold keep, float scale) {
  constexpr int R = kRowsPerWarp<G>;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int lane = threadIdx.x % 32;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * R;
  if (first >= rows) return;  // a whole warp leaves together
  if constexpr (kDrop) {
    if (draw.device_offset != nullptr) draw.offset = *draw.device_offset;  // a CUDA graph's draw
  }
  float v[R][G][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int c = 128 * j + 4 * lane;
      if (first + r < rows && c < s) {
        load_pack<4>(scores + (first + r) * s + c, v[r][j]);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) v[r][j][k] = kNegInf;
      }
    }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = first + r;
    if (row >= rows) break;  // uniform across the warp
    bool any_allowed = false;
    if constexpr (kMask) {
      const bool* row_mask = mask + mask_row_offset(mg, row);
#pragma unroll
      for (int j = 0; j < G; ++j) {
        const int c = 128 * j + 4 * lane;
        if (c >= s) continue;
        bool f[4];
        forbidden_flags<kMask>(f, row_mask, mg.last, c);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (f[k]) v[r][j][k] = kNegInf;
          any_allowed = any_allowed || !f[k];
        }
      }
    }
    // A row whose every key is masked gets zeros (not the NaN of a softmax over nothing).
    const bool dead = kMask && !__any_sync(0xffffffffu, any_allowed);
    float mx = kNegInf;
#pragma unroll
    for (int j = 0; j < G; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) mx = nan_max(mx, v[r][j][k]);
    mx = warp_max(mx);
    float sum = 0;
#pragma unroll
    for (int j = 0; j < G; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        // exp(-inf - mx) = 0 for masked and absent elements; a row of -inf scores gives NaN, as softmax.
        v[r][j][k] = expf(v[r][j][k] - mx);
        if (128 * j + 4 * lane + k < s) sum += v[r][j][k];
      }
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int c = 128 * j + 4 * lane;
      float p[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) p[k] = dead ? 0.0f : as_stored<T>(v[r][j][k] / sum);
      if (c < s) store_pack<4>(probs + row * s + c, p);
      if constexpr (kDrop) {
        bool kept[4] = {false, false, false, false};
        if (c < s) cuda::keep_flags<T, 4>(kept, draw, keep, static_cast<uint64_t>(row * s + c));
        float d[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) d[k] = kept[k] ? p[k] * scale : 0.0f;  // as internal::dropout: x * mask
        if (c < s) store_pack<4>(dropped + row * s + c, d);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t word = __ballot_sync(0xffffffffu, kept[k]);
          if (lane == 0) keep_bits[row * (4 * G) + 4 * j + k] = word;
        }
      }
    }
  }
}

template <typename T, int G, bool kMask, bool kDrop>
__global__ void __launch_bounds__(32 * kWarps)
    probs_backward(const T* __restrict__ grad, const T* __restrict__ probs, const uint32_t* __restrict__ keep_bits,
                   const bool* __restrict__ mask, MaskGeometry mg, T* __restrict__ d_scores, int64_t rows, int s,
                   float scale) {
  constexpr int R = kRowsPerWarp<G>;
  const int lane = threadIdx.x % 32;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * R;
  if (first >= rows) return;
  float dp[R][G][4], p[R][G][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int c = 128 * j + 4 * lane;
      if (first + r < rows && c < s) {
        load_pack<4>(grad + (first + r) * s + c, dp[r][j]);
        load_pack<4>(probs + (first + r) * s + c, p[r][j]);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) dp[r][j][k] = p[r][j][k] = 0;
      }
    }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = first + r;
    if (row >= rows) break;  // uniform across the warp
    const bool* row_mask = kMask ? mask + mask_row_offset(mg, row) : nullptr;
    bool f[G][4];
    bool any_allowed = false;
    float dot = 0;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int c = 128 * j + 4 * lane;
#pragma unroll
      for (int k = 0; k < 4; ++k) f[j][k] = true;
      if (c >= s) continue;
      forbidden_flags<kMask>(f[j], row_mask, mg.last, c);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        any_allowed = any_allowed || !f[j][k];
        if constexpr (kDrop) {  // dropout's backward: the gradient times the mask, rounded to T
          const bool kept = ((keep_bits[row * (4 * G) + 4 * j + k] >> lane) & 1u) != 0;
          dp[r][j][k] = kept ? as_stored<T>(dp[r][j][k] * scale) : 0.0f;
        }
        dot += dp[r][j][k] * p[r][j][k];
      }
    }
    dot = warp_sum(dot);
    const bool dead = kMask && !__any_sync(0xffffffffu, any_allowed);
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int c = 128 * j + 4 * lane;
      if (c >= s) continue;
      float ds[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) ds[k] = (dead || (kMask && f[j][k])) ? 0.0f : p[r][j][k] * (dp[r][j][k] - dot);
      store_pack<4>(d_scores + row * s + c, ds);
    }
  }
}

// Calls f(std::integral_constant<int, G>{}) with the G of 1, 2, 4, 8 whose 128 G holds the row.
template <typename F>
void with_chunks(int64_t s, F&& f) {
  if (s <= 128) return f(std::integral_constant<int, 1>{});
  if (s <= 256) return f(std::integral_constant<int, 2>{});
  if (s <= 512) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 8>{});
}

int chunks_of(int64_t s) {
  int g = 0;
  with_chunks(s, [&](auto chunks) { g = decltype(chunks)::value; });
  return g;
}

MaskGeometry geometry_of(const Tensor& forbidden, const Tensor& scores) {
  MaskGeometry g;
  if (!forbidden.defined()) return g;
  g.dims = static_cast<int>(scores.dim()) - 1;
  for (int d = 0; d < g.dims; ++d) {
    g.size[d] = scores.size(d);
    g.stride[d] = forbidden.stride(d);
  }
  g.last = forbidden.stride(-1);
  return g;
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void check_forbidden(const Tensor& forbidden, const Tensor& scores, const char* where) {
  KILN_CHECK(!forbidden.defined() || (forbidden.dtype() == DType::Bool && forbidden.shape() == scores.shape() &&
                                      forbidden.device() == scores.device()),
             where, ": the mask must be Bool and expanded to the scores' shape ", scores.shape(), " on ",
             scores.device(), ", got ", forbidden.shape(), " ", forbidden.dtype());
}

// The mask value of a kept element as internal::dropout stores it in the dtype, widened exactly to float.
float dropout_scale(DType dtype, double p) {
  float scale = 0;
  visit_floating_dtype(dtype, "attention_probs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    scale = static_cast<float>(static_cast<compute_t<T>>(Scalar(1.0 / (1.0 - p)).to<T>()));
  });
  return scale;
}

// Calls f(TypeTag<T>, G, masked, dropping) with the element type, the chunk count and the two flags as types (the
// kernels' template arguments): float32 and the 16-bit types only.
template <typename F>
void with_variant(DType dtype, int64_t s, bool masked, bool dropping, F&& f) {
  visit_floating_dtype(dtype, "attention_probs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, double>) {
      with_chunks(s, [&](auto chunks) {
        using Yes = std::true_type;
        using No = std::false_type;
        if (masked) {
          dropping ? f(tag, chunks, Yes{}, Yes{}) : f(tag, chunks, Yes{}, No{});
        } else {
          dropping ? f(tag, chunks, No{}, Yes{}) : f(tag, chunks, No{}, No{});
        }
      });
    }
  });
}

}  // namespace

bool attention_probs_fusable(const Tensor& scores) {
  if (!scores.defined() || !scores.is_cuda() || scores.numel() == 0 || !scores.is_contiguous()) return false;
  if (scores.dim() < 2 || scores.dim() > kMaxLeadingDims + 1) return false;
  const DType dt = scores.dtype();
  if (dt != DType::Float32 && dt != DType::BFloat16 && dt != DType::Float16) return false;
  const int64_t s = scores.size(-1);
  return s % 4 == 0 && s <= 1024 && aligned(scores.data_ptr(), 4 * element_size(dt));
}

AttentionProbs attention_probs_forward(const Tensor& scores, const Tensor& forbidden, double p,
                                       const GeneratorState& draw) {
  trace::Scope range(trace::Kind::Op, "attention_probs", scores.device(), {&scores});
  KILN_CHECK(attention_probs_fusable(scores), "attention_probs: scores ", scores.shape(), " ", scores.dtype(),
             " are not contiguous float32 or 16-bit rows of a multiple of 4 elements, at most 1024, on a GPU");
  KILN_CHECK(p >= 0 && p < 1, "attention_probs: p must lie in [0, 1), got ", p);
  check_forbidden(forbidden, scores, "attention_probs");
  const int64_t s = scores.size(-1), rows = scores.numel() / s;
  const bool drop = p > 0;
  const TensorOptions options = scores.options();
  AttentionProbs out;
  out.probs = internal::empty(scores.shape(), options);
  if (drop) {
    out.dropped = internal::empty(scores.shape(), options);
    out.keep = internal::empty({rows, 4 * chunks_of(s)}, {.dtype = DType::Int32, .device = scores.device()});
  }
  const MaskGeometry mg = geometry_of(forbidden, scores);
  const bool* mask = forbidden.defined() ? forbidden.data_ptr<bool>() : nullptr;
  cudaStream_t stream = cuda::stream_for(scores);
  const float scale = drop ? dropout_scale(scores.dtype(), p) : 0.0f;
  const philox::KeepThreshold keep = philox::keep_threshold(1.0 - p);
  auto* bits = drop ? reinterpret_cast<uint32_t*>(out.keep.data_ptr<int32_t>()) : nullptr;
  with_variant(scores.dtype(), s, mask != nullptr, drop, [&](auto tag, auto chunks, auto masked, auto dropping) {
    using T = typename decltype(tag)::type;
    constexpr int G = decltype(chunks)::value;
    const auto blocks = static_cast<unsigned>(cuda::kdetail::ceil_div(rows, kWarps * kRowsPerWarp<G>));
    probs_forward<T, G, decltype(masked)::value, decltype(dropping)::value><<<blocks, 32 * kWarps, 0, stream>>>(
        scores.data_ptr<T>(), mask, mg, out.probs.data_ptr<T>(), drop ? out.dropped.data_ptr<T>() : nullptr, bits, rows,
        static_cast<int>(s), draw, keep, scale);
    KILN_CUDA_CHECK_LAUNCH("attention_probs");
  });
  return out;
}

Tensor attention_probs_backward(const Tensor& grad_in, const Tensor& probs, const Tensor& keep, const Tensor& forbidden,
                                double p) {
  trace::Scope range(trace::Kind::Op, "attention_probs_backward", probs.device(), {&grad_in, &probs});
  KILN_CHECK(attention_probs_fusable(probs) && grad_in.shape() == probs.shape() && grad_in.dtype() == probs.dtype() &&
                 grad_in.device() == probs.device(),
             "attention_probs_backward: the gradient ", grad_in.shape(), " ", grad_in.dtype(),
             " must match the probabilities ", probs.shape(), " ", probs.dtype());
  check_forbidden(forbidden, probs, "attention_probs_backward");
  const bool drop = p > 0;
  KILN_CHECK(!drop || keep.defined(), "attention_probs_backward: dropout needs the forward's keep bits");
  Tensor grad = internal::contiguous(grad_in);
  if (!aligned(grad.data_ptr(), 4 * element_size(grad.dtype()))) grad = internal::clone(grad);  // a view's offset
  const int64_t s = probs.size(-1), rows = probs.numel() / s;
  Tensor d_scores = internal::empty(probs.shape(), probs.options());
  const MaskGeometry mg = geometry_of(forbidden, probs);
  const bool* mask = forbidden.defined() ? forbidden.data_ptr<bool>() : nullptr;
  const auto* bits = drop ? reinterpret_cast<const uint32_t*>(keep.data_ptr<int32_t>()) : nullptr;
  cudaStream_t stream = cuda::stream_for(probs);
  const float scale = drop ? dropout_scale(probs.dtype(), p) : 0.0f;
  with_variant(probs.dtype(), s, mask != nullptr, drop, [&](auto tag, auto chunks, auto masked, auto dropping) {
    using T = typename decltype(tag)::type;
    constexpr int G = decltype(chunks)::value;
    const auto blocks = static_cast<unsigned>(cuda::kdetail::ceil_div(rows, kWarps * kRowsPerWarp<G>));
    probs_backward<T, G, decltype(masked)::value, decltype(dropping)::value>
        <<<blocks, 32 * kWarps, 0, stream>>>(grad.data_ptr<T>(), probs.data_ptr<T>(), bits, mask, mg,
                                             d_scores.data_ptr<T>(), rows, static_cast<int>(s), scale);
    KILN_CUDA_CHECK_LAUNCH("attention_probs_backward");
  });
  return d_scores;
}

}  // namespace kiln::nn::cuda_impl
