// CPU kernels: copy with dtype conversion, fill, arange, linspace.
#include <cstring>  // std::memcpy

#include "kiln/tensor/cpu/convert.h"  // convert<To>(From)
#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/loops.h"  // for_each_run
#include "kiln/tensor/dispatch.h"   // visit_dtype

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

void copy_same_dtype(const Tensor& dst, const Tensor& src) {
  switch (dst.element_size()) {
    case 1: return for_each_run<2>({dst, src}, copy_bits<uint8_t>);
    case 2: return for_each_run<2>({dst, src}, copy_bits<uint16_t>);
    case 4: return for_each_run<2>({dst, src}, copy_bits<uint32_t>);
    case 8: return for_each_run<2>({dst, src}, copy_bits<uint64_t>);
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
  visit_dtype(dst.dtype(), [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    visit_dtype(src.dtype(), [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      for_each_run<2>({dst, src}, convert_run<To, From>);
    });
  });
}

void CpuBackend::fill(const Tensor& dst, Scalar value) {
  if (dst.numel() == 0) return;
  visit_dtype(dst.dtype(), [&](auto tag) {
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
