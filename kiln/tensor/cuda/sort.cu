// CUDA kernels: sort.
#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {

void CudaBackend::sort(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, bool descending, bool stable) {
  throw NotImplementedError("cuda::sort: not implemented yet");
}

void CudaBackend::topk(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  throw NotImplementedError("cuda::topk: not implemented yet");
}

}  // namespace kiln::cuda
