// kiln/tensor/float8.h — 8-bit floating-point storage types of the OCP FP8 spec: Float8_e4m3fn and Float8_e5m2.
//
//   kiln::Float8_e4m3fn a(0.3f);   float f = a;   // 0.3125: round to nearest even on the way in, exact on the way out
//   kiln::Float8_e4m3fn b(1e6);    float g = b;   // 448: out-of-range values saturate to the largest finite value
//   kiln::Float8_e5m2 c(-INFINITY);               // -57344: so do infinities (saturation, as CUDA's __NV_SATFINITE)
//
// Bit layouts (the same as CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2 and PyTorch's float8_e4m3fn / float8_e5m2, so
// buffers move between host, device and files unchanged):
//   E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities; the only NaNs are S.1111.111
//           (0x7f, 0xff). Largest finite 448 (0x7e), smallest normal 2^-6, smallest subnormal 2^-9.
//   E5M2:   sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-style: S.11111.00 is ±inf, S.11111.{01,10,11}
//           NaN. Largest finite 57344 (0x7b), smallest normal 2^-14, smallest subnormal 2^-16.
//
// Conversion into FP8 (from float or double; every other type goes through one of those exactly) rounds to nearest,
// ties to even, once, and saturates as PTX's cvt.rn.satfinite: a finite value beyond the largest finite one
// becomes ±max, ±inf becomes ±max (E5M2 included: a conversion never makes an infinity), and NaN becomes the
// canonical NaN 0x7f whatever its sign and payload. Values below half the smallest subnormal become ±0 (the sign
// kept). Conversion out of FP8 is exact (every FP8 value is a float, a half and a bfloat16); a NaN code gives the
// canonical quiet float NaN (0x7fc00000), E5M2's infinities give ±inf.
//
// They are storage types: kiln computes nothing in FP8 (tensor ops refuse FP8 tensors; cast to bfloat16 or float32).
// The conversions are plain integer code, so they give the same bits on every CPU.
#pragma once

#include <cstdint>  // uint8_t, uint32_t, uint64_t
#include <cstring>  // std::memcpy for bit casts
#include <ostream>

