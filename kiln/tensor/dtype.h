// kiln/tensor/dtype.h — element types and PyTorch's type-promotion rules.
//
//   DType t = promote_types(DType::Int32, DType::Float16);   // Float16
//   size_t n = element_size(DType::BFloat16);                 // 2
//   std::cout << DType::Float32;                              // "float32"
//
// Float8_e4m3fn and Float8_e5m2 (float8.h) are storage types: tensors of them can be made, cast to and from every
// other dtype (saturating, see float8.h), copied, viewed, printed and saved, but no op computes in them (each
// refuses them with a kiln::Error naming the op: cast to bfloat16 or float32 first), and, as in PyTorch, they take
// part in no implicit type promotion.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>
#include <ostream>
#include <string_view>

#include "kiln/tensor/float8.h"  // Float8_e4m3fn, Float8_e5m2
#include "kiln/tensor/half.h"    // Half, BFloat16

namespace kiln {

// A tensor's element type; each is the torch.dtype of the same name in lower case (float32, bfloat16, ...).
enum class DType : uint8_t {
  Bool,
  UInt8,
  Int32,
  Int64,
  Float16,
  BFloat16,
  Float32,
  Float64,
  Float8_e4m3fn,  // storage only (see above)
  Float8_e5m2,    // storage only
};
inline constexpr int kNumDTypes = 10;  // the number of DType values

inline size_t element_size(DType t) {
  switch (t) {
    case DType::Bool:
    case DType::UInt8:
    case DType::Float8_e4m3fn:
    case DType::Float8_e5m2: return 1;
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::Int32:
    case DType::Float32: return 4;
    case DType::Int64:
    case DType::Float64: return 8;
  }
  return 0;  // unreachable for a valid DType
}
std::string_view dtype_name(DType t);  // "float32", "bfloat16", "int64", "float8_e4m3fn", ... (PyTorch's spelling)
std::ostream& operator<<(std::ostream& os, DType t);  // writes dtype_name(t)

// Float8_e4m3fn or Float8_e5m2.
inline constexpr bool is_float8(DType t) { return t == DType::Float8_e4m3fn || t == DType::Float8_e5m2; }
inline constexpr bool is_floating_point(DType t) {  // 16-, 32-, 64-bit and float8 types
  return t == DType::Float16 || t == DType::BFloat16 || t == DType::Float32 || t == DType::Float64 || is_float8(t);
}
inline constexpr bool is_integral(DType t, bool include_bool = false) {  // UInt8, Int32, Int64 (and Bool if asked)
  return t == DType::UInt8 || t == DType::Int32 || t == DType::Int64 || (include_bool && t == DType::Bool);
}
// Float16 or BFloat16.
inline constexpr bool is_reduced_float(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

// The type two operands are computed in (PyTorch's table): bool < integers < floating point;
// within a category the wider type wins; Float16 with BFloat16 gives Float32; UInt8 with Int32 gives Int32.
// A float8 dtype promotes only with itself: with any other dtype it throws a kiln::Error (as PyTorch does).
DType promote_types(DType a, DType b);

// Throws a NotImplementedError naming `op` and the dtype when t is a float8 dtype, which no op computes in: "add: not
// implemented for float8_e4m3fn tensors (...); cast to bfloat16 or float32 first". Every op that computes calls
// it (through its frontend in tensor/ops/) before it reaches a backend.
void check_not_float8(std::string_view op, DType t);

// The default floating dtype (Float32), used by factories and for integer-to-float promotion
// (e.g. sqrt of an int tensor, or an int tensor plus a floating scalar).
inline constexpr DType kDefaultFloat = DType::Float32;

// Maps a C++ type to its DType: dtype_of<float>() == DType::Float32.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<bool>() {  // DType::Bool
  return DType::Bool;
}
template <>
constexpr DType dtype_of<uint8_t>() {  // DType::UInt8
  return DType::UInt8;
}
template <>
constexpr DType dtype_of<int32_t>() {  // DType::Int32
  return DType::Int32;
}
template <>
constexpr DType dtype_of<int64_t>() {  // DType::Int64
  return DType::Int64;
}
template <>
constexpr DType dtype_of<Half>() {  // DType::Float16
  return DType::Float16;
}
template <>
constexpr DType dtype_of<BFloat16>() {  // DType::BFloat16
  return DType::BFloat16;
}
template <>
constexpr DType dtype_of<float>() {  // DType::Float32
  return DType::Float32;
}
template <>
constexpr DType dtype_of<double>() {  // DType::Float64
  return DType::Float64;
}
template <>
constexpr DType dtype_of<Float8_e4m3fn>() {  // DType::Float8_e4m3fn
  return DType::Float8_e4m3fn;
}
template <>
constexpr DType dtype_of<Float8_e5m2>() {  // DType::Float8_e5m2
  return DType::Float8_e5m2;
}

}  // namespace kiln
