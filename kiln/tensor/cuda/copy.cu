// CUDA kernels: copy.
#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {

void CudaBackend::copy(const Tensor& dst, const Tensor& src, bool non_blocking) {
  throw NotImplementedError("cuda::copy: not implemented yet");
}

void CudaBackend::fill(const Tensor& dst, Scalar value) {
  throw NotImplementedError("cuda::fill: not implemented yet");
}

void CudaBackend::arange(const Tensor& dst, Scalar start, Scalar step) {
  throw NotImplementedError("cuda::arange: not implemented yet");
}

void CudaBackend::linspace(const Tensor& dst, double start, double end) {
  throw NotImplementedError("cuda::linspace: not implemented yet");
}

}  // namespace kiln::cuda
