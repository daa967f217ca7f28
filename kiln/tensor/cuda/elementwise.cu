// CUDA kernels: elementwise.
#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {

void CudaBackend::unary(UnaryOp op, const Tensor& out, const Tensor& a, const UnaryParams& params) {
  throw NotImplementedError("cuda::unary: not implemented yet");
}

void CudaBackend::binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  throw NotImplementedError("cuda::binary: not implemented yet");
}

void CudaBackend::where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  throw NotImplementedError("cuda::where: not implemented yet");
}

}  // namespace kiln::cuda
