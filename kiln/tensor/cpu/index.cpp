// CPU kernels: index.
#include "kiln/tensor/cpu/cpu_backend.h"

namespace kiln::cpu {

void CpuBackend::index_select(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  throw NotImplementedError("cpu::index_select: not implemented yet");
}

void CpuBackend::gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  throw NotImplementedError("cpu::gather: not implemented yet");
}

void CpuBackend::scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  throw NotImplementedError("cpu::scatter: not implemented yet");
}

Tensor CpuBackend::nonzero(const Tensor& a) {
  throw NotImplementedError("cpu::nonzero: not implemented yet");
}

}  // namespace kiln::cpu
