// Eigen GEMM for the integer dtypes (wrapping arithmetic, as PyTorch's integer matmul).
#include <cstdint>

#include "kiln/tensor/cpu/gemm_impl.h"

namespace kiln::cpu {
KILN_INSTANTIATE_GEMM(int32_t)
KILN_INSTANTIATE_GEMM(int64_t)
KILN_INSTANTIATE_GEMM(uint8_t)
}  // namespace kiln::cpu
