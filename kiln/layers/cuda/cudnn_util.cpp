// cuDNN handles, checks, workspaces and dtypes for the layers' GPU paths (cudnn_util.h).
#include "kiln/layers/cuda/cudnn_util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kiln/tensor/cuda.h"               // cuda::current_stream, cuda::memory_stats
#include "kiln/tensor/cuda/cuda_backend.h"  // cuda::stream_for
#include "kiln/tensor/cuda/cuda_check.h"    // KILN_CUDA_CHECK
#include "kiln/tensor/internal_ops.h"       // internal::empty

namespace kiln::nn::cuda_impl {

void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* op, const char* file, int line) {
  throw CudaError(::kiln::detail::str_cat(op, ": cuDNN error ", cudnnGetErrorString(status), " (status ",
                                          static_cast<int>(status), ") in ", call, " at ", file, ":", line));
}

namespace {

// One handle per device for this thread. cuDNN handles are not safe to share between threads that run
// at once; each thread creating its own is what cuDNN recommends. Destroyed when the thread ends.
struct ThreadHandles {
  std::vector<cudnnHandle_t> handles;
  ~ThreadHandles() {
    for (cudnnHandle_t h : handles) {
      if (h != nullptr) cudnnDestroy(h);  // at exit the driver may already be gone: nothing to report
    }
  }
};

}  // namespace

void* current_stream_of(const Tensor& t) { return cuda::stream_for(t); }

cudnnHandle_t cudnn_handle(const Tensor& t) {
  thread_local ThreadHandles local;
  cudaStream_t stream = cuda::stream_for(t);  // also makes t's device current
  const auto device = static_cast<size_t>(t.device().index());
  if (local.handles.size() <= device) local.handles.resize(device + 1, nullptr);
  cudnnHandle_t& h = local.handles[device];
  if (h == nullptr) KILN_CUDNN_CHECK(cudnnCreate(&h), "cudnn_handle");
  KILN_CUDNN_CHECK(cudnnSetStream(h, stream), "cudnn_handle");
  return h;
}

Tensor workspace(const Tensor& like, size_t bytes) {
  if (bytes == 0) return {};
  return internal::empty({static_cast<int64_t>(bytes)}, TensorOptions{.dtype = DType::UInt8, .device = like.device()});
}

size_t reachable_workspace_bytes(const Tensor& like, const char* op) {
  cuda::stream_for(like);  // makes like's device current
  size_t free_bytes = 0, total_bytes = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes), op);
  const cuda::MemoryStats stats = cuda::memory_stats(like.device().index());
  return free_bytes + static_cast<size_t>(std::max<int64_t>(0, stats.reserved_bytes - stats.allocated_bytes));
}

cudnnDataType_t cudnn_dtype(DType dtype, const char* op) {
  switch (dtype) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float64: return CUDNN_DATA_DOUBLE;
    case DType::Float16: return CUDNN_DATA_HALF;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    case DType::Int32: return CUDNN_DATA_INT32;
    case DType::Int64: return CUDNN_DATA_INT64;
    case DType::UInt8: return CUDNN_DATA_UINT8;
    default: break;
  }
  throw NotImplementedError(::kiln::detail::str_cat(op, ": cuDNN has no ", dtype, " type"));
}

}  // namespace kiln::nn::cuda_impl
