// kiln/tensor/ops/elementwise_common.h — what the elementwise frontends share: operands that are a tensor or
// a Scalar, PyTorch's type promotion over them, devices, broadcasting and the checks of in-place ops.
//
//   Tensor c = detail::binary("add", BinaryOp::Add, a, Scalar(2.5), ResultKind::Same);  // promotes, broadcasts
//   detail::binary_("mul_", BinaryOp::Mul, a, b, ResultKind::Same);               // in place into a
//
// Frontend-internal: include it only from tensor/ops/*.cpp.
#pragma once

#include <initializer_list>
#include <optional>
#include <string_view>

#include "kiln/tensor/backend.h"  // UnaryOp, BinaryOp, UnaryParams
#include "kiln/tensor/internal_ops.h"

namespace kiln::internal::detail {

// One input of an elementwise op: a tensor, or a number written beside tensors (which counts less in
// type promotion: int_tensor + 2.5 is float32, but uint8_tensor + 300 stays uint8).
struct Operand {
  Tensor tensor;
  std::optional<Scalar> scalar;
  Operand(const Tensor& t) : tensor(t) {}  // NOLINT: implicit, so ops pass tensors and numbers alike
  Operand(Scalar s) : scalar(s) {}         // NOLINT
  bool is_scalar() const { return scalar.has_value(); }
  const Shape& shape() const {
    static const Shape kScalarShape;
    return is_scalar() ? kScalarShape : tensor.shape();
  }
};

// What the result dtype of an op is, given the promoted dtype of its inputs.
enum class ResultKind {
  Same,   // the promoted dtype (add, mul, maximum, ...)
  Float,  // the promoted dtype if floating, else kDefaultFloat (div, exp, sqrt, ...)
  Bool,   // Bool, computed in the promoted dtype (comparisons, logical ops, isnan, ...)
};

// PyTorch's result_type: by category (bool < integer < floating), dimensioned tensors outrank 0-d tensors,
// which outrank Scalars; a lower-ranked operand only matters when it is of a higher category.
DType result_type_of(std::initializer_list<const Operand*> operands);

// Throws naming `op` (and the operand's position) when a tensor operand is undefined.
void check_defined(std::string_view op, std::initializer_list<const Operand*> operands);

// The device the op runs on: that of its tensors, which must agree, except that a 0-d CPU tensor may
// join tensors of any device (as in PyTorch, it is copied over).
Device common_device(std::string_view op, std::initializer_list<const Operand*> operands);

// The memory format of an output of `shape`: ChannelsLast when an input of that full shape is channels-last.
MemoryFormat output_format(const Shape& shape, std::initializer_list<const Operand*> operands);

// The operand as a tensor of `dtype` on `device`, broadcast (stride 0) to `shape`.
Tensor prepare(const Operand& operand, DType dtype, Device device, const Shape& shape);

// In-place ops keep the destination's dtype, so the result type must be castable to it (not float into
// an integer or bool tensor, not a number into bool), as in PyTorch.
void check_can_cast(std::string_view op, DType result, DType destination);

// The destination of an in-place op must have the broadcast shape, and no two elements at one address.
void check_inplace_destination(std::string_view op, const Tensor& self, const Shape& broadcast_shape);

// Marks a tensor written in place (autograd compares storage versions).
void bump_version(const Tensor& t);

// Drops the calling thread's cache of broadcast scalar constants (cuda::empty_cache, so that their blocks can go).
void release_cached_constants();

// out = op(a, b) with promotion and broadcasting; comparisons and logical ops give Bool.
Tensor binary(std::string_view name, BinaryOp op, const Operand& a, const Operand& b, ResultKind kind);
// self = op(self, b): computed in the promoted dtype, stored in self's dtype.
Tensor& binary_(std::string_view name, BinaryOp op, Tensor& self, const Operand& b, ResultKind kind);

// out = op(a); Float ops compute integer inputs in kDefaultFloat; Bool ops give Bool.
Tensor unary(std::string_view name, UnaryOp op, const Tensor& a, ResultKind kind, const UnaryParams& params = {});
Tensor& unary_(std::string_view name, UnaryOp op, Tensor& self, ResultKind kind, const UnaryParams& params = {});

}  // namespace kiln::internal::detail
