// CUDA kernels: matmul.
#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {

void CudaBackend::matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  throw NotImplementedError("cuda::matmul: not implemented yet");
}

}  // namespace kiln::cuda
