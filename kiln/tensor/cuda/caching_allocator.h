// kiln/tensor/cuda/caching_allocator.h — what the rest of the CUDA backend needs from the device caching
// allocator (backend-internal).
#pragma once

#include <cuda_runtime.h>

namespace kiln::cuda::detail {

// Marks the allocation that starts at `ptr` on `device` as used by `stream` too (see cuda::record_stream).
// Memory that the caching allocator did not hand out (or already freed) is ignored.
void allocator_record_stream(int device, void* ptr, cudaStream_t stream);

}  // namespace kiln::cuda::detail
