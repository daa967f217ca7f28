// nn::utils::clip_grad_norm_ / clip_grad_value_: the total norm against a float64 reference (p = 2, 1, 3 and
// inf), scaling only above max_norm, error_if_nonfinite, clipping by value, and CUDA (fused) against the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kiln/optim/clip_grad.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class ClipGradTest : public BackendTest {
 protected:
  // Three parameters with gradients set directly (one float16, one non-contiguous) and one without a gradient.
  void SetUp() override {
    ps = {make(uniform(10, -1, 1, 51), {10}, opts()).requires_grad_(),
          make(uniform(12, -1, 1, 52), {3, 4}, opts()).requires_grad_(),
          make(uniform(6, -1, 1, 53), {6}, opts(DType::Float16)).requires_grad_(),
          make(uniform(3, -1, 1, 54), {3}, opts()).requires_grad_()};
    ps[0].mutable_grad() = make(uniform(10, -3, 3, 61), {10}, opts());
    ps[1].mutable_grad() = make(uniform(12, -2, 2, 62), {4, 3}, opts()).transpose(0, 1);  // non-contiguous
    ps[2].mutable_grad() = make(uniform(6, -4, 4, 63), {6}, opts(DType::Float16));
    grads.clear();
    for (int i = 0; i < 3; ++i) grads.push_back(values(ps[i].grad()));
  }
  // The float64 reference norm of all gradients as one vector.
  double reference_norm(double p) const {
    double acc = 0;
    for (const auto& g : grads) {
      for (double x : g) acc = std::isinf(p) ? std::max(acc, std::abs(x)) : acc + std::pow(std::abs(x), p);
    }
    return std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
  }

  std::vector<Tensor> ps;
  std::vector<std::vector<double>> grads;  // the gradients' values before clipping
};

TEST_P(ClipGradTest, TotalNormMatchesFloat64AndClipsAboveMaxNorm) {
  for (double p : {2.0, 1.0, 3.0, double{INFINITY}}) {
    SCOPED_TRACE("norm_type " + std::to_string(p));
    SetUp();
    const double ref = reference_norm(p);
    const double max_norm = ref / 2;
    Tensor total = nn::utils::clip_grad_norm_(ps, max_norm, p);
    EXPECT_EQ(total.dim(), 0);
    EXPECT_EQ(total.dtype(), DType::Float32);
    EXPECT_EQ(total.device(), dev());
    expect_values(total, {}, {ref}, 1e-5, 1e-6);
    const double coef = max_norm / (ref + 1e-6);
    for (int i = 0; i < 3; ++i) {
      std::vector<double> expected = grads[i];
      for (double& x : expected) x *= coef;
      const double tol = i == 2 ? 2e-3 : 1e-5;  // float16 gradient
      expect_values(ps[i].grad(), ps[i].shape(), expected, tol, tol);
    }
    EXPECT_FALSE(ps[3].grad().defined());
    // After clipping, the norm is max_norm (up to the 1e-6 and rounding).
    grads.clear();
    for (int i = 0; i < 3; ++i) grads.push_back(values(ps[i].grad()));
    EXPECT_NEAR(reference_norm(p), max_norm, 2e-3 * max_norm);
  }
}

TEST_P(ClipGradTest, BelowMaxNormLeavesGradientsUnchanged) {
  const double ref = reference_norm(2);
  Tensor total = optim::clip_grad_norm_(ps, ref * 1.5);  // the optim:: name; nn::utils:: is PyTorch's for it
  expect_values(total, {}, {ref}, 1e-5, 1e-6);
  for (int i = 0; i < 3; ++i) expect_values(ps[i].grad(), ps[i].shape(), grads[i], 0, 0);  // exactly
}

