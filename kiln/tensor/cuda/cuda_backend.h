// kiln/tensor/cuda/cuda_backend.h — the CUDA backend (backend-internal).
// Each primitive of backend.h is defined in the file of its family; every kernel launches on the
// current stream of the tensor's device (cuda::current_stream), with that device current.
#pragma once

#include <cuda_runtime.h>  // cudaStream_t

#include "kiln/tensor/backend.h"

namespace kiln::cuda {

class CudaBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::CUDA; }
  int device_count() const override;                // device.cpp
  Allocator& allocator(int device_index) override;  // caching_allocator.cpp
  void synchronize(int device_index) override;      // device.cpp

  // copy.cu, elementwise.cu, reduce.cu, matmul.cpp (cuBLASLt), index.cu, sort.cu, random.cu
  KILN_BACKEND_PRIMITIVES_OVERRIDE()
  // matmul.cpp: cuBLASLt's epilogues and aligned rows
  bool matmul_epilogue(const Tensor& out, const Tensor& a, const Tensor& b, const MatmulEpilogue& e) override;
  int64_t matmul_row_pitch(DType dtype, int64_t n) const override;
};

CudaBackend& cuda_backend();

// The current stream of the tensor's device as a cudaStream_t, with that device made current.
cudaStream_t stream_for(const Tensor& t);

}  // namespace kiln::cuda
