// kiln/tensor/ops/index_checks.h — argument checks shared by the linalg, index and concat frontends
// (internal to kiln/tensor/ops; not a public header).
//
//   check_defined("gather", a, "the input");
//   Tensor idx = index_tensor("gather", index, a.device());   // Int64, Int32 cast to it, else a clear error
#pragma once

#include <string_view>

#include "kiln/tensor/internal_ops.h"

namespace kiln::internal {

// The enum spelling of a dtype, for hints such as "convert it with .to(DType::Float64)".
inline std::string_view dtype_enum_name(DType t) {
  switch (t) {
    case DType::Bool: return "Bool";
    case DType::UInt8: return "UInt8";
    case DType::Int32: return "Int32";
    case DType::Int64: return "Int64";
    case DType::Float16: return "Float16";
    case DType::BFloat16: return "BFloat16";
    case DType::Float32: return "Float32";
    case DType::Float64: return "Float64";
    case DType::Float8_e4m3fn: return "Float8_e4m3fn";
    case DType::Float8_e5m2: return "Float8_e5m2";
  }
  return "?";
}

// Throws kiln::Error "<op>: <what> is an undefined tensor" when t is undefined.
inline void check_defined(std::string_view op, const Tensor& t, std::string_view what) {
  KILN_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

// Throws kiln::Error naming op, b_name and both devices when b is not on a's device.
inline void check_same_device(std::string_view op, const Tensor& a, const Tensor& b, std::string_view b_name) {
  KILN_CHECK(a.device() == b.device(), op, ": expected ", b_name, " on the input's device ", a.device(), ", got ",
             b.device(), "; move it with .to(Device(\"", a.device().str(), "\"))");
}

// Index tensors are Int64 (Int32 is accepted and cast); anything else is an error naming the op.
inline Tensor index_tensor(std::string_view op, const Tensor& index, Device device) {
  check_defined(op, index, "the index");
  KILN_CHECK(index.device() == device, op, ": expected the index on the input's device ", device, ", got ",
             index.device(), "; move it with .to(Device(\"", device.str(), "\"))");
  KILN_CHECK(index.dtype() == DType::Int64 || index.dtype() == DType::Int32, op,
             ": expected an Int64 or Int32 index tensor, got ", index.dtype(), "; convert it with .to(DType::Int64)");
  return index.dtype() == DType::Int64 ? index : internal::cast(index, DType::Int64);
}

}  // namespace kiln::internal
