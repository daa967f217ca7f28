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

  // copy.cu
  void copy(const Tensor& dst, const Tensor& src, bool non_blocking) override;
  void fill(const Tensor& dst, Scalar value) override;
  void arange(const Tensor& dst, Scalar start, Scalar step) override;
  void linspace(const Tensor& dst, double start, double end) override;

  // elementwise.cu
  void unary(UnaryOp op, const Tensor& out, const Tensor& a, const UnaryParams& params) override;
  void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) override;
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override;
  void add_n(const Tensor& out, const std::vector<Tensor>& inputs) override;
  void mul_backward(const Tensor& ga, const Tensor& gb, const Tensor& g, const Tensor& a, const Tensor& b) override;

  // reduce.cu
  void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce,
              const ReduceParams& params) override;
  void arg_reduce(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) override;
  void softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) override;

  // matmul.cpp (cuBLASLt)
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) override;
  bool matmul_epilogue(const Tensor& out, const Tensor& a, const Tensor& b, const MatmulEpilogue& e) override;
  int64_t matmul_row_pitch(DType dtype, int64_t n) const override;

  // index.cu
  void index_select(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) override;
  void gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) override;
  void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) override;
  Tensor nonzero(const Tensor& a) override;

  // sort.cu
  void sort(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, bool descending,
            bool stable) override;
  void topk(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t k, int64_t dim, bool largest,
            bool sorted) override;

  // random.cu
  void random(const Tensor& out, const RandomParams& params, GeneratorState draw) override;
  void dropout(const Tensor& out, const Tensor& mask, const Tensor& x, double p, GeneratorState draw) override;
};

CudaBackend& cuda_backend();

// The current stream of the tensor's device as a cudaStream_t, with that device made current.
cudaStream_t stream_for(const Tensor& t);

}  // namespace kiln::cuda
