// kiln/tensor/cpu/gemm.h — one strided matrix product on the CPU (backend-internal).
//
//   gemm<float>(a, b, c, alpha, beta);   // c = alpha * a @ b + beta * c, a (M, K), b (K, N), c (M, N)
//
// The Eigen instantiations live in gemm_float.cpp and gemm_int.cpp (one translation unit per dtype
// group, because Eigen's GEMM kernels are slow to compile); matmul.cpp splits batches and row blocks
// over the thread pool and calls this once per block.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// A matrix in memory, strides in elements. Either row_stride or col_stride is 1 (or the matrix has
// one row or one column), which lets Eigen read it as a row- or column-major block with a leading
// dimension.
template <typename T>
struct MatrixRef {
  T* data;
  int64_t rows, cols;
  int64_t row_stride, col_stride;
};

// c = alpha * a @ b + beta * c; c is row-major with any leading dimension (c.col_stride == 1).
// beta == 0 overwrites c without reading it (NaN in c is ignored).
// Defined for float, double, int32_t, int64_t and uint8_t.
template <typename T>
void gemm(const MatrixRef<const T>& a, const MatrixRef<const T>& b, const MatrixRef<T>& c, T alpha, T beta);

}  // namespace kiln::cpu
