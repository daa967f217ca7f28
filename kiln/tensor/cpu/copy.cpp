// CPU kernels: copy.
#include "kiln/tensor/cpu/cpu_backend.h"

namespace kiln::cpu {

void CpuBackend::copy(const Tensor& dst, const Tensor& src, bool non_blocking) {
  throw NotImplementedError("cpu::copy: not implemented yet");
}

void CpuBackend::fill(const Tensor& dst, Scalar value) {
  throw NotImplementedError("cpu::fill: not implemented yet");
}

void CpuBackend::arange(const Tensor& dst, Scalar start, Scalar step) {
  throw NotImplementedError("cpu::arange: not implemented yet");
}

void CpuBackend::linspace(const Tensor& dst, double start, double end) {
  throw NotImplementedError("cpu::linspace: not implemented yet");
}

}  // namespace kiln::cpu
