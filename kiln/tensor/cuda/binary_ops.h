// kiln/tensor/cuda/binary_ops.h — how CudaBackend::binary (binary.cu) reaches the comparisons and logical
// ops in compare.cu, a translation unit of its own to keep compile times short (backend-internal).
#pragma once

#include "kiln/tensor/backend.h"  // BinaryOp

namespace kiln::cuda {

// Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr, LogicalXor: any input dtype, Bool output.
void binary_compare(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);

}  // namespace kiln::cuda
