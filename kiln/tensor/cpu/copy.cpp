// CPU kernels: copy with dtype conversion, fill, arange, linspace.
#include <algorithm>  // std::min, std::max
#include <cstring>    // std::memcpy

#include "kiln/tensor/cpu/convert.h"  // convert<To>(From)
#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/loops.h"  // for_each_run
#include "kiln/tensor/dispatch.h"   // visit_dtype, visit_storage_dtype

namespace kiln::cpu {
namespace {

// Same dtype: move bytes. Unit strides become one memcpy per run; other strides copy element by element
// through an integer of the element's width (so Half and BFloat16 move as bits, NaN payloads intact).
template <typename Bits>
void copy_bits(char* const* p, const int64_t* s, int64_t n) {
  constexpr int64_t kSize = sizeof(Bits);
  if (s[0] == kSize && s[1] == kSize) {
    std::memcpy(p[0], p[1], static_cast<size_t>(n * kSize));
    return;
  }
  char* dst = p[0];
  const char* src = p[1];
  if (s[1] == 0) {  // broadcast source: one value
    Bits v;
    std::memcpy(&v, src, kSize);
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * s[0], &v, kSize);
    return;
  }
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * s[0], src + i * s[1], kSize);
}

// A transpose: the destination runs along geometry dim 0 while the source runs along dim 1 (2-D
// transposes, NCHW <-> NHWC). Element-by-element, one side would stride through memory and miss the cache
// on every element; kTile x kTile tiles keep both sides' lines in L1.
bool is_transpose(const LoopGeometry<2>& g, int64_t dst_size, int64_t src_size) {
  constexpr int64_t kMinSide = 16;
  return g.ndim() >= 2 && g.strides[0][0] == dst_size && g.strides[1][1] == src_size && g.strides[1][0] != src_size &&
         g.sizes[0] >= kMinSide && g.sizes[1] >= kMinSide;
}

template <typename To, typename From>
void copy_tiled(const LoopGeometry<2>& g) {
  constexpr int64_t kTile = 32;
  const int64_t n0 = g.sizes[0], n1 = g.sizes[1];
  const int64_t tiles1 = (n1 + kTile - 1) / kTile, outer = g.numel / (n0 * n1);
  const int64_t ds0 = g.strides[0][0], ds1 = g.strides[0][1], ss0 = g.strides[1][0], ss1 = g.strides[1][1];
  // Work item = (outer index, band of kTile along dim 1): kTile * n0 elements.
  const int64_t grain = std::max<int64_t>(1, kGrainSize / (kTile * n0));
  parallel_for(0, outer * tiles1, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      int64_t rest = item / tiles1;
      char* dst = g.base[0];
      const char* src = g.base[1];
      for (int d = 2; d < g.ndim(); ++d) {  // the outer dims' offsets
        const int64_t i = rest % g.sizes[d];
        rest /= g.sizes[d];
        dst += i * g.strides[0][d];
        src += i * g.strides[1][d];
      }
      const int64_t b1 = (item % tiles1) * kTile, e1 = std::min(n1, b1 + kTile);
      for (int64_t b0 = 0; b0 < n0; b0 += kTile) {
        const int64_t e0 = std::min(n0, b0 + kTile);
        for (int64_t i1 = b1; i1 < e1; ++i1)
          for (int64_t i0 = b0; i0 < e0; ++i0)
            *reinterpret_cast<To*>(dst + i0 * ds0 + i1 * ds1) =
                convert<To>(*reinterpret_cast<const From*>(src + i0 * ss0 + i1 * ss1));
      }
    }
  });
}

template <typename Bits>
void copy_bits_any(const Tensor& dst, const Tensor& src) {
  const LoopGeometry<2> g({dst, src});
  if (is_transpose(g, sizeof(Bits), sizeof(Bits))) return copy_tiled<Bits, Bits>(g);
  for_each_run(g, copy_bits<Bits>);
}