TEST_P(ClipGradTest, NonFiniteNorm) {
  Tensor g = ps[0].grad();
  g.select(0, 3).fill_(NAN);
  expect_error([&] { nn::utils::clip_grad_norm_(ps, 1.0, 2.0, true); },
               {"clip_grad_norm_", "nan", "error_if_nonfinite"});
  for (int i = 1; i < 3; ++i) expect_values(ps[i].grad(), ps[i].shape(), grads[i], 0, 0);  // nothing changed
  Tensor total = nn::utils::clip_grad_norm_(ps, 1.0);  // as PyTorch: the gradients become NaN
  EXPECT_TRUE(std::isnan(values(total)[0]));
  EXPECT_TRUE(std::isnan(values(ps[1].grad())[0]));
}

TEST_P(ClipGradTest, Float64GradientsGiveAFloat64Norm) {
  Tensor p = make({0, 0}, {2}, opts(DType::Float64)).requires_grad_();
  p.mutable_grad() = make({3, 4}, {2}, opts(DType::Float64));
  Tensor total = nn::utils::clip_grad_norm_({p}, 1.0);
  EXPECT_EQ(total.dtype(), DType::Float64);
  expect_values(total, {}, {5.0}, 1e-12, 0);
  expect_values(p.grad(), {2}, {3 / (5 + 1e-6), 4 / (5 + 1e-6)}, 1e-12, 0);
}

TEST_P(ClipGradTest, NoGradientsGiveZero) {
  Tensor p = make({1}, {1}, opts()).requires_grad_();
  expect_values(nn::utils::clip_grad_norm_({p}, 1.0), {}, {0.0}, 0, 0);
  expect_error([&] { nn::utils::clip_grad_norm_({p}, 1.0, -1); }, {"clip_grad_norm_", "norm_type"});
}

TEST_P(ClipGradTest, ClipByValue) {
  nn::utils::clip_grad_value_(ps, 0.75);
  for (int i = 0; i < 3; ++i) {
    std::vector<double> expected = grads[i];
    for (double& x : expected) x = std::clamp(x, -0.75, 0.75);
    expect_values(ps[i].grad(), ps[i].shape(), expected, i == 2 ? 1e-3 : 0, i == 2 ? 1e-3 : 0);
  }
  EXPECT_FALSE(ps[3].grad().defined());
  expect_error([&] { nn::utils::clip_grad_value_(ps, -1); }, {"clip_grad_value_", "clip_value"});
}

KILN_INSTANTIATE_BACKENDS(ClipGradTest);

class CudaClipGrad : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

// Many tensors of mixed sizes and dtypes (fused lists of several chunks) on CUDA against the CPU.
TEST_F(CudaClipGrad, MatchesTheCpu) {
  for (double p : {2.0, double{INFINITY}, 1.0}) {
    SCOPED_TRACE("norm_type " + std::to_string(p));
    std::vector<Tensor> cpu, gpu;
    const int64_t sizes[] = {1, 7, 1000, 65537, 3, 200000, 129};
    for (int i = 0; i < 7; ++i) {
      const DType dt = i % 3 == 2 ? DType::BFloat16 : DType::Float32;
      Tensor g = make(uniform(sizes[i], -1, 1, 70 + i), {sizes[i]}, {.dtype = dt});
      cpu.push_back(zeros({sizes[i]}, {.dtype = dt}).requires_grad_());
      cpu.back().mutable_grad() = g;
      gpu.push_back(zeros({sizes[i]}, {.dtype = dt, .device = Device::cuda(0)}).requires_grad_());
      gpu.back().mutable_grad() = g.to(Device::cuda(0));
    }
    const Tensor total_cpu = nn::utils::clip_grad_norm_(cpu, 10.0, p);
    const Tensor total_gpu = nn::utils::clip_grad_norm_(gpu, 10.0, p);
    EXPECT_TRUE(total_gpu.is_cuda());
    expect_values(total_gpu, {}, values(total_cpu), 1e-4, 1e-6);  // float32 sums of 266k terms, other orders
    for (int i = 0; i < 7; ++i) {
      const double tol = cpu[i].dtype() == DType::BFloat16 ? 1e-2 : 1e-4;
      expect_values(gpu[i].grad(), {sizes[i]}, values(cpu[i].grad()), tol, tol);
    }
  }
}

}  // namespace
}  // namespace kiln::testing
