// kiln/tensor/cpu/cpu_backend.h — the CPU backend: Eigen kernels spread over the thread pool.
// Each primitive of backend.h is defined in the file of its family (copy.cpp, elementwise.cpp, ...).
#pragma once

#include "kiln/tensor/backend.h"

namespace kiln::cpu {

class CpuBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::CPU; }
  int device_count() const override { return 1; }
  Allocator& allocator(int device_index) override;
  void synchronize(int device_index) override {}

  // copy.cpp
  void copy(const Tensor& dst, const Tensor& src, bool non_blocking) override;
  void fill(const Tensor& dst, Scalar value) override;
  void arange(const Tensor& dst, Scalar start, Scalar step) override;
  void linspace(const Tensor& dst, double start, double end) override;

  // elementwise.cpp
  void unary(UnaryOp op, const Tensor& out, const Tensor& a, const UnaryParams& params) override;
  void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) override;
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override;
  void add_n(const Tensor& out, const std::vector<Tensor>& inputs) override;
  void mul_backward(const Tensor& ga, const Tensor& gb, const Tensor& g, const Tensor& a, const Tensor& b) override;

  // reduce.cpp
  void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce,
              const ReduceParams& params) override;
  void arg_reduce(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) override;
  void softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) override;

  // matmul.cpp
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) override;

  // index.cpp
  void index_select(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) override;
  void gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) override;
  void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) override;
  Tensor nonzero(const Tensor& a) override;

  // sort.cpp
  void sort(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, bool descending,
            bool stable) override;
  void topk(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t k, int64_t dim, bool largest,
            bool sorted) override;

  // random.cpp
  void random(const Tensor& out, const RandomParams& params, GeneratorState draw) override;
  void dropout(const Tensor& out, const Tensor& mask, const Tensor& x, double p, GeneratorState draw) override;
};

CpuBackend& cpu_backend();

// activation_backward.cpp: CpuBackend::binary's GeluErfBackward, GeluTanhBackward, SiluBackward and
// ReluBackward (out = g * f'(x)), on the same terms as the other binary ops.
void activation_backward(BinaryOp op, const Tensor& out, const Tensor& g, const Tensor& x);

}  // namespace kiln::cpu
