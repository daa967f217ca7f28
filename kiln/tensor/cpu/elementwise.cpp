// CPU kernels: elementwise.
#include "kiln/tensor/cpu/cpu_backend.h"

namespace kiln::cpu {

void CpuBackend::unary(UnaryOp op, const Tensor& out, const Tensor& a, const UnaryParams& params) {
  throw NotImplementedError("cpu::unary: not implemented yet");
}

void CpuBackend::binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  throw NotImplementedError("cpu::binary: not implemented yet");
}

void CpuBackend::where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  throw NotImplementedError("cpu::where: not implemented yet");
}

}  // namespace kiln::cpu
