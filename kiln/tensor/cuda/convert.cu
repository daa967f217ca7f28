// CUDA kernels: copying between two tensors on one GPU with a layout change and/or a dtype conversion
// (all 100 dtype pairs). The contiguous same-dtype case never gets here: copy.cu uses cudaMemcpyAsync.
//
// Float8 tensors move as their uint8 codes and convert with cuda_fp8.h's saturating conversions
// (__NV_SATFINITE: cvt.rn.satfinite on sm_89+), with NaN made canonical on both sides, so that the results
// have the bits of the CPU's (float8.h): any NaN becomes code 0x7f, a NaN code becomes the float 0x7fc00000.
#include <cuda_fp8.h>  // __nv_cvt_float_to_fp8, __nv_cvt_double_to_fp8, __nv_cvt_fp8_to_halfraw

#include "kiln/tensor/cuda/convert.cuh"  // convert_value
#include "kiln/tensor/cuda/loops.cuh"    // launch_elementwise

namespace kiln::cuda {
namespace {

template <typename To, typename From>
struct ConvertF {
  __device__ compute_t<To> operator()(compute_t<From> v) const { return convert_value<To, From>(v); }
};

// Same dtype: the bits move through an unsigned integer of the element's width (NaN payloads intact).
template <typename Bits>
struct MoveBitsF {
  __device__ Bits operator()(Bits v) const { return v; }
};

// ---- float8: codes in uint8_t ----
template <typename F8>
constexpr __nv_fp8_interpretation_t kInterpretation = std::is_same_v<F8, Float8_e4m3fn> ? __NV_E4M3 : __NV_E5M2;

// A value of compute type C into an F8 code: one rounding to nearest even, saturating; NaN -> 0x7f.
template <typename F8, typename C>
__device__ __forceinline__ uint8_t encode_fp8(C v) {
  if constexpr (std::is_same_v<C, float>) {
    if (v != v) return 0x7f;
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kInterpretation<F8>);
  } else {
    // double directly (one rounding); integers and bool through double (exact up to 2^53; beyond, saturated).
    const double d = static_cast<double>(v);
    if (d != d) return 0x7f;
    return __nv_cvt_double_to_fp8(d, __NV_SATFINITE, kInterpretation<F8>);
  }
}

// An F8 code as a float, exactly; NaN codes give the canonical quiet NaN 0x7fc00000.
template <typename F8>
__device__ __forceinline__ float decode_fp8(uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(code, kInterpretation<F8>);
  const float f = __half2float(__half(h));
  return f != f ? __int_as_float(0x7fc00000) : f;
}

template <typename F8, typename From>
struct ToFp8F {
  __device__ uint8_t operator()(compute_t<From> v) const { return encode_fp8<F8>(v); }
};

template <typename To, typename F8>
struct FromFp8F {
  __device__ compute_t<To> operator()(uint8_t code) const { return convert_value<To, float>(decode_fp8<F8>(code)); }
};

template <typename To8, typename From8>
struct Fp8ToFp8F {
  __device__ uint8_t operator()(uint8_t code) const { return encode_fp8<To8>(decode_fp8<From8>(code)); }
};

// Conversions where dst or src (or both) is float8; the same dtype never gets here.
void copy_float8(const Tensor& dst, const Tensor& src) {
  visit_storage_dtype(dst.dtype(), [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    visit_storage_dtype(src.dtype(), [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      constexpr bool to8 = std::is_same_v<To, Float8_e4m3fn> || std::is_same_v<To, Float8_e5m2>;
      constexpr bool from8 = std::is_same_v<From, Float8_e4m3fn> || std::is_same_v<From, Float8_e5m2>;
      if constexpr (std::is_same_v<To, From>) {
        KILN_FAIL("cuda::copy: unexpected same-dtype float8 conversion");
      } else if constexpr (to8 && from8) {
        launch_elementwise("copy_", Types<uint8_t, uint8_t>{}, {dst, src}, Fp8ToFp8F<To, From>{});
      } else if constexpr (to8) {
        launch_elementwise("copy_", Types<uint8_t, From>{}, {dst, src}, ToFp8F<To, From>{});
      } else if constexpr (from8) {
        launch_elementwise("copy_", Types<To, uint8_t>{}, {dst, src}, FromFp8F<To, From>{});
      }
    });
  });
}

}  // namespace

void copy_on_device(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype()) {
    switch (dst.element_size()) {
      case 1: return launch_elementwise("copy_", Types<uint8_t, uint8_t>{}, {dst, src}, MoveBitsF<uint8_t>{});
      case 2: return launch_elementwise("copy_", Types<uint16_t, uint16_t>{}, {dst, src}, MoveBitsF<uint16_t>{});
      case 4: return launch_elementwise("copy_", Types<uint32_t, uint32_t>{}, {dst, src}, MoveBitsF<uint32_t>{});
      case 8: return launch_elementwise("copy_", Types<uint64_t, uint64_t>{}, {dst, src}, MoveBitsF<uint64_t>{});
    }
    KILN_FAIL("cuda::copy: unexpected element size ", dst.element_size());
  }
  if (is_float8(dst.dtype()) || is_float8(src.dtype())) return copy_float8(dst, src);
  visit_dtype(dst.dtype(), [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    visit_dtype(src.dtype(), [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      if constexpr (!std::is_same_v<To, From>) {
        launch_elementwise("copy_", Types<To, From>{}, {dst, src}, ConvertF<To, From>{});
      }
    });
  });
}

}  // namespace kiln::cuda
