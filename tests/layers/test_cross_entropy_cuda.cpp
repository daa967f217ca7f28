// nn::cross_entropy's fused CUDA path (kiln/layers/cuda/cross_entropy.*) against the CPU composed path in
// float64: loss and logits gradient for every reduction, class weights, ignore_index, label smoothing,
// (N, C, d...) inputs, small and large C, 16-bit logits (with and without autocast), strided and padded logits, and
// no cudaMalloc in steady state. Skipped where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/autograd/autocast.h"
#include "kiln/layers/loss.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using nn::CrossEntropyOptions;
using nn::Reduction;

class CudaCrossEntropy : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  }
  static Device gpu() { return Device::cuda(0); }
};

const char* reduction_name(Reduction r) { return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean"; }

// Class indices for `shape` in [0, c), every `ignore_every`-th one (when > 0) set to ignore_index.
Tensor class_targets(const Shape& shape, int64_t c, int64_t ignore_every, int64_t ignore_index, uint64_t seed) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  const std::vector<double> u = uniform(n, 0, static_cast<double>(c), seed);
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    t[i] = std::min<int64_t>(static_cast<int64_t>(u[i]), c - 1);
    if (ignore_every > 0 && i % ignore_every == ignore_every - 1) t[i] = ignore_index;
  }
  return from_vector<int64_t>(t, shape);
}

struct Result {
  Tensor loss, grad;
};

// The loss and the gradient of `logits` (a leaf made from it, keeping its strides). With Reduction::None
// the upstream gradient is a fixed non-uniform vector, so per-row gradients are checked too.
Result run(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  Tensor x = logits.detach();
  x.requires_grad_();
  Tensor loss = nn::cross_entropy(x, target, options);
  if (options.reduction == Reduction::None) {
    const std::vector<double> g = uniform(loss.numel(), 0.5, 2.0, 7);
    loss.backward(make(g, loss.shape(), {.dtype = loss.dtype(), .device = loss.device()}));
  } else {
    loss.backward();
  }
  return {loss.detach(), x.grad()};
}

// Moves target and weight to the GPU, runs both paths, compares. `gpu_logits` may be any dtype or layout;
// the reference sees its values in float64 on the CPU.
void compare(const Tensor& gpu_logits, const Tensor& target, CrossEntropyOptions options, double rtol, double atol,
             DType expected_loss_dtype) {
  const Tensor cpu_logits = make(values(gpu_logits), gpu_logits.shape(), {.dtype = DType::Float64});
  const Result ref = run(cpu_logits, target, options);
  if (options.weight.defined()) options.weight = options.weight.to(gpu_logits.device());
  const Result got = run(gpu_logits, target.to(gpu_logits.device()), options);
  ASSERT_TRUE(got.grad.defined());
  EXPECT_TRUE(got.loss.is_cuda());
  EXPECT_EQ(got.loss.dtype(), expected_loss_dtype);
  EXPECT_EQ(got.grad.dtype(), gpu_logits.dtype());
  EXPECT_EQ(got.grad.shape(), gpu_logits.shape());
  expect_values(got.loss, ref.loss.shape(), values(ref.loss), rtol, atol);
  expect_values(got.grad, ref.grad.shape(), values(ref.grad), rtol, atol);
}

void compare(const Tensor& gpu_logits, const Tensor& target, const CrossEntropyOptions& options, double rtol,
             double atol) {
  compare(gpu_logits, target, options, rtol, atol, gpu_logits.dtype());
}

Tensor gpu_logits(const Shape& shape, DType dtype, uint64_t seed, double scale = 3) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return make(uniform(n, -scale, scale, seed), shape, {.dtype = dtype, .device = Device::cuda(0)});
}

Tensor class_weight(int64_t c) { return make(uniform(c, 0.2, 2.0, 11), {c}, {.dtype = DType::Float32}); }

TEST_F(CudaCrossEntropy, TakesTheFusedPath) {
  Tensor x = gpu_logits({4, 5}, DType::Float32, 1);
  x.requires_grad_();
  Tensor loss = nn::cross_entropy(x, class_targets({4}, 5, 0, -100, 2).to(gpu()));
  ASSERT_NE(loss.grad_fn(), nullptr);
  EXPECT_NE(std::string(loss.grad_fn()->name()).find("CrossEntropyFunction"), std::string::npos)
      << loss.grad_fn()->name();
}

