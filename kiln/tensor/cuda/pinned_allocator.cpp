// The caching allocator of page-locked host memory.
#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {

Allocator& pinned_allocator() { throw NotImplementedError("cuda::pinned_allocator: not implemented yet"); }

}  // namespace kiln::cuda
