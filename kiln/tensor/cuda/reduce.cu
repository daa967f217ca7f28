// CUDA kernels: reduce.
#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {

void CudaBackend::reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce, const ReduceParams& params) {
  throw NotImplementedError("cuda::reduce: not implemented yet");
}

void CudaBackend::arg_reduce(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) {
  throw NotImplementedError("cuda::arg_reduce: not implemented yet");
}

void CudaBackend::softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) {
  throw NotImplementedError("cuda::softmax: not implemented yet");
}

}  // namespace kiln::cuda