// Every reduction, with and without weights, ignored rows and label smoothing; C across the warp-per-row
// (3, 11, 1000) and block-per-row (2051) kernels, in float64 (tight) and float32.
TEST_F(CudaCrossEntropy, MatchesComposedPathInFloat64AndFloat32) {
  for (int64_t c : {3, 11, 1000, 2051}) {
    for (DType dtype : {DType::Float64, DType::Float32}) {
      const int64_t n = c <= 11 ? 37 : 9;  // 37 rows: the last block of 8 warps is partly empty
      const Tensor x = gpu_logits({n, c}, dtype, static_cast<uint64_t>(c));
      const double rtol = dtype == DType::Float64 ? 1e-10 : 1e-4, atol = dtype == DType::Float64 ? 1e-12 : 1e-6;
      for (Reduction red : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
        for (bool weighted : {false, true}) {
          for (double s : {0.0, 0.1}) {
            for (int64_t ignore_every : {0, 4}) {
              SCOPED_TRACE("C=" + std::to_string(c) + " " + std::string(dtype_name(dtype)) + " " + reduction_name(red) +
                           (weighted ? " weighted" : "") + " smoothing=" + std::to_string(s) +
                           " ignore_every=" + std::to_string(ignore_every));
              CrossEntropyOptions o{.ignore_index = -100, .reduction = red, .label_smoothing = s};
              if (weighted) o.weight = class_weight(c);
              compare(x, class_targets({n}, c, ignore_every, -100, 5), o, rtol, atol);
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaCrossEntropy, IgnoreIndexInsideTheClassRange) {
  const Tensor x = gpu_logits({20, 6}, DType::Float64, 3);
  for (Reduction red : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
    SCOPED_TRACE(reduction_name(red));
    // Class 2 ignored: its targets count nowhere, other classes' targets as usual.
    compare(x, class_targets({20}, 6, 0, 0, 9),
            {.weight = class_weight(6), .ignore_index = 2, .reduction = red, .label_smoothing = 0.2}, 1e-10, 1e-12);
  }
}

// PyTorch: every target ignored makes Mean 0/0 = NaN (the composed path agrees) and Sum 0. The fused
// gradient is 0 on ignored rows, as PyTorch's nll_loss backward; the composed path's Mean gradient is NaN
// there (inf / 0 times a zero weight), so only the loss is compared with it.
TEST_F(CudaCrossEntropy, AllRowsIgnored) {
  const Tensor x = gpu_logits({5, 4}, DType::Float32, 4);
  const Tensor t = full({5}, -100, {.dtype = DType::Int64});
  const Tensor cpu_x = make(values(x), x.shape(), {.dtype = DType::Float64});
  for (double s : {0.0, 0.3}) {
    const Result mean = run(x, t.to(gpu()), {.label_smoothing = s});
    expect_values(mean.loss, {}, {kNaN});
    expect_values(nn::cross_entropy(cpu_x, t, {.label_smoothing = s}), {}, {kNaN});
    expect_values(mean.grad, {5, 4}, std::vector<double>(20, 0.0));
    const Result sum = run(x, t.to(gpu()), {.reduction = Reduction::Sum, .label_smoothing = s});
    expect_values(sum.loss, {}, {0.0});
    expect_values(sum.grad, {5, 4}, std::vector<double>(20, 0.0));
  }
}

// (N, C, d1, d2): the class dim is strided; the fused path sees (N, d1, d2, C) rows.
TEST_F(CudaCrossEntropy, SpatialInputs) {
  const Tensor x = gpu_logits({3, 5, 4, 2}, DType::Float64, 6);
  const Tensor t = class_targets({3, 4, 2}, 5, 5, -1, 8);
  for (Reduction red : {Reduction::None, Reduction::Sum, Reduction::Mean}) {
    for (bool weighted : {false, true}) {
      SCOPED_TRACE(std::string(reduction_name(red)) + (weighted ? " weighted" : ""));
      CrossEntropyOptions o{.ignore_index = -1, .reduction = red, .label_smoothing = 0.15};
      if (weighted) o.weight = class_weight(5);
      compare(x, t, o, 1e-10, 1e-12);
    }
  }
  // (N, C, d) in float32, Int32 targets.
  compare(gpu_logits({4, 7, 9}, DType::Float32, 12), class_targets({4, 9}, 7, 3, -100, 13).to(DType::Int32),
          {.reduction = Reduction::None}, 1e-4, 1e-6);
}

// BERT's vocabulary: 30522 classes (not a multiple of any vector width: unaligned rows after the first).
TEST_F(CudaCrossEntropy, LargeVocabulary) {
  const int64_t c = 30522, n = 6;
  for (DType dtype : {DType::Float64, DType::Float32}) {
    const Tensor x = gpu_logits({n, c}, dtype, 14, 8);
    const double rtol = dtype == DType::Float64 ? 1e-10 : 1e-4, atol = dtype == DType::Float64 ? 1e-13 : 1e-8;
    for (Reduction red : {Reduction::None, Reduction::Mean}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + reduction_name(red));
      compare(x, class_targets({n}, c, 4, -100, 15), {.reduction = red}, rtol, atol);
      compare(x, class_targets({n}, c, 0, -100, 16),
              {.weight = class_weight(c), .reduction = red, .label_smoothing = 0.1}, rtol, atol);
    }
  }
}

// 16-bit logits: computed in float32 from the stored values; loss and gradient in the logits' dtype.
TEST_F(CudaCrossEntropy, HalfLogits) {
  for (DType dtype : {DType::Float16, DType::BFloat16}) {
    const double rtol = dtype == DType::Float16 ? 2e-3 : 1e-2;
    for (int64_t c : {10, 1500}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " C=" + std::to_string(c));
      const Tensor x = gpu_logits({16, c}, dtype, 17);
      const Tensor t = class_targets({16}, c, 5, -100, 18);
      compare(x, t, {.reduction = Reduction::None}, rtol, 1e-4);
      compare(x, t, {.weight = class_weight(c), .label_smoothing = 0.1}, rtol, 1e-4);
    }
  }
}

// Under autocast nn::autocast_ops::cross_entropy() runs in float32: 16-bit logits are read in place, the loss is
// float32, the gradient keeps the logits' dtype.
TEST_F(CudaCrossEntropy, Autocast) {
  for (DType dtype : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    autocast::Guard cast(DeviceType::CUDA, dtype);
    const Tensor x = gpu_logits({12, 300}, dtype, 19);
    const Tensor t = class_targets({12}, 300, 5, -100, 20);
    const double rtol = dtype == DType::Float16 ? 2e-3 : 1e-2;  // the gradient is rounded to the logits' dtype
    compare(x, t, {.label_smoothing = 0.1}, rtol, 1e-5, DType::Float32);
    // float32 logits stay float32.
    compare(gpu_logits({12, 300}, DType::Float32, 21), t, {}, 1e-4, 1e-6, DType::Float32);
  }
}

// Strided logits: a transposed (C, N) buffer (classes strided), and rows of a wider buffer (row stride != C,
// rows starting off 16-byte boundaries).
TEST_F(CudaCrossEntropy, NonContiguousLogits) {
  const Tensor t = class_targets({13}, 70, 4, -100, 22);
  for (DType dtype : {DType::Float32, DType::Float16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const double rtol = dtype == DType::Float32 ? 1e-4 : 2e-3;
    const Tensor transposed = gpu_logits({70, 13}, dtype, 23).transpose(0, 1);  // (13, 70), strides (1, 13)
    ASSERT_FALSE(transposed.is_contiguous());
    const Tensor sliced = gpu_logits({13, 73}, dtype, 24).narrow(1, 1, 70);  // strides (73, 1), offset 1
    for (Reduction red : {Reduction::None, Reduction::Mean}) {
      compare(transposed, t, {.reduction = red, .label_smoothing = 0.1}, rtol, 1e-5);
      compare(sliced, t, {.reduction = red, .label_smoothing = 0.1}, rtol, 1e-5);
    }
  }
  compare(non_contiguous(gpu_logits({9, 2000}, DType::Float64, 25)), class_targets({9}, 2000, 3, -100, 26),
          {.weight = class_weight(2000), .label_smoothing = 0.05}, 1e-10, 1e-13);
}

// Logits whose rows are padded to a 16-byte pitch, as a product's output is (1001 bfloat16 classes in rows of
// 1008): loss and gradient as for any strided logits, ignored rows included, and the gradient gets the same
// padded rows (the products of backward read it next).
TEST_F(CudaCrossEntropy, PaddedRowsGiveAPaddedGradient) {
  const int64_t n = 24, c = 1001, pitch = 1008;
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Tensor x = gpu_logits({n, pitch}, dtype, 31).narrow(1, 0, c);
    ASSERT_EQ(x.stride(0), pitch);
    const Tensor t = class_targets({n}, c, 3, -100, 32);
    const double rtol = dtype == DType::Float16 ? 2e-3 : 1e-2;
    compare(x, t, {.reduction = Reduction::None}, rtol, 1e-5);
    compare(x, t, {.label_smoothing = 0.1}, rtol, 1e-5);
    // The gradient as it leaves cross-entropy (a leaf's .grad is made dense when it is kept, so look before).
    Tensor leaf = x.detach();
    leaf.requires_grad_();
    Tensor seen;
    leaf.register_hook([&seen](const Tensor& g) {
      seen = g;
      return Tensor();
    });
    nn::cross_entropy(leaf, t.to(gpu()), {}).backward();
    ASSERT_TRUE(seen.defined());
    EXPECT_EQ(seen.stride(0), pitch);
    EXPECT_EQ(seen.stride(1), 1);
  }
}

TEST_F(CudaCrossEntropy, UnbatchedInput) {
  const Tensor x = gpu_logits({7}, DType::Float64, 27);
  const Tensor t = from_vector<int64_t>({3}, {});
  compare(x, t, {.reduction = Reduction::None, .label_smoothing = 0.1}, 1e-10, 1e-12);
  compare(x, t, {}, 1e-10, 1e-12);
}

// A target outside [0, C) cannot raise without stalling the host: its row's loss and gradient are NaN.
TEST_F(CudaCrossEntropy, OutOfRangeTargetGivesNaN) {
  Tensor x = gpu_logits({3, 4}, DType::Float32, 28);
  x.requires_grad_();
  const Tensor t = from_vector<int64_t>({1, 4, 2}, {3}, gpu());
  Tensor loss = nn::cross_entropy(x, t, {.reduction = Reduction::None});
  const std::vector<double> l = values(loss.detach());
  EXPECT_TRUE(std::isfinite(l[0]) && std::isnan(l[1]) && std::isfinite(l[2])) << l[0] << " " << l[1] << " " << l[2];
  loss.backward(ones({3}, {.device = gpu()}));
  const std::vector<double> g = values(x.grad());
  for (int64_t k = 0; k < 4; ++k) {
    EXPECT_TRUE(std::isfinite(g[k]) && std::isnan(g[4 + k]) && std::isfinite(g[8 + k])) << k;
  }
  EXPECT_TRUE(std::isnan(values(nn::cross_entropy(x.detach(), from_vector<int64_t>({1, -3, 2}, {3}, gpu())))[0]));
}

TEST_F(CudaCrossEntropy, BadShapesRaiseAsTheComposedPath) {
  const Tensor x = gpu_logits({4, 5}, DType::Float32, 29);
  expect_error(
      [&] {
        nn::cross_entropy(x, from_vector<int64_t>({0, 1, 2}, {3}, gpu()));
      },
      {"cross_entropy", "(N, d1, ...)", "[4, 5]"});
  expect_error(
      [&] {
        nn::cross_entropy(x, from_vector<int64_t>({0, 1, 2, 3}, {4}, gpu()), {.weight = ones({4}, {.device = gpu()})});
      },
      {"cross_entropy", "weight must have shape [5]"});
}

// Steady state: forward and backward allocate from the caching allocator only.
TEST_F(CudaCrossEntropy, NoDeviceMallocAfterWarmUp) {
  const Tensor x = gpu_logits({64, 1000}, DType::Float32, 30);
  const Tensor t = class_targets({64}, 1000, 7, -100, 31).to(gpu());
  const Tensor w = class_weight(1000).to(gpu());
  auto step = [&] {
    for (Reduction red : {Reduction::None, Reduction::Mean}) {
      Result r = run(x, t, {.weight = w, .reduction = red, .label_smoothing = 0.1});
      EXPECT_TRUE(r.grad.defined());
    }
  };
  step();
  step();
  const int64_t mallocs = cuda::memory_stats(0).num_device_mallocs;
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(cuda::memory_stats(0).num_device_mallocs, mallocs);
}

}  // namespace
}  // namespace kiln::testing
