// kiln/tensor/cuda/binary_ops.h — how CudaBackend::binary (binary.cu) reaches the comparisons and logical
// ops in compare.cu and the activation gradients in activation_backward.cu, translation units of their own
// to keep compile times short (backend-internal).
#pragma once

#include "kiln/tensor/backend.h"  // BinaryOp

namespace kiln::cuda {

// Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr, LogicalXor: any input dtype, Bool output.
void binary_compare(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);

// GeluErfBackward, GeluTanhBackward, SiluBackward, ReluBackward: floating dtypes, out = g * f'(x).
void binary_activation_backward(BinaryOp op, const Tensor& out, const Tensor& g, const Tensor& x);

}  // namespace kiln::cuda
