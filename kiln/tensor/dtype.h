// kiln/tensor/dtype.h — element types and PyTorch's type-promotion rules.
//
//   DType t = promote_types(DType::Int32, DType::Float16);   // Float16
//   size_t n = element_size(DType::BFloat16);                 // 2
//   std::cout << DType::Float32;                              // "float32"
#pragma once

#include <cstddef>  // size_t
#include <cstdint>
#include <ostream>
#include <string_view>

#include "kiln/tensor/half.h"  // Half, BFloat16

namespace kiln {

enum class DType : uint8_t {
  Bool,
  UInt8,
  Int32,
  Int64,
  Float16,
  BFloat16,
  Float32,
  Float64,
};
inline constexpr int kNumDTypes = 8;

inline size_t element_size(DType t) {
  switch (t) {
    case DType::Bool:
    case DType::UInt8: return 1;
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::Int32:
    case DType::Float32: return 4;
    case DType::Int64:
    case DType::Float64: return 8;
  }
  return 0;  // unreachable for a valid DType
}
std::string_view dtype_name(DType t);  // "float32", "bfloat16", "int64", ...
std::ostream& operator<<(std::ostream& os, DType t);

inline constexpr bool is_floating_point(DType t) {
  return t == DType::Float16 || t == DType::BFloat16 || t == DType::Float32 || t == DType::Float64;
}
inline constexpr bool is_integral(DType t, bool include_bool = false) {
  return t == DType::UInt8 || t == DType::Int32 || t == DType::Int64 || (include_bool && t == DType::Bool);
}
inline constexpr bool is_reduced_float(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

// The type two operands are computed in (PyTorch's table): bool < integers < floating point;
// within a category the wider type wins; Float16 with BFloat16 gives Float32; UInt8 with Int32 gives Int32.
DType promote_types(DType a, DType b);

// The default floating dtype (Float32), used by factories and for integer-to-float promotion
// (e.g. sqrt of an int tensor, or an int tensor plus a floating scalar).
inline constexpr DType kDefaultFloat = DType::Float32;

// Maps a C++ type to its DType: dtype_of<float>() == DType::Float32.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<bool>() {
  return DType::Bool;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::UInt8;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::Int32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::Int64;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::Float16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::BFloat16;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::Float32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::Float64;
}

}  // namespace kiln
