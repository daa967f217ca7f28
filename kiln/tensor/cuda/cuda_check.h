// kiln/tensor/cuda/cuda_check.h — checking every CUDA runtime and cuBLAS call (backend-internal).
//
//   KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream), "copy_");
//   my_kernel<<<grid, block, 0, stream>>>(...);  KILN_CUDA_CHECK_LAUNCH("add");
//
// A failure throws kiln::CudaError naming kiln's op, the CUDA call and CUDA's own message.
#pragma once

#include <cublasLt.h>      // cublasStatus_t
#include <cublas_v2.h>     // cublasGetStatusString
#include <cuda_runtime.h>  // cudaError_t, cudaGetErrorString

#include "kiln/tensor/error.h"

namespace kiln::cuda::detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* op, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* op, const char* file,
                                     int line);

}  // namespace kiln::cuda::detail

#define KILN_CUDA_CHECK(call, op)                                                       \
  do {                                                                                  \
    const cudaError_t kiln_err_ = (call);                                               \
    if (kiln_err_ != cudaSuccess) [[unlikely]]                                          \
      ::kiln::cuda::detail::throw_cuda_error(kiln_err_, #call, op, __FILE__, __LINE__); \
  } while (false)

// After a kernel launch: catches bad launch configurations (asynchronous faults surface at the next
// synchronising call, which is checked too).
#define KILN_CUDA_CHECK_LAUNCH(op) KILN_CUDA_CHECK(cudaGetLastError(), op)

#define KILN_CUBLAS_CHECK(call, op)                                                          \
  do {                                                                                       \
    const cublasStatus_t kiln_status_ = (call);                                              \
    if (kiln_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                  \
      ::kiln::cuda::detail::throw_cublas_error(kiln_status_, #call, op, __FILE__, __LINE__); \
  } while (false)
