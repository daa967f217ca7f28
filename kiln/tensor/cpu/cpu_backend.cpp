// The CPU backend instance and its allocator.
#include "kiln/tensor/cpu/cpu_backend.h"

namespace kiln::cpu {

Allocator& CpuBackend::allocator(int device_index) { return cpu_allocator(); }

CpuBackend& cpu_backend() {
  static CpuBackend instance;
  return instance;
}

}  // namespace kiln::cpu
