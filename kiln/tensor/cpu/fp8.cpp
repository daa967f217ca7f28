// CPU kernels of the FP8 ops (fp8_ops.h): the reference semantics the CUDA kernels are tested against.
//
// Quantising: x * scale in float32, then float8.h's saturating conversion (the one every cast into FP8 uses), so the
// codes are those of x.mul(scale).to(fp8) computed in float32. The amax is a maximum, which is order-free (a NaN
// anywhere wins), so the threads' partial maxima give the same value however the work is split.
//
// The product: FP8 values decoded exactly to float; each product (exact: at most 8 significant bits) summed over K
// in float64, then scaled, biased and accumulated in float64 and rounded to float32, then to the output dtype.
//
// The scaling update: one column of the amax history at a time, in the order Fp8ScalingState::update() states it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "kiln/tensor/cpu/parallel.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/float8.h"
#include "kiln/tensor/half.h"
#include "kiln/tensor/ops/fp8_kernels.h"

namespace kiln::cpu {
namespace {

const detail::Fp8Format& format_of(DType t) { return t == DType::Float8_e4m3fn ? detail::kE4M3 : detail::kE5M2; }

// The larger of m and v, where a NaN (in either) wins: max(m, |x|) as Fp8ScalingState::record_amax computes it.
inline float nan_max(float m, float v) { return (std::isnan(m) || std::isnan(v)) ? NAN : (v > m ? v : m); }

// t's elements as T (float32, bfloat16 and float16 all widen exactly to float).
template <typename T>
const T* typed(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}

template <typename T>
void quantize_typed(const Tensor& out, const Tensor& x, const Tensor& scale, const Tensor& amax, bool transpose) {
  const T* src = typed<T>(x);
  uint8_t* dst = static_cast<uint8_t*>(out.data_ptr());
  const float s = *static_cast<const float*>(scale.data_ptr());
  const detail::Fp8Format& fmt = format_of(out.dtype());
  // (R, C) viewed as rows of C elements; without transpose one "row" of numel elements split into chunks.
  const int64_t rows = transpose ? x.size(0) : 1, cols = transpose ? x.size(1) : x.numel();
  std::mutex mutex;
  float total = 0.0f;
  const auto encode = [&](float v) { return detail::double_to_fp8_bits(static_cast<double>(v * s), fmt); };
  if (!transpose) {
    parallel_for(0, cols, kGrainSize, [&](int64_t begin, int64_t end) {
      float local = 0.0f;
      for (int64_t i = begin; i < end; ++i) {
        const float v = static_cast<float>(src[i]);
        local = nan_max(local, std::fabs(v));
        dst[i] = encode(v);
      }
      std::lock_guard<std::mutex> lock(mutex);
      total = nan_max(total, local);
    });
  } else {
    // out (C, R): out[c, r] = q(x[r, c]), a row of x at a time.
    const int64_t grain = std::max<int64_t>(1, kGrainSize / std::max<int64_t>(cols, 1));
    parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      float local = 0.0f;
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const float v = static_cast<float>(src[r * cols + c]);
          local = nan_max(local, std::fabs(v));
          dst[c * rows + r] = encode(v);
        }
      }
      std::lock_guard<std::mutex> lock(mutex);
      total = nan_max(total, local);
    });
  }
  float* cell = static_cast<float*>(amax.data_ptr());
  *cell = nan_max(*cell, total);
}

}  // namespace

void fp8_quantize(const Tensor& out, const Tensor& x, const Tensor& scale, const Tensor& amax, bool transpose) {
  switch (x.dtype()) {
    case DType::Float32: return quantize_typed<float>(out, x, scale, amax, transpose);
    case DType::BFloat16: return quantize_typed<BFloat16>(out, x, scale, amax, transpose);
    case DType::Float16: return quantize_typed<Half>(out, x, scale, amax, transpose);
    default: KILN_FAIL("cpu::fp8_quantize: unexpected input dtype ", x.dtype());
  }
}

