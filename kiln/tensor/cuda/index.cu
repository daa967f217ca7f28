// CUDA kernels: index.
#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {

void CudaBackend::index_select(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  throw NotImplementedError("cuda::index_select: not implemented yet");
}

void CudaBackend::gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  throw NotImplementedError("cuda::gather: not implemented yet");
}

void CudaBackend::scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  throw NotImplementedError("cuda::scatter: not implemented yet");
}

Tensor CudaBackend::nonzero(const Tensor& a) {
  throw NotImplementedError("cuda::nonzero: not implemented yet");
}

}  // namespace kiln::cuda
