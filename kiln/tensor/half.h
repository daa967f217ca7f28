// kiln/tensor/half.h — 16-bit floating-point storage types: Half (IEEE binary16) and BFloat16.
//
//   kiln::Half h(1.5f);  float f = h;            // round-to-nearest-even on the way in
//   kiln::BFloat16 b(3.0f);  float g = float(b);
//
// They are storage types: arithmetic converts to float. The bit layouts match CUDA's __half and
// __nv_bfloat16, so buffers move between host and device unchanged.
#pragma once

#include <cstdint>  // uint16_t, uint32_t
#include <cstring>  // std::memcpy for bit casts
#include <ostream>

namespace kiln {

namespace detail {
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float -> binary16 with round-to-nearest-even, handling subnormals, overflow to inf and NaN.
inline uint16_t float_to_half_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0u));
  }
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (mag < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Scale into the subnormal range by adding 0.5 (2^-1): the float adder performs the rounding.
    float r = bits_float(mag) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(r) - 0x3f000000u));
  }
  uint32_t mant_odd = (mag >> 13) & 1u;
  mag += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (mag >> 13));
}

inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return bits_float(float_bits(f) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t float_to_bfloat16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  uint32_t rounding_bias = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding_bias) >> 16);
}
inline float bfloat16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }
}  // namespace detail

// IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits), as torch.float16; converts through float.
struct Half {
  uint16_t bits = 0;  // the binary16 bit pattern
  Half() = default;
  // Rounds f to nearest even; beyond the range gives ±inf, NaN stays NaN.
  Half(float f) : bits(detail::float_to_half_bits(f)) {}  // NOLINT: implicit like a builtin float type
  // The value as a float (exact).
  operator float() const { return detail::half_bits_to_float(bits); }  // NOLINT
  // A Half with bit pattern b.
  static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

// bfloat16 (1 sign, 8 exponent, 7 mantissa bits: float32's top half), as torch.bfloat16.
struct BFloat16 {
  uint16_t bits = 0;  // the bfloat16 bit pattern
  BFloat16() = default;
  // Rounds f to nearest even; NaN stays a quiet NaN.
  BFloat16(float f) : bits(detail::float_to_bfloat16_bits(f)) {}  // NOLINT
  // The value as a float (exact).
  operator float() const { return detail::bfloat16_bits_to_float(bits); }  // NOLINT
  // A BFloat16 with bit pattern b.
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

// Writes the value as a float.
inline std::ostream& operator<<(std::ostream& os, Half h) { return os << static_cast<float>(h); }
// Writes the value as a float.
inline std::ostream& operator<<(std::ostream& os, BFloat16 h) { return os << static_cast<float>(h); }

}  // namespace kiln
