// CPU kernels: matmul.
#include "kiln/tensor/cpu/cpu_backend.h"

namespace kiln::cpu {

void CpuBackend::matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  throw NotImplementedError("cpu::matmul: not implemented yet");
}

}  // namespace kiln::cpu
