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
    case DType::Float8_e4m3fn: return "float8_e4m3fn";
    case DType::Float8_e5m2: return "float8_e5m2";
  }
  return "invalid";
}

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

void check_not_float8(std::string_view op, DType t) {
  if (!is_float8(t)) return;
  throw NotImplementedError(detail::str_cat(
      op, ": not implemented for ", t,
      " tensors (float8 dtypes are storage types: they support casts, copies, views, printing and checkpoints, "
      "but no arithmetic); cast to bfloat16 or float32 first, e.g. t.to(DType::BFloat16)"));
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (is_float8(a) || is_float8(b)) {
    throw NotImplementedError(detail::str_cat("promote_types: no implicit type promotion between ", a, " and ", b,
                                              " (float8 dtypes promote only with themselves, as in PyTorch); cast "
                                              "explicitly first, e.g. to bfloat16 or float32 with .to(dtype)"));
  }
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