void copy_same_dtype(const Tensor& dst, const Tensor& src) {
  switch (dst.element_size()) {
    case 1: return copy_bits_any<uint8_t>(dst, src);
    case 2: return copy_bits_any<uint16_t>(dst, src);
    case 4: return copy_bits_any<uint32_t>(dst, src);
    case 8: return copy_bits_any<uint64_t>(dst, src);
  }
  KILN_FAIL("cpu::copy: unexpected element size ", dst.element_size());
}

template <typename To, typename From>
void convert_run(char* const* p, const int64_t* s, int64_t n) {
  if (s[0] == sizeof(To) && s[1] == sizeof(From)) {  // unit strides: a loop the compiler can vectorise
    To* dst = reinterpret_cast<To*>(p[0]);
    const From* src = reinterpret_cast<const From*>(p[1]);
    for (int64_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    *reinterpret_cast<To*>(p[0] + i * s[0]) = convert<To>(*reinterpret_cast<const From*>(p[1] + i * s[1]));
}

}  // namespace

void CpuBackend::copy(const Tensor& dst, const Tensor& src, bool non_blocking) {
  KILN_CHECK(dst.is_cpu() && src.is_cpu(), "cpu::copy: both tensors must be on the CPU, got ", dst.device(), " <- ",
             src.device(), "; copies involving a GPU are done by the CUDA backend");
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype()) {
    // Contiguous same-dtype copies (the common case) skip the geometry work.
    if (dst.is_contiguous() && src.is_contiguous() && src.shape() == dst.shape()) {
      std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
      return;
    }
    copy_same_dtype(dst, src);
    return;
  }
  visit_storage_dtype(dst.dtype(), [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    visit_storage_dtype(src.dtype(), [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      const LoopGeometry<2> g({dst, src});
      if (is_transpose(g, sizeof(To), sizeof(From))) return copy_tiled<To, From>(g);
      for_each_run(g, convert_run<To, From>);
    });
  });
}

void CpuBackend::fill(const Tensor& dst, Scalar value) {
  if (dst.numel() == 0) return;
  visit_storage_dtype(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = value.to<T>();
    for_each_run<1>({dst}, [v](char* const* p, const int64_t* s, int64_t n) {
      if (s[0] == sizeof(T)) {
        T* out = reinterpret_cast<T*>(p[0]);
        for (int64_t i = 0; i < n; ++i) out[i] = v;
        return;
      }
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
    });
  });
}

void CpuBackend::arange(const Tensor& dst, Scalar start, Scalar step) {
  KILN_CHECK(dst.dim() == 1, "cpu::arange: expected a 1-D destination, got shape ", dst.shape());
  const int64_t n = dst.numel(), stride = dst.stride(0);
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = dst.data_ptr<T>();
    if constexpr (std::is_integral_v<T>) {
      // Integers step exactly in int64 (a float step would drift over long ranges).
      const int64_t s0 = start.to_int64(), ds = step.to_int64();
      parallel_for(0, n, kGrainSize, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i * stride] = convert<T>(s0 + i * ds);
      });
    } else {
      const double s0 = start.to_double(), ds = step.to_double();
      parallel_for(0, n, kGrainSize, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i * stride] = convert<T>(s0 + static_cast<double>(i) * ds);
      });
    }
  });
}

void CpuBackend::linspace(const Tensor& dst, double start, double end) {
  KILN_CHECK(dst.dim() == 1, "cpu::linspace: expected a 1-D destination, got shape ", dst.shape());
  const int64_t n = dst.numel(), stride = dst.stride(0);
  if (n == 0) return;
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = dst.data_ptr<T>();
    if (n == 1) {
      out[0] = convert<T>(start);
      return;
    }
    // Symmetric, as PyTorch: the first half steps up from start and the second half down from end, so
    // both ends are exact and the rounding error is mirrored.
    const double step = (end - start) / static_cast<double>(n - 1);
    const int64_t half = n / 2;
    parallel_for(0, n, kGrainSize, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const double v = i < half ? start + static_cast<double>(i) * step : end - static_cast<double>(n - 1 - i) * step;
        out[i * stride] = convert<T>(v);
      }
    });
  });
}

}  // namespace kiln::cpu
