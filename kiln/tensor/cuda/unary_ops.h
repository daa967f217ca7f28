// kiln/tensor/cuda/unary_ops.h — how CudaBackend::unary (unary.cu) reaches the floating-only ops in
// unary_float.cu, a translation unit of its own to keep compile times short (backend-internal).
#pragma once

#include "kiln/tensor/backend.h"  // UnaryOp

namespace kiln::cuda {

// Runs `op` when it is one of the floating-only ops (exp, log, gelu, ...) and returns true; false otherwise.
bool unary_floating(UnaryOp op, const Tensor& out, const Tensor& a);

}  // namespace kiln::cuda
