#include "kiln/tensor/dtype.h"

#include "kiln/tensor/error.h"
#include "kiln/tensor/scalar.h"
#include "kiln/tensor/tensor_options.h"

namespace kiln {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "invalid";
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Bool) return b;
  if (b == DType::Bool) return a;
  const bool fa = is_floating_point(a), fb = is_floating_point(b);
  if (fa != fb) return fa ? a : b;  // floating beats integral
  if (fa) {
    if (is_reduced_float(a) && is_reduced_float(b)) return DType::Float32;  // Float16 with BFloat16
    // The wider float wins; among 16-bit floats and a wider one, the wider.
    auto rank = [](DType t) { return t == DType::Float64 ? 3 : t == DType::Float32 ? 2 : 1; };
    return rank(a) >= rank(b) ? a : b;
  }
  auto rank = [](DType t) { return t == DType::UInt8 ? 1 : t == DType::Int32 ? 2 : 3; };
  return rank(a) >= rank(b) ? a : b;
}

std::ostream& operator<<(std::ostream& os, const Scalar& s) {
  switch (s.kind()) {
    case Scalar::Kind::Bool: return os << (s.to_bool() ? "true" : "false");
    case Scalar::Kind::Integral: return os << s.to_int64();
    case Scalar::Kind::Floating: return os << s.to_double();
  }
  return os;
}

std::ostream& operator<<(std::ostream& os, MemoryFormat f) {
  switch (f) {
    case MemoryFormat::Contiguous: return os << "contiguous";
    case MemoryFormat::ChannelsLast: return os << "channels_last";
    case MemoryFormat::Preserve: return os << "preserve";
  }
  return os;
}

}  // namespace kiln
