// The caching device allocator: one per GPU, stream-aware, with small and large pools.
#include "kiln/tensor/cuda/caching_allocator.h"

#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {
namespace detail {
void allocator_record_stream(int, void*, cudaStream_t) {}
}  // namespace detail

Allocator& CudaBackend::allocator(int device_index) {
  throw NotImplementedError("cuda::allocator: not implemented yet");
}

}  // namespace kiln::cuda
