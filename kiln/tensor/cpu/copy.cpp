// CPU kernels: copy with conversion, fill, arange, linspace.
#include <cstring>

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/dispatch.h"

namespace kiln::cpu {
namespace {

// Converts one element; bool results are "nonzero", 16-bit floats go through float.
template <typename To, typename From>
To convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return static_cast<float>(v) != 0.0f;
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return static_cast<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

// Calls fn(dst_offset, src_offset) for every element in row-major order (offsets in elements).
template <typename F>
void for_each_index(const Shape& sizes, const Strides& ds, const Strides& ss, F&& fn) {
  const size_t rank = sizes.size();
  const int64_t n = numel(sizes);
  std::vector<int64_t> idx(rank, 0);
  int64_t d = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) {
    fn(d, s);
    for (size_t k = rank; k-- > 0;) {
      if (++idx[k] < sizes[k]) {
        d += ds[k];
        s += ss[k];
        break;
      }
      d -= ds[k] * (sizes[k] - 1);
      s -= ss[k] * (sizes[k] - 1);
      idx[k] = 0;
    }
  }
}

}  // namespace

void CpuBackend::copy(const Tensor& dst, const Tensor& src, bool non_blocking) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  visit_dtype(dst.dtype(), [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    visit_dtype(src.dtype(), [&](auto stag) {
      using S = typename decltype(stag)::type;
      D* dp = dst.data_ptr<D>();
      const S* sp = src.data_ptr<S>();
      for_each_index(dst.shape(), dst.strides(), src.strides(), [&](int64_t d, int64_t s) { dp[d] = convert<D>(sp[s]); });
    });
  });
}

void CpuBackend::fill(const Tensor& dst, Scalar value) {
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = value.to<T>();
    T* p = dst.data_ptr<T>();
    for_each_index(dst.shape(), dst.strides(), dst.strides(), [&](int64_t d, int64_t) { p[d] = v; });
  });
}

void CpuBackend::arange(const Tensor& dst, Scalar start, Scalar step) {
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = dst.data_ptr<T>();
    const int64_t n = dst.numel(), stride = dst.stride(0);
    if constexpr (std::is_integral_v<T>) {
      const int64_t a = start.to_int64(), s = step.to_int64();
      for (int64_t i = 0; i < n; ++i) p[i * stride] = static_cast<T>(a + i * s);
    } else {
      const double a = start.to_double(), s = step.to_double();
      for (int64_t i = 0; i < n; ++i) p[i * stride] = static_cast<T>(a + static_cast<double>(i) * s);
    }
  });
}

void CpuBackend::linspace(const Tensor& dst, double start, double end) {
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = dst.data_ptr<T>();
    const int64_t n = dst.numel(), stride = dst.stride(0);
    const double step = (end - start) / static_cast<double>(n - 1);
    const int64_t half = n / 2;
    for (int64_t i = 0; i < n; ++i) {
      const double v = i < half ? start + step * static_cast<double>(i) : end - step * static_cast<double>(n - 1 - i);
      p[i * stride] = convert<T>(v);
    }
  });
}

}  // namespace kiln::cpu
