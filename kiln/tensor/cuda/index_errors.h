// kiln/tensor/cuda/index_errors.h — out-of-range indices found by CUDA kernels, reported without stalling the
// host (backend-internal).
//
// A kernel cannot throw, and reading a flag back after every gather or scatter would make the host wait for
// the GPU in the middle of each training step (embeddings, cross-entropy). Instead each device has one error
// slot in mapped pinned host memory: the first kernel that meets a bad index writes the launch's sequence
// number, the index and the dim's size there, and the host throws the error — with the op's name and dim from
// the launch's record — at the next point where it looks:
//   - the next gather/index_select/scatter launch on that device (a read of host memory, no synchronisation);
//   - every synchronisation: Stream::synchronize, Event::synchronize, cuda::synchronize, copies to the host
//     (so .cpu(), item() and to_vector() report it).
// KILN_CUDA_SYNC_INDEX_CHECKS=1 makes every index op wait for its kernel and throw itself (to find the call).
// Kernels skip bad indices, so nothing is written outside a tensor either way. Launches captured in a CUDA
// graph write the same slot on every replay.
#pragma once

#include <cstdint>

namespace kiln::cuda::detail {

struct IndexErrorSlot {
  unsigned long long seq;  // the failing launch's sequence number; 0 while there is no error
  long long value;         // the bad index
  long long size;          // the size of the indexed dim
  unsigned int done;       // 1 once value and size are written
};

// What one kernel launch needs to report a bad index.
struct IndexReport {
  IndexErrorSlot* slot;
  unsigned long long seq;
  long long size;
};

#ifdef __CUDACC__
// Records the first bad index of any launch (later ones are dropped until the host has reported it).
__device__ __forceinline__ void report_bad_index(const IndexReport& r, int64_t v) {
  if (atomicCAS(&r.slot->seq, 0ull, r.seq) == 0ull) {
    r.slot->value = v;
    r.slot->size = r.size;
    __threadfence_system();
    atomicExch(&r.slot->done, 1u);
  }
}
#endif

// Throws a pending error of `device` (first) and returns the report for a new launch of `op` along `dim`, whose
// indices must lie in [0, size).
IndexReport begin_index_launch(int device, const char* op, int64_t dim, int64_t size);

// After the launch (on `stream`): with KILN_CUDA_SYNC_INDEX_CHECKS=1 waits for it and throws its error.
void end_index_launch(int device, void* stream);

// Throws (once) the error a kernel of `device` reported, if any; device < 0: every device with a slot.
void throw_index_error(int device = -1);

}  // namespace kiln::cuda::detail
