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

  // copy.cpp, elementwise.cpp, reduce.cpp, matmul.cpp, index.cpp, sort.cpp, random.cpp
  KILN_BACKEND_PRIMITIVES_OVERRIDE()
};

CpuBackend& cpu_backend();

// activation_backward.cpp: CpuBackend::binary's GeluErfBackward, GeluTanhBackward, SiluBackward and
// ReluBackward (out = g * f'(x)), on the same terms as the other binary ops.
void activation_backward(BinaryOp op, const Tensor& out, const Tensor& g, const Tensor& x);

}  // namespace kiln::cpu
