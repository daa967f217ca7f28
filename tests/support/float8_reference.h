// tests/support/float8_reference.h — the FP8 formats' values and rounding, from their bit fields in float64: the
// independent reference the float8 tests compare kiln's casts, quantisation and products with. Nothing here calls
// kiln's own conversions (kiln/tensor/float8.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kiln/tensor/dtype.h"

namespace kiln::testing {

struct Fp8Format {
  DType dtype;
  int exp_bits, man_bits, bias;
  bool ieee;         // E5M2: exponent all ones is inf / NaN; E4M3FN: only S.1111.111 is NaN
  uint8_t max_code;  // the largest finite positive code
  double max_value;  // its value
  double min_sub;    // the smallest positive subnormal
};
inline const Fp8Format kE4M3 = {DType::Float8_e4m3fn, 4, 3, 7, false, 0x7e, 448.0, 0x1p-9};
inline const Fp8Format kE5M2 = {DType::Float8_e5m2, 5, 2, 15, true, 0x7b, 57344.0, 0x1p-16};
inline const Fp8Format& fp8_format_of(DType t) { return t == DType::Float8_e4m3fn ? kE4M3 : kE5M2; }

// The value of a code, from its sign, exponent and mantissa fields.
inline double fp8_value(const Fp8Format& f, uint8_t code) {
  const int sign = code >> 7, e = (code >> f.man_bits) & ((1 << f.exp_bits) - 1), m = code & ((1 << f.man_bits) - 1);
  const int all_ones = (1 << f.exp_bits) - 1;
  const double s = sign ? -1.0 : 1.0;
  if (f.ieee && e == all_ones) return m == 0 ? s * std::numeric_limits<double>::infinity() : std::nan("");
  if (!f.ieee && e == all_ones && m == (1 << f.man_bits) - 1) return std::nan("");
  if (e == 0) return s * std::ldexp(static_cast<double>(m), 1 - f.bias - f.man_bits);
  return s * std::ldexp(1.0 + static_cast<double>(m) / (1 << f.man_bits), e - f.bias);
}

// The code a double should become: NaN -> 0x7f; |v| >= max (inf included) -> ±max; else the nearest code, ties to
// the even code (the code's last bit is the mantissa's). Found by searching the decoded positive codes; the two
// distances are exact (Sterbenz: v lies within a factor of 2 of both neighbours, or the lower one is 0).
inline uint8_t fp8_code(const Fp8Format& f, double v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::abs(v);
  if (a >= f.max_value) return sign | f.max_code;
  int lo = 0;
  while (lo + 1 <= f.max_code && fp8_value(f, static_cast<uint8_t>(lo + 1)) <= a) ++lo;
  const double vlo = fp8_value(f, static_cast<uint8_t>(lo));
  if (vlo == a) return sign | static_cast<uint8_t>(lo);
  const double vhi = fp8_value(f, static_cast<uint8_t>(lo + 1));
  const double dlo = a - vlo, dhi = vhi - a;
  const int c = dlo < dhi ? lo : dhi < dlo ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
  return sign | static_cast<uint8_t>(c);
}

}  // namespace kiln::testing