namespace kiln {

namespace detail {

// The parameters of one FP8 format.
struct Fp8Format {
  int mantissa_bits;    // 3 (E4M3FN) or 2 (E5M2)
  int bias;             // 7 or 15
  uint8_t max_code;     // the largest finite magnitude's code: 0x7e (448) or 0x7b (57344)
  uint64_t max_double;  // the bits of that magnitude as a double
  bool ieee_specials;   // E5M2: exponent all ones is inf (mantissa 0) or NaN; E4M3FN: only S.1111.111 is NaN
};
inline constexpr Fp8Format kE4M3 = {3, 7, 0x7e, 0x407c000000000000ull, false};  // 448 = 1.75 * 2^8
inline constexpr Fp8Format kE5M2 = {2, 15, 0x7b, 0x40ec000000000000ull, true};  // 57344 = 1.75 * 2^15
inline constexpr uint8_t kFp8CanonicalNaN = 0x7f;

// double -> FP8 code: round to nearest even once, saturating (see the header comment).
inline uint8_t double_to_fp8_bits(double v, const Fp8Format& fmt) {
  uint64_t x;
  std::memcpy(&x, &v, sizeof x);
  const uint8_t sign = static_cast<uint8_t>((x >> 63) << 7);
  const uint64_t mag = x & 0x7fffffffffffffffull;
  if (mag > 0x7ff0000000000000ull) return kFp8CanonicalNaN;                     // NaN
  if (mag >= fmt.max_double) return static_cast<uint8_t>(sign | fmt.max_code);  // >= max, inf: saturate
  const int m = fmt.mantissa_bits;
  const int emin = 1 - fmt.bias;                     // the exponent of the smallest normal
  const int e = static_cast<int>(mag >> 52) - 1023;  // |v| in [2^e, 2^(e+1)) (double subnormals: -1023)
  if (e < emin - m - 1) return sign;                 // below half the smallest subnormal: ±0
  const uint64_t significand = (mag & 0xfffffffffffffull) | (1ull << 52);  // |v| = significand * 2^(e-52)
  // The result is a multiple of 2^q, q = max(e, emin) - m (the spacing of FP8 values near |v|): drop the bits of
  // `significand` below 2^q and round what is left, ties to even. 52 - m <= shift <= 53.
  const int q = (e > emin ? e : emin) - m;
  const int shift = q - (e - 52);
  uint64_t units = significand >> shift;  // |v| / 2^q, truncated
  const uint64_t rest = significand & ((1ull << shift) - 1), half = 1ull << (shift - 1);
  if (rest > half || (rest == half && (units & 1) != 0)) ++units;
  // Normal: units in [2^m, 2^(m+1)], code = (biased exponent << m) + mantissa = ((e + bias - 1) << m) + units,
  // a carry out of the mantissa raising the exponent. Subnormal: code = units (2^m being the smallest normal).
  uint64_t code = e >= emin ? (static_cast<uint64_t>(e + fmt.bias - 1) << m) + units : units;
  if (code > fmt.max_code) code = fmt.max_code;  // rounded past the largest finite value: saturate
  return static_cast<uint8_t>(sign | code);
}

// FP8 code -> float, exactly.
inline float fp8_bits_to_float(uint8_t c, const Fp8Format& fmt) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const int m = fmt.mantissa_bits;
  const uint32_t exp_mask = (0x7fu >> m);
  const uint32_t exp = (c >> m) & exp_mask, mant = c & ((1u << m) - 1);
  uint32_t bits;
  if (exp == exp_mask && (fmt.ieee_specials || mant == (1u << m) - 1)) {
    bits = fmt.ieee_specials && mant == 0 ? (sign | 0x7f800000u) : 0x7fc00000u;  // ±inf, or the canonical NaN
  } else if (exp == 0) {
    // Subnormal or zero: mant * 2^(1 - bias - m), exact in float.
    float f = static_cast<float>(mant);
    uint32_t scale = static_cast<uint32_t>(127 + 1 - fmt.bias - m) << 23;
    float s;
    std::memcpy(&s, &scale, sizeof s);
    f *= s;
    std::memcpy(&bits, &f, sizeof bits);
    bits |= sign;
  } else {
    bits = sign | ((exp - static_cast<uint32_t>(fmt.bias) + 127u) << 23) | (mant << (23 - m));
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace detail

// An FP8 E4M3FN value (see above), as torch.float8_e4m3fn; converts through float.
struct Float8_e4m3fn {
  uint8_t bits = 0;  // the bit pattern
  Float8_e4m3fn() = default;
  // Rounds f to nearest even, once, saturating (see above).
  explicit Float8_e4m3fn(float f) : bits(detail::double_to_fp8_bits(f, detail::kE4M3)) {}
  // Rounds d to nearest even, once, saturating (see above).
  explicit Float8_e4m3fn(double d) : bits(detail::double_to_fp8_bits(d, detail::kE4M3)) {}
  // The value as a float (exact).
  operator float() const { return detail::fp8_bits_to_float(bits, detail::kE4M3); }  // NOLINT: exact, like a widening
  // The value with bit pattern b.
  static Float8_e4m3fn from_bits(uint8_t b) {
    Float8_e4m3fn v;
    v.bits = b;
    return v;
  }
};

// An FP8 E5M2 value (see above), as torch.float8_e5m2; converts through float.
struct Float8_e5m2 {
  uint8_t bits = 0;  // the bit pattern
  Float8_e5m2() = default;
  // Rounds f to nearest even, once, saturating (see above).
  explicit Float8_e5m2(float f) : bits(detail::double_to_fp8_bits(f, detail::kE5M2)) {}
  // Rounds d to nearest even, once, saturating (see above).
  explicit Float8_e5m2(double d) : bits(detail::double_to_fp8_bits(d, detail::kE5M2)) {}
  // The value as a float (exact).
  operator float() const { return detail::fp8_bits_to_float(bits, detail::kE5M2); }  // NOLINT
  // The value with bit pattern b.
  static Float8_e5m2 from_bits(uint8_t b) {
    Float8_e5m2 v;
    v.bits = b;
    return v;
  }
};

// Writes the value as a float.
inline std::ostream& operator<<(std::ostream& os, Float8_e4m3fn v) { return os << static_cast<float>(v); }
// Writes the value as a float.
inline std::ostream& operator<<(std::ostream& os, Float8_e5m2 v) { return os << static_cast<float>(v); }

}  // namespace kiln
