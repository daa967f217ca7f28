// CPU kernels: random.
#include "kiln/tensor/cpu/cpu_backend.h"

namespace kiln::cpu {

void CpuBackend::random(const Tensor& out, const RandomParams& params, GeneratorState draw) {
  throw NotImplementedError("cpu::random: not implemented yet");
}

}  // namespace kiln::cpu
