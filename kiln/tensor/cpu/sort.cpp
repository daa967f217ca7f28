// CPU kernels: sort.
#include "kiln/tensor/cpu/cpu_backend.h"

namespace kiln::cpu {

void CpuBackend::sort(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, bool descending, bool stable) {
  throw NotImplementedError("cpu::sort: not implemented yet");
}

void CpuBackend::topk(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  throw NotImplementedError("cpu::topk: not implemented yet");
}

}  // namespace kiln::cpu
