// Eigen GEMM for float and double (float16 and bfloat16 are converted to float by matmul.cpp).
#include "kiln/tensor/cpu/gemm_impl.h"

namespace kiln::cpu {
KILN_INSTANTIATE_GEMM(float)
KILN_INSTANTIATE_GEMM(double)
}  // namespace kiln::cpu
