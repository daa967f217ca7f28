// nn::layer_norm's fused GPU kernels against float64 references computed here on the host: 16-bit and
// float32 inputs, BERT's row size and a large one (the block loops), no affine parameters, many rows
// (the column-sum backward splits rows into chunks), non-contiguous input, and autocast (float32 out).
// float64 gradients against gradcheck run through check_gradients in test_functional.cpp's cases.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/layers/functional.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

struct Ref {
  std::vector<double> y, dx, dw, db;
};

// y = (x - mean) / sqrt(var + eps) * w + b per row of d; gradients for the output gradient g.
Ref layer_norm_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                   const std::vector<double>& g, int64_t rows, int64_t d, double eps) {
  Ref r{std::vector<double>(x.size()), std::vector<double>(x.size()), std::vector<double>(d, 0.0),
        std::vector<double>(d, 0.0)};
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = &x[i * d];
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += xr[j];
    mean /= static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= static_cast<double>(d);
    const double rstd = 1 / std::sqrt(var + eps);
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      r.y[i * d + j] = xhat * w[j] + b[j];
      const double gj = g[i * d + j] * w[j];
      mg += gj;
      mgx += gj * xhat;
      r.dw[j] += g[i * d + j] * xhat;
      r.db[j] += g[i * d + j];
    }
    mg /= static_cast<double>(d);
    mgx /= static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      r.dx[i * d + j] = rstd * (g[i * d + j] * w[j] - mg - xhat * mgx);
    }
  }
  return r;
}

class CudaLayerNorm : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  }
};

// Values rounded to `dtype` first, so the reference sees exactly what the kernel reads.
std::vector<double> rounded(const std::vector<double>& v, DType dtype) {
  return values(make(v, {static_cast<int64_t>(v.size())}, {.dtype = dtype}));
}

void check_case(DType dtype, int64_t rows, int64_t d, bool non_contiguous_input) {
  const TensorOptions o{.dtype = dtype, .device = Device::cuda(0)};
  const auto xv = rounded(uniform(rows * d, -2, 3, 1), dtype);
  const auto wv = rounded(uniform(d, 0.5, 1.5, 2), dtype);
  const auto bv = rounded(uniform(d, -0.5, 0.5, 3), dtype);
  const auto gv = rounded(uniform(rows * d, -1, 1, 4), dtype);
  Tensor x = make(xv, {rows, d}, o);
  if (non_contiguous_input) x = non_contiguous(x);
  x.requires_grad_();
  Tensor w = make(wv, {d}, o).requires_grad_(), b = make(bv, {d}, o).requires_grad_();
  Tensor y = nn::layer_norm(x, {d}, w, b, 1e-5);
  ASSERT_EQ(y.dtype(), dtype);
  y.backward(make(gv, {rows, d}, o));
  const Ref r = layer_norm_ref(xv, wv, bv, gv, rows, d, 1e-5);
  const bool half = dtype == DType::Float16 || dtype == DType::BFloat16;
  const double tol = half ? 2e-2 : 1e-4;
  expect_values(y, {rows, d}, r.y, tol, tol);
  expect_values(x.grad(), {rows, d}, r.dx, tol, tol);
  // Column sums over many rows: relative to their size.
  expect_values(w.grad(), {d}, r.dw, half ? 3e-2 : 1e-4, half ? 0.5 : 1e-3);
  expect_values(b.grad(), {d}, r.db, half ? 3e-2 : 1e-4, half ? 0.5 : 1e-3);
}

TEST_P(CudaLayerNorm, BertRows) { check_case(GetParam(), 64, 768, false); }
TEST_P(CudaLayerNorm, LongRowsNonContiguous) { check_case(GetParam(), 6, 5000, true); }
TEST_P(CudaLayerNorm, ManyShortRows) { check_case(GetParam(), 20000, 24, false); }

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaLayerNorm,
                         ::testing::Values(DType::Float32, DType::Float16, DType::BFloat16, DType::Float64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CudaLayerNormAutocast, RunsInFloat32WithoutAffine) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const auto xv = uniform(4 * 3 * 8, -1, 1, 5);
  Tensor x = make(xv, {4, 3, 8}, {.dtype = DType::BFloat16, .device = Device::cuda(0)});
  Tensor y;
  {
    autocast::Guard guard(DeviceType::CUDA, DType::BFloat16);
    y = nn::layer_norm(x, {3, 8});
  }
  EXPECT_EQ(y.dtype(), DType::Float32);  // layer norm runs in float32 under autocast, as in PyTorch
  const auto xr = values(x);
  const std::vector<double> ones(24, 1.0), zeros(24, 0.0), g(xr.size(), 0.0);
  expect_values(y, {4, 3, 8}, layer_norm_ref(xr, ones, zeros, g, 4, 24, 1e-5).y, 1e-5, 1e-5);
}

}  // namespace
}  // namespace kiln::testing
