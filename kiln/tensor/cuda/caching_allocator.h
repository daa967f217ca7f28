// kiln/tensor/cuda/caching_allocator.h — what the rest of the CUDA backend needs from the device caching
// allocator (backend-internal).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda::detail {

// Marks the allocation that starts at `ptr` on `device` as used by `stream` too (see cuda::record_stream).
// Memory that the caching allocator did not hand out (or already freed) is ignored.
void allocator_record_stream(int device, void* ptr, cudaStream_t stream);

// CUDA graphs (cuda::Graph): allocations on `stream` come from a new private pool until allocator_end_capture;
// the pool's memory is kept for the graph's replays until allocator_release_pool (after the last replay).
uint64_t allocator_begin_capture(int device, cudaStream_t stream);
void allocator_end_capture(int device, cudaStream_t stream);
void allocator_release_pool(int device, uint64_t pool);

// While one lives on this thread, allocations on a stream being captured come from the graph's pool of replay
// inputs, memory that no other allocation of the capture gets (cuda::Graph::replay_input); allocations on a
// stream that is not being captured throw.
class ReplayInputAllocation {
 public:
  ReplayInputAllocation();
  ~ReplayInputAllocation();
  ReplayInputAllocation(const ReplayInputAllocation&) = delete;
  ReplayInputAllocation& operator=(const ReplayInputAllocation&) = delete;
};

}  // namespace kiln::cuda::detail
