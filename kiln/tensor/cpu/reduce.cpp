// CPU kernels: reduce.
#include "kiln/tensor/cpu/cpu_backend.h"

namespace kiln::cpu {

void CpuBackend::reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce) {
  throw NotImplementedError("cpu::reduce: not implemented yet");
}

void CpuBackend::arg_reduce(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) {
  throw NotImplementedError("cpu::arg_reduce: not implemented yet");
}

void CpuBackend::softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) {
  throw NotImplementedError("cpu::softmax: not implemented yet");
}

}  // namespace kiln::cpu