namespace {

// The float values of every code of a format, so decoding is one load.
std::vector<float> decode_table(DType t) {
  std::vector<float> table(256);
  for (int c = 0; c < 256; ++c) table[c] = detail::fp8_bits_to_float(static_cast<uint8_t>(c), format_of(t));
  return table;
}

template <typename Out>
void gemm_typed(const Tensor& out, const Tensor& a, const Tensor& b, float sa, float sb, const Tensor& bias,
                bool accumulate) {
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  const uint8_t* pa = static_cast<const uint8_t*>(a.data_ptr());
  const uint8_t* pb = static_cast<const uint8_t*>(b.data_ptr());
  const Out* pbias = bias.defined() ? static_cast<const Out*>(bias.data_ptr()) : nullptr;
  Out* po = static_cast<Out*>(out.data_ptr());
  const std::vector<float> ta = decode_table(a.dtype()), tb = decode_table(b.dtype());
  const double scale = static_cast<double>(sa) * static_cast<double>(sb);
  const int64_t grain = std::max<int64_t>(1, kGrainSize / std::max<int64_t>(n * k, 1));
  parallel_for(0, m, grain, [&](int64_t begin, int64_t end) {
    std::vector<double> row(static_cast<size_t>(k));
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t kk = 0; kk < k; ++kk) row[kk] = ta[pa[i * k + kk]];
      for (int64_t j = 0; j < n; ++j) {
        const uint8_t* bj = pb + j * k;
        double sum = 0.0;
        for (int64_t kk = 0; kk < k; ++kk) sum += row[kk] * static_cast<double>(tb[bj[kk]]);
        double v = sum * scale;
        if (pbias != nullptr) v += static_cast<double>(static_cast<float>(pbias[j]));
        if (accumulate) v += static_cast<double>(static_cast<float>(po[i * n + j]));
        po[i * n + j] = Out(static_cast<float>(v));
      }
    }
  });
}

}  // namespace

void fp8_gemm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& a_scale_inv, const Tensor& b_scale_inv,
              const Tensor& bias, bool accumulate) {
  const float sa = *static_cast<const float*>(a_scale_inv.data_ptr());
  const float sb = *static_cast<const float*>(b_scale_inv.data_ptr());
  switch (out.dtype()) {
    case DType::Float32: return gemm_typed<float>(out, a, b, sa, sb, bias, accumulate);
    case DType::BFloat16: return gemm_typed<BFloat16>(out, a, b, sa, sb, bias, accumulate);
    case DType::Float16: return gemm_typed<Half>(out, a, b, sa, sb, bias, accumulate);
    default: KILN_FAIL("cpu::fp8_gemm: unexpected output dtype ", out.dtype());
  }
}

void fp8_update_scales(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, const Tensor& scaled_max,
                       bool most_recent, const Tensor& scale_copy, const Tensor& scale_inv_copy) {
  const int64_t len = history.size(0), n = history.size(1);
  float* copy = scale_copy.defined() ? static_cast<float*>(scale_copy.data_ptr()) : nullptr;
  float* inv_copy = scale_inv_copy.defined() ? static_cast<float*>(scale_inv_copy.data_ptr()) : nullptr;
  const int64_t copy_stride = copy != nullptr ? scale_copy.stride(0) : 0;
  const int64_t inv_copy_stride = inv_copy != nullptr ? scale_inv_copy.stride(0) : 0;
  float* h = static_cast<float*>(history.data_ptr());  // (L, N): h[i * n + j]
  float* ps = static_cast<float*>(scale.data_ptr());
  float* pinv = static_cast<float*>(scale_inv.data_ptr());
  const float* pmax = static_cast<const float*>(scaled_max.data_ptr());
  // Columns are independent; the update is a handful of operations per history entry, cheap next to a step.
  for (int64_t j = 0; j < n; ++j) {
    const float c = h[j];
    const bool seen = c != 0.0f;  // a NaN c is seen
    float amax = c;
    if (!most_recent) {
      amax = std::isnan(c) ? 0.0f : c;
      for (int64_t i = 1; i < len; ++i) {
        const float v = h[i * n + j];
        const float w = std::isnan(v) ? 0.0f : v;
        amax = w > amax ? w : amax;
      }
    }
    if (seen) {
      // Row 0 -> 0, rows 1 .. L-2 <- rows 2 .. L-1, row L-1 <- the old row 0 (c); with L == 1 row 0 -> 0 only.
      for (int64_t i = 1; i + 1 < len; ++i) h[i * n + j] = h[(i + 1) * n + j];
      if (len > 1) h[(len - 1) * n + j] = c;
      h[j] = 0.0f;
    }
    const bool usable = seen && std::isfinite(amax) && amax > 0.0f;
    float next = usable ? pmax[j] / amax : ps[j];
    if (std::isinf(next)) next = std::numeric_limits<float>::max();
    ps[j] = next;
    pinv[j] = 1.0f / next;
    if (copy != nullptr) copy[j * copy_stride] = ps[j];
    if (inv_copy != nullptr) inv_copy[j * inv_copy_stride] = pinv[j];
  }
}

}  // namespace kiln::cpu
