// kiln/tensor/cpu/convert.h — converting one element type into another, as PyTorch does on the CPU.
//
//   int32_t i = cpu::convert<int32_t>(-2.7f);   // -2: floats truncate toward zero
//   uint8_t u = cpu::convert<uint8_t>(-1.0);    // 255: through int64, then modulo 256
//   bool b = cpu::convert<bool>(0.1);           // true: anything nonzero (NaN included)
//   Half h = cpu::convert<Half>(1e-8);          // double -> float -> half, round to nearest even
//   auto e = cpu::convert<Float8_e4m3fn>(1e6);  // 448: double -> fp8 in one rounding, saturating (float8.h)
//
// Backend-internal: include it only from tensor/cpu/*.cpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/tensor/float8.h"  // Float8_e4m3fn, Float8_e5m2
#include "kiln/tensor/half.h"    // Half, BFloat16

namespace kiln::cpu {

template <typename T>
inline constexpr bool kIsReducedFloat = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename T>
inline constexpr bool kIsFloat8 = std::is_same_v<T, Float8_e4m3fn> || std::is_same_v<T, Float8_e5m2>;

template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (kIsReducedFloat<From> || kIsFloat8<From>) {
    return convert<To>(static_cast<float>(v));  // 16- and 8-bit floats widen exactly to float
  } else if constexpr (kIsFloat8<To>) {
    // float and double round once into fp8; integers go through double (exact up to 2^53, and anything larger
    // saturates anyway), bool as 0 or 1.
    if constexpr (std::is_same_v<From, float>) return To(v);
    else return To(static_cast<double>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (kIsReducedFloat<To>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, uint8_t> && std::is_floating_point_v<From>) {
    // A negative float into uint8 is undefined in C++; PyTorch goes through int64 and wraps (-1 -> 255).
    return static_cast<uint8_t>(static_cast<int64_t>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace kiln::cpu
