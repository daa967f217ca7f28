// kiln/layers/cuda/cudnn_util.h — what the layers' cuDNN paths share: checked calls, one cuDNN handle per
// thread and device bound to kiln's current stream, scratch workspaces from the caching allocator, dtypes
// (internal; included only by kiln/layers/cuda/*).
//
//   cudnnHandle_t h = cudnn_handle(x);                   // x's device made current, h on its current stream
//   Tensor ws = workspace(x, bytes);                      // from the caching allocator, freed stream-ordered
//   KILN_CUDNN_CHECK(cudnnConvolutionForward(h, ...), "conv2d");
#pragma once

#include <cudnn.h>  // cudnnHandle_t, cudnnStatus_t, cudnnDataType_t

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "kiln/tensor/error.h"   // kiln::CudaError
#include "kiln/tensor/tensor.h"  // Tensor

namespace kiln::nn::cuda_impl {

[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* op, const char* file, int line);

// The calling thread's cuDNN handle for t's device (created at first use), with that device made current
// and the handle set to the device's current kiln stream (cuda::current_stream).
cudnnHandle_t cudnn_handle(const Tensor& t);

// The current kiln stream of t's device (as cudaStream_t, type-erased to keep cuda_runtime.h out).
void* current_stream_of(const Tensor& t);

// A scratch buffer of at least `bytes` on like's device, from the caching allocator. Keep the tensor alive
// until the calls that use it are queued; the allocator reuses it only after them (same stream).
// Returns an undefined tensor when bytes == 0.
Tensor workspace(const Tensor& like, size_t bytes);
inline void* workspace_ptr(const Tensor& ws) { return ws.defined() ? ws.data_ptr() : nullptr; }

// The most workspace that could be had on like's device now: what the device has free plus what the caching
// allocator holds unused. Larger requests cannot succeed; asking for them would only make the allocator hand its
// cache back to the driver. The algorithm searches offer no candidate above it.
size_t reachable_workspace_bytes(const Tensor& like, const char* op);

// The alignment of an operand's address in bytes, up to 16 (some cuDNN kernels need 16-byte aligned operands, and a
// view may start anywhere): part of the algorithm caches' keys. A null pointer counts as aligned.
inline int64_t pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 16 : static_cast<int64_t>(std::min<uintptr_t>(16, a & (~a + 1)));
}

// Hash of a fixed-size array of integers: the algorithm and graph caches' keys.
struct ArrayHash {
  template <size_t N>
  size_t operator()(const std::array<int64_t, N>& k) const {
    size_t h = 0;
    for (int64_t v : k) h = h * 1000003u ^ std::hash<int64_t>{}(v);
    return h;
  }
};

// A cache key of the parts' numbers in order: join_key(std::array<int64_t, 2>{a, b}, dims) holds a, b, dims...
template <size_t... N>
std::array<int64_t, (N + ...)> join_key(const std::array<int64_t, N>&... parts) {
  std::array<int64_t, (N + ...)> key{};
  size_t at = 0;
  ((std::copy(parts.begin(), parts.end(), key.begin() + at), at += N), ...);
  return key;
}

// Float32, Float64, Float16, BFloat16 (and Int32, Int64, UInt8 for indices); anything else throws.
cudnnDataType_t cudnn_dtype(DType dtype, const char* op);

}  // namespace kiln::nn::cuda_impl

#define KILN_CUDNN_CHECK(call, op)                                                           \
  do {                                                                                       \
    const cudnnStatus_t kiln_status_ = (call);                                               \
    if (kiln_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                   \
      ::kiln::nn::cuda_impl::throw_cudnn_error(kiln_status_, #call, op, __FILE__, __LINE__); \
  } while (false)
