// The caching device allocator: one per GPU, stream-aware, with small and large pools.
#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {

Allocator& CudaBackend::allocator(int device_index) {
  throw NotImplementedError("cuda::allocator: not implemented yet");
}

}  // namespace kiln::cuda
