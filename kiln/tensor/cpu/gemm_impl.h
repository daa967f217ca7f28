// kiln/tensor/cpu/gemm_impl.h — the Eigen body of gemm<T>, included only by gemm_*.cpp.
#pragma once

#include <Eigen/Core>  // Eigen::Map, Matrix, OuterStride and the GEMM kernels

#include "kiln/tensor/cpu/gemm.h"
#include "kiln/tensor/error.h"

namespace kiln::cpu::detail {

template <typename T, int Order>
using ConstMatrixMap =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <typename T>
using OutMatrixMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned,
                                Eigen::OuterStride<>>;

// Row-major when the columns are adjacent (or there is one column); column-major when the rows are.
template <typename T>
bool is_row_major(const MatrixRef<const T>& m) {
  if (m.col_stride == 1 || m.cols <= 1) return true;
  KILN_CHECK(m.row_stride == 1 || m.rows <= 1, "cpu::matmul: an operand has strides (", m.row_stride, ", ",
             m.col_stride, ") with no unit stride; the frontend must make it contiguous");
  return false;
}

template <typename T>
void gemm_eigen(const MatrixRef<const T>& a, const MatrixRef<const T>& b, const MatrixRef<T>& c, T alpha, T beta) {
  OutMatrixMap<T> cm(c.data, c.rows, c.cols, Eigen::OuterStride<>(c.row_stride));
  auto run = [&](const auto& am, const auto& bm) {
    if (beta == T(0)) {
      cm.noalias() = alpha * am * bm;
    } else {
      if (beta != T(1)) cm *= beta;
      cm.noalias() += alpha * am * bm;
    }
  };
  // A leading dimension only matters across rows (row-major) or columns (column-major); a single
  // row or column may carry any stride there, so give Eigen a valid one.
  auto row_major = [](const MatrixRef<const T>& m) {
    return ConstMatrixMap<T, Eigen::RowMajor>(m.data, m.rows, m.cols,
                                              Eigen::OuterStride<>(m.rows <= 1 ? m.cols : m.row_stride));
  };
  auto col_major = [](const MatrixRef<const T>& m) {
    return ConstMatrixMap<T, Eigen::ColMajor>(m.data, m.rows, m.cols,
                                              Eigen::OuterStride<>(m.cols <= 1 ? m.rows : m.col_stride));
  };
  const bool a_row = is_row_major(a), b_row = is_row_major(b);
  if (a_row && b_row) run(row_major(a), row_major(b));
  else if (a_row) run(row_major(a), col_major(b));
  else if (b_row) run(col_major(a), row_major(b));
  else run(col_major(a), col_major(b));
}

}  // namespace kiln::cpu::detail

namespace kiln::cpu {
template <typename T>
void gemm(const MatrixRef<const T>& a, const MatrixRef<const T>& b, const MatrixRef<T>& c, T alpha, T beta) {
  detail::gemm_eigen<T>(a, b, c, alpha, beta);
}
}  // namespace kiln::cpu

#define KILN_INSTANTIATE_GEMM(T)                                                                                  \
  template void gemm<T>(const MatrixRef<const T>& a, const MatrixRef<const T>& b, const MatrixRef<T>& c, T alpha, \
                        T beta);
