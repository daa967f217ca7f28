// CUDA kernels: random.
#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {

void CudaBackend::random(const Tensor& out, const RandomParams& params, GeneratorState draw) {
  throw NotImplementedError("cuda::random: not implemented yet");
}

}  // namespace kiln::cuda
