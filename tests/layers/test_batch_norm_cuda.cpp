// kiln's CUDA batch norm (kiln/layers/cuda/batch_norm.cu through nn::batch_norm / nn::batch_norm_relu) against
// the CPU composed path in float64 on the same (rounded) inputs: outputs, gradients of input, weight and bias,
// running statistics; training and eval; NCHW and channels-last; (N, C), (N, C, L), (N, C, H, W); 16-bit inputs
// with float32 parameters; shapes large enough for the split reduction; determinism; no cudaMalloc once warm.
// The fused residual tail batch_norm_add_relu on the GPU against both the GPU's composed relu(batch_norm + add)
// and the CPU in float64, with the residual in x's layout or another.
// Also batch_norm_relu and batch_norm_add_relu on every device against hand-written references and
// check_gradients, and their bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kiln/autograd/autocast.h"       // autocast::Guard
#include "kiln/layers/cuda/batch_norm.h"  // the mask the fused ReLU keeps
#include "kiln/layers/functional.h"
#include "kiln/layers/layers.h"  // BatchNorm2d
#include "kiln/tensor/cuda.h"
#include "support/grad_support.h"
#include "support/test_support.h"

// The CUDA layer internals these tests call (nn::cuda_impl) exist only in a CUDA build.
#if KILN_TEST_CUDA
namespace kiln::testing {
namespace {

struct BnCase {
  Shape shape;
  bool channels_last = false;
  bool training = true;
  bool relu = false;
  DType dtype = DType::Float32;
  bool affine = true;
  bool running = true;
  double lo = -2, hi = 2;  // input range
  // batch_norm_add_relu (relu is then implied): a residual, in x's layout or (residual_nchw) NCHW-contiguous;
  // composed runs relu(batch_norm(x) + residual) as separate ops instead of the fused op.
  bool residual = false;
  bool residual_nchw = false;
  bool composed = false;
};

std::string describe(const BnCase& k) {
  std::string s = "shape " + std::to_string(k.shape.size()) + "-d [";
  for (int64_t d : k.shape) s += std::to_string(d) + " ";
  s += std::string("] ") + (k.channels_last ? "channels_last " : "") + (k.training ? "training " : "eval ") +
       (k.relu ? "relu " : "") + (k.affine ? "" : "no-affine ") + (k.running ? "" : "no-running ") +
       (k.residual ? (k.residual_nchw ? "residual(nchw) " : "residual ") : "");
  return s;
}

struct BnOut {
  Tensor y, gx, gw, gb, rm, rv, gres;
};

struct BnData {
  std::vector<double> x, gy, w, b, rm, rv, res;
};

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The inputs, rounded to the dtype they will have, so both paths see the same numbers.
BnData make_data(const BnCase& k) {
  const int64_t n = numel_of(k.shape), c = k.shape[1];
  const auto round = [](const std::vector<double>& v, DType dt) {
    return values(make(v, {int64_t(v.size())}, {.dtype = dt}));
  };
  BnData d{round(uniform(n, k.lo, k.hi, 21), k.dtype),
           round(uniform(n, -1, 1, 22), k.dtype),
           uniform(c, 0.5, 1.5, 23),
           uniform(c, -1, 1, 24),
           uniform(c, -0.5, 0.5, 25),
           uniform(c, 0.5, 2, 26),
           {}};
  if (k.residual) {
    // Residuals that keep every pre-activation bn(x) + residual (in float64) at least 0.1 from the ReLU's kink:
    // the 16-bit paths round it by far less, so every path masks the same elements and gradients compare
    // elementwise. (bn(x) as the float64 CPU path computes it, with the statistics the case normalises with.)
    std::vector<double> res = uniform(n, -1.5, 1.5, 27);
    const TensorOptions f64{.dtype = DType::Float64};
    const Tensor w = make(d.w, {c}, f64), b = make(d.b, {c}, f64);
    const Tensor z = k.training ? nn::batch_norm(make(d.x, k.shape, f64), {}, {}, k.affine ? w : Tensor(),
                                                 k.affine ? b : Tensor(), true, 0.3, 1e-3)
                                : nn::batch_norm(make(d.x, k.shape, f64), make(d.rm, {c}, f64), make(d.rv, {c}, f64),
                                                 k.affine ? w : Tensor(), k.affine ? b : Tensor(), false, 0.3, 1e-3);
    const std::vector<double> zv = values(z);
    for (size_t i = 0; i < res.size(); ++i) {
      const double pre = zv[i] + res[i];
      if (std::abs(pre) < 0.1) res[i] += pre >= 0 ? 0.2 : -0.2;
    }
    d.res = round(res, k.dtype);
  }
  return d;
}

// One forward and backward; x in xdt, the per-channel tensors in pdt.
BnOut run(const BnCase& k, const BnData& d, Device dev, DType xdt, DType pdt) {
  const int64_t c = k.shape[1];
  Tensor x = make(d.x, k.shape, {.dtype = xdt, .device = dev});
  if (k.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  x.requires_grad_();
  Tensor w, b, rm, rv;
  if (k.affine) {
    w = make(d.w, {c}, {.dtype = pdt, .device = dev}).requires_grad_();
    b = make(d.b, {c}, {.dtype = pdt, .device = dev}).requires_grad_();
  }
  if (k.running) {
    rm = make(d.rm, {c}, {.dtype = pdt, .device = dev});
    rv = make(d.rv, {c}, {.dtype = pdt, .device = dev});
  }
  Tensor res;
  if (k.residual) {
    res = make(d.res, k.shape, {.dtype = xdt, .device = dev});
    if (k.channels_last && !k.residual_nchw) res = res.contiguous(MemoryFormat::ChannelsLast);
    res.requires_grad_();
  }
  Tensor y = k.residual ? (k.composed ? relu(nn::batch_norm(x, rm, rv, w, b, k.training, 0.3, 1e-3) + res)
                                      : nn::batch_norm_add_relu(x, res, rm, rv, w, b, k.training, 0.3, 1e-3))
             : k.relu   ? nn::batch_norm_relu(x, rm, rv, w, b, k.training, 0.3, 1e-3)
                        : nn::batch_norm(x, rm, rv, w, b, k.training, 0.3, 1e-3);
  y.backward(make(d.gy, k.shape, {.dtype = xdt, .device = dev}));
  return {y,  x.grad(), k.affine ? w.grad() : Tensor(),    k.affine ? b.grad() : Tensor(),
          rm, rv,       k.residual ? res.grad() : Tensor()};
}

// Every element within tol * max(1, max |ref|) of the reference.
void expect_close_scaled(const Tensor& actual, const Tensor& ref, double tol, const char* what) {
  ASSERT_EQ(actual.defined(), ref.defined()) << what;
  if (!ref.defined()) return;
  ASSERT_EQ(actual.shape(), ref.shape()) << what;
  const std::vector<double> a = values(actual), r = values(ref);
  double scale = 1;
  for (double v : r) scale = std::max(scale, std::abs(v));
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(a[i] - r[i]) <= tol * scale)) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " elements differ; first at " << first << ": "
                    << (first >= 0 ? a[first] : 0.0) << " vs " << (first >= 0 ? r[first] : 0.0) << " (tol "
                    << tol * scale << ")";
}

double tolerance(DType dt) {
  switch (dt) {
    case DType::Float64: return 1e-10;
    case DType::Float32: return 2e-5;
    case DType::Float16: return 4e-3;
    default: return 2e-2;  // bfloat16
  }
}

void expect_matches_composed(const BnCase& k) {
  SCOPED_TRACE(describe(k) + std::string(dtype_name(k.dtype)));
  const BnData d = make_data(k);
  const DType pdt = k.dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  const BnOut got = run(k, d, Device::cuda(0), k.dtype, pdt);
  const BnOut ref = run(k, d, Device::cpu(), DType::Float64, DType::Float64);
  const double tol = tolerance(k.dtype);
  EXPECT_EQ(got.y.dtype(), k.dtype);
  EXPECT_TRUE(got.y.is_contiguous(k.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous));
  expect_close_scaled(got.y, ref.y, tol, "y");
  expect_close_scaled(got.gx, ref.gx, tol, "grad input");
  expect_close_scaled(got.gw, ref.gw, std::max(tol, 1e-5), "grad weight");
  expect_close_scaled(got.gb, ref.gb, std::max(tol, 1e-5), "grad bias");
  // Running statistics are float32 for the 16-bit inputs too: their tolerance is float32's.
  expect_close_scaled(got.rm, ref.rm, k.dtype == DType::Float64 ? 1e-12 : 1e-5, "running_mean");
  expect_close_scaled(got.rv, ref.rv, k.dtype == DType::Float64 ? 1e-12 : 1e-5, "running_var");
  expect_close_scaled(got.gres, ref.gres, tol, "grad residual");
}

// batch_norm_add_relu on the GPU: against the CPU's float64 composition (expect_matches_composed) and against
// relu(batch_norm + add) as separate ops on the GPU in the same dtype; the residual's gradient is exactly dy
// where y > 0 and 0 elsewhere, in the residual's dtype; y keeps x's layout and dtype.
void expect_fused_residual_matches(BnCase k) {
  k.residual = true;
  k.relu = true;
  expect_matches_composed(k);
  SCOPED_TRACE(describe(k) + std::string(dtype_name(k.dtype)) + " vs the GPU's composed ops");
  const BnData d = make_data(k);
  const BnOut got = run(k, d, Device::cuda(0), k.dtype, DType::Float32);
  BnCase composed = k;
  composed.composed = true;
  const BnOut ref = run(composed, d, Device::cuda(0), k.dtype, DType::Float32);
  // The composed ops round bn(x) to the dtype before the add: one more rounding than the fused kernel.
  const double tol = 2 * tolerance(k.dtype);
  expect_close_scaled(got.y, ref.y, tol, "y");
  expect_close_scaled(got.gx, ref.gx, tol, "grad input");
  expect_close_scaled(got.gw, ref.gw, std::max(tol, 1e-5), "grad weight");
  expect_close_scaled(got.gb, ref.gb, std::max(tol, 1e-5), "grad bias");
  expect_close_scaled(got.rm, ref.rm, 1e-6, "running_mean");
  expect_close_scaled(got.rv, ref.rv, 1e-6, "running_var");
  ASSERT_TRUE(got.gres.defined());
  EXPECT_EQ(got.gres.dtype(), k.dtype);
  EXPECT_EQ(got.gres.shape(), k.shape);
  const std::vector<double> gres = values(got.gres), y = values(got.y);
  int64_t bad = 0;
  for (size_t i = 0; i < gres.size(); ++i) bad += gres[i] != (y[i] > 0 ? d.gy[i] : 0.0);
  EXPECT_EQ(bad, 0) << "grad residual must be dy masked by y > 0";
}

class CudaBatchNorm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  }
};

TEST_F(CudaBatchNorm, TrainingAndEvalMatchTheComposedPathInEveryLayoutAndRank) {
  for (bool training : {true, false}) {
    expect_matches_composed({.shape = {4, 6, 5, 7}, .training = training});                          // NCHW, S odd
    expect_matches_composed({.shape = {2, 5, 8, 8}, .training = training});                          // NCHW, vectors
    expect_matches_composed({.shape = {4, 6, 5, 7}, .channels_last = true, .training = training});   // NHWC, C % 4 != 0
    expect_matches_composed({.shape = {3, 16, 4, 5}, .channels_last = true, .training = training});  // NHWC, vectors
    expect_matches_composed({.shape = {9, 5}, .training = training});                                // (N, C)
    expect_matches_composed({.shape = {64, 32}, .training = training});                              // (N, C), vectors
    expect_matches_composed({.shape = {3, 4, 10}, .training = training});                            // (N, C, L)
    expect_matches_composed({.shape = {3, 4, 10}, .training = training, .dtype = DType::Float64});
  }
}

TEST_F(CudaBatchNorm, WithoutAffineOrRunningStatistics) {
  expect_matches_composed({.shape = {4, 3, 6, 6}, .affine = false});
  expect_matches_composed({.shape = {4, 3, 6, 6}, .running = false});
  expect_matches_composed({.shape = {4, 8, 3, 3}, .channels_last = true, .affine = false, .running = false});
}

TEST_F(CudaBatchNorm, SixteenBitInputsWithFloat32Parameters) {
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    for (bool training : {true, false}) {
      expect_matches_composed({.shape = {4, 8, 6, 6}, .training = training, .dtype = dt});
      expect_matches_composed({.shape = {4, 16, 6, 6}, .channels_last = true, .training = training, .dtype = dt});
      expect_matches_composed({.shape = {4, 6, 5, 3}, .channels_last = true, .training = training, .dtype = dt});
      expect_matches_composed({.shape = {32, 24}, .training = training, .dtype = dt});
    }
  }
}

TEST_F(CudaBatchNorm, FusedReluMasksTheGradientByTheOutput) {
  for (bool training : {true, false}) {
    expect_matches_composed({.shape = {4, 6, 5, 7}, .training = training, .relu = true});
    expect_matches_composed({.shape = {4, 16, 4, 4}, .channels_last = true, .training = training, .relu = true});
    expect_matches_composed({.shape = {16, 8}, .training = training, .relu = true, .dtype = DType::Float64});
    // Inputs taken 16 bytes at a time keep the mask as bits (channels-last rows, planes of S % 8 == 0, and 2-d
    // rows); S = 35 runs one value at a time and keeps the output instead.
    for (DType dt : {DType::BFloat16, DType::Float16, DType::Float32}) {
      expect_matches_composed(
          {.shape = {4, 16, 4, 4}, .channels_last = true, .training = training, .relu = true, .dtype = dt});
      expect_matches_composed({.shape = {4, 6, 4, 8}, .training = training, .relu = true, .dtype = dt});
      expect_matches_composed({.shape = {24, 16}, .training = training, .relu = true, .dtype = dt});
      expect_matches_composed({.shape = {4, 6, 5, 7}, .training = training, .relu = true, .dtype = dt});
    }
  }
}

// The fused ReLU's mask is kept as bits where the forward reads 16 bytes at a time: W = 16 / sizeof(element) bits to
// a byte (bit e % W of byte e / W, numel / W bytes), in place of the output; a forward that runs one value at a time
// keeps the output.
TEST_F(CudaBatchNorm, FusedReluKeepsItsMaskAsBits) {
  const Device gpu = Device::cuda(0);
  auto forward = [&](const Shape& shape, DType dt, bool relu) {
    const Tensor x = randn(shape, {.dtype = dt, .device = gpu});
    return nn::cuda_impl::batch_norm_forward(x, {}, {}, {}, {}, true, 0.1, 1e-5, relu);
  };
  for (const auto& [dt, w] : {std::pair{DType::BFloat16, 8}, std::pair{DType::Float16, 8}, std::pair{DType::Float32, 4},
                              std::pair{DType::Float64, 2}}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto bits = forward({4, 16, 4, 4}, dt, true);
    ASSERT_TRUE(bits.relu_mask.defined());
    EXPECT_EQ(bits.relu_mask.dtype(), DType::UInt8);
    EXPECT_EQ(bits.relu_mask.numel(), 4 * 16 * 4 * 4 / w);
    // Each bit says whether its output is > 0; the bits past W in a byte stay clear.
    const std::vector<double> y = internal::contiguous(bits.y).to(DType::Float64).cpu().to_vector<double>();
    const std::vector<double> m = bits.relu_mask.to(DType::Int64).cpu().to_vector<double>();
    for (size_t e = 0; e < y.size(); ++e) {
      const bool bit = (static_cast<int64_t>(m[e / w]) >> (e % w)) & 1;
      ASSERT_EQ(bit, y[e] > 0) << "element " << e;
    }
    for (double byte : m) ASSERT_EQ(static_cast<int64_t>(byte) >> w, 0);
    EXPECT_FALSE(forward({4, 16, 4, 4}, dt, false).relu_mask.defined());
    EXPECT_FALSE(forward({4, 6, 5, 7}, dt, true).relu_mask.defined());
  }
}

// A backward that runs narrower than the forward that wrote the mask (here dy one element off 16-byte alignment:
// every pass of the backward takes one value at a time) reads each value's bit where the forward put it: the
// gradients equal, bit for bit, those of the same backward reading the output's sign instead of the mask.
TEST_F(CudaBatchNorm, ANarrowerBackwardReadsTheForwardsMask) {
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::BFloat16, DType::Float32}) {
    for (bool channels_last : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (channels_last ? " channels-last" : " NCHW"));
      const int64_t N = 4, C = 16, H = 4, W = 8, n = N * C * H * W;
      const TensorOptions o{.dtype = dt, .device = gpu};
      Tensor x = randn({N, C, H, W}, o), w = rand({C}, {.device = gpu}), b = randn({C}, {.device = gpu});
      if (channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
      const auto f = nn::cuda_impl::batch_norm_forward(x, w, b, {}, {}, true, 0.1, 1e-5, true);
      ASSERT_TRUE(f.relu_mask.defined());
      // dy in x's layout, starting one element into its storage.
      const Tensor flat = randn({n + 1}, o).narrow(0, 1, n);
      const Tensor dy = channels_last ? flat.view({N, H, W, C}).permute({0, 3, 1, 2}) : flat.view({N, C, H, W});
      ASSERT_EQ(dy.is_contiguous(channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous), true);
      ASSERT_NE(reinterpret_cast<uintptr_t>(dy.data_ptr()) % 16, 0u);
      const auto by_mask = nn::cuda_impl::batch_norm_backward(dy, x, {}, f.relu_mask, w, f.mean, f.invstd, true, {});
      const auto by_y = nn::cuda_impl::batch_norm_backward(dy, x, f.y, {}, w, f.mean, f.invstd, true, {});
      EXPECT_EQ(values(by_mask.input), values(by_y.input));
      EXPECT_EQ(values(by_mask.weight), values(by_y.weight));
      EXPECT_EQ(values(by_mask.bias), values(by_y.bias));
      // And the mask did its work: some of dy was masked off.
      EXPECT_NE(values(by_mask.bias),
                values(nn::cuda_impl::batch_norm_backward(dy, x, {}, {}, w, f.mean, f.invstd, true, {}).bias));
    }
  }
}

// N * H * W > 1e6 values per channel: the reduction splits over many blocks and merges them in a second pass.
// An offset mean (|mean| >> std) checks the merged Welford statistics keep float32 accuracy.
TEST_F(CudaBatchNorm, LargeInputsUseTheSplitReduction) {
  expect_matches_composed({.shape = {20, 3, 256, 256}, .lo = 10, .hi = 12});
  expect_matches_composed({.shape = {20, 4, 128, 128}, .channels_last = true, .lo = 10, .hi = 12});
  expect_matches_composed({.shape = {1 << 20, 2}, .lo = -3, .hi = 1});
  BnCase half{.shape = {16, 4, 128, 128}, .channels_last = true, .dtype = DType::BFloat16};
  expect_matches_composed(half);
}

TEST_F(CudaBatchNorm, AMeanFarFromZeroKeepsTheVariance) {
  // Values of mean 1000 and deviation 0.58: a variance taken as E[x^2] - E[x]^2, or a normalisation done as
  // x scale + shift, in float32 would lose most of it to rounding.
  for (const BnCase& k : {BnCase{.shape = {64, 8, 32, 32}, .lo = 999, .hi = 1001},
                          BnCase{.shape = {64, 8, 32, 32}, .channels_last = true, .lo = 999, .hi = 1001},
                          BnCase{.shape = {65536, 8}, .lo = 999, .hi = 1001}}) {
    SCOPED_TRACE(describe(k));
    const BnData d = make_data(k);
    const BnOut got = run(k, d, Device::cuda(0), DType::Float32, DType::Float32);
    const BnOut ref = run(k, d, Device::cpu(), DType::Float64, DType::Float64);
    expect_close_scaled(got.y, ref.y, 2e-5, "y");
    expect_close_scaled(got.gx, ref.gx, 2e-5, "grad input");
    expect_close_scaled(got.gb, ref.gb, 1e-5, "grad bias");
    expect_close_scaled(got.rm, ref.rm, 1e-6, "running_mean");
    expect_close_scaled(got.rv, ref.rv, 1e-5, "running_var");
    // grad weight = invstd sum dy (x - mean) uses the mean saved in float32: its rounding error, up to
    // |mean| 2^-24, shifts the sum by that times sum dy. Each channel within three times that of the reference.
    const std::vector<double> gw = values(got.gw), rgw = values(ref.gw);
    const int64_t C = k.shape[1], plane = k.shape.size() == 4 ? k.shape[2] * k.shape[3] : 1;
    for (int64_t c = 0; c < C; ++c) {
      double sum_dy = 0;
      for (int64_t n = 0; n < k.shape[0]; ++n)
        for (int64_t i = 0; i < plane; ++i) sum_dy += d.gy[static_cast<size_t>((n * C + c) * plane + i)];
      const double invstd = 1 / std::sqrt((1.0 / 12) * 4 + 1e-3);  // uniform on [999, 1001]: variance 1/3
      const double bound = 3 * 1001 * std::ldexp(1.0, -24) * std::abs(sum_dy) * invstd + 1e-5 * std::abs(rgw[c]);
      EXPECT_NEAR(gw[static_cast<size_t>(c)], rgw[static_cast<size_t>(c)], bound) << "channel " << c;
    }
  }
}

TEST_F(CudaBatchNorm, IsDeterministic) {
  const BnCase k{.shape = {32, 3, 64, 64}};
  const BnData d = make_data(k);
  const BnOut a = run(k, d, Device::cuda(0), DType::Float32, DType::Float32);
  const BnOut b = run(k, d, Device::cuda(0), DType::Float32, DType::Float32);
  EXPECT_EQ(values(a.y), values(b.y));
  EXPECT_EQ(values(a.gx), values(b.gx));
  EXPECT_EQ(values(a.gw), values(b.gw));
  EXPECT_EQ(values(a.rv), values(b.rv));
}

// Training over rows (channels-last 4-d, 2-d) matches the CPU in float64, with and without the fused ReLU /
// residual, affine parameters and running statistics, row counts that leave tails in every split, many channel
// blocks.
TEST_F(CudaBatchNorm, RowsPassesMatchTheComposedPath) {
  const std::vector<BnCase> cases = {
      {.shape = {8, 64, 9, 7}, .channels_last = true},
      {.shape = {8, 64, 9, 7}, .channels_last = true, .relu = true, .dtype = DType::BFloat16},
      {.shape = {5, 24, 7, 3}, .channels_last = true, .relu = true, .dtype = DType::Float16, .affine = false},
      {.shape = {3, 8, 1, 1}, .channels_last = true, .dtype = DType::BFloat16, .running = false},  // 3 rows
      {.shape = {1000, 32}, .relu = true},
      {.shape = {16, 512, 3, 3}, .channels_last = true, .dtype = DType::BFloat16},  // many channel blocks
      {.shape = {32, 128, 28, 28}, .channels_last = true, .relu = true, .dtype = DType::BFloat16, .lo = 10, .hi = 12},
  };
  for (const BnCase& k : cases) expect_matches_composed(k);
  expect_fused_residual_matches({.shape = {8, 64, 9, 7}, .channels_last = true, .dtype = DType::BFloat16});
}

// Over rows in bfloat16 with the fused ReLU too, two runs give the same bits.
TEST_F(CudaBatchNorm, RowsPassesAreDeterministic) {
  const BnCase k{.shape = {64, 64, 16, 16}, .channels_last = true, .relu = true, .dtype = DType::BFloat16};
  const BnData d = make_data(k);
  const BnOut a = run(k, d, Device::cuda(0), k.dtype, DType::Float32);
  const BnOut b = run(k, d, Device::cuda(0), k.dtype, DType::Float32);
  EXPECT_EQ(values(a.y), values(b.y));
  EXPECT_EQ(values(a.gx), values(b.gx));
  EXPECT_EQ(values(a.gw), values(b.gw));
  EXPECT_EQ(values(a.gb), values(b.gb));
  EXPECT_EQ(values(a.rm), values(b.rm));
  EXPECT_EQ(values(a.rv), values(b.rv));
}

// A CUDA graph captures the passes: replays give what eager calls give, bit for bit, and each replay updates the
// running statistics once more, as an eager step would.
TEST_F(CudaBatchNorm, ReplaysInACudaGraph) {
  const Device gpu = Device::cuda(0);
  const Shape shape{16, 64, 8, 8};
  const BnCase k{.shape = shape, .channels_last = true, .relu = true, .dtype = DType::BFloat16};
  const BnData d = make_data(k);
  const Tensor x = make(d.x, shape, {.dtype = k.dtype, .device = gpu}).contiguous(MemoryFormat::ChannelsLast);
  const Tensor dy = make(d.gy, shape, {.dtype = k.dtype, .device = gpu}).contiguous(MemoryFormat::ChannelsLast);
  const Tensor w = make(d.w, {64}, {.device = gpu}), b = make(d.b, {64}, {.device = gpu});
  Tensor rm = make(d.rm, {64}, {.device = gpu}), rv = make(d.rv, {64}, {.device = gpu});
  Tensor y, gx;
  auto step = [&] {
    const auto f = nn::cuda_impl::batch_norm_forward(x, w, b, rm, rv, true, 0.3, 1e-3, true);
    const auto g = nn::cuda_impl::batch_norm_backward(dy, x, f.y, f.relu_mask, w, f.mean, f.invstd, true, {});
    y = f.y;
    gx = g.input;
  };
  // Eager reference: two steps from the starting running statistics.
  Tensor rm0 = rm.clone(), rv0 = rv.clone();
  step();
  const std::vector<double> y_eager = values(y), gx_eager = values(gx);
  step();
  const std::vector<double> rm_eager = values(rm), rv_eager = values(rv);
  rm.copy_(rm0);
  rv.copy_(rv0);
  cuda::Graph graph;
  graph.capture(step, /*warmup=*/0);
  graph.replay();
  EXPECT_EQ(values(y), y_eager);
  EXPECT_EQ(values(gx), gx_eager);
  graph.replay();
  EXPECT_EQ(values(rm), rm_eager);
  EXPECT_EQ(values(rv), rv_eager);
}

TEST_F(CudaBatchNorm, AutocastKeepsTheInputDtype) {
  const BnCase k{.shape = {4, 8, 6, 6}, .dtype = DType::BFloat16};
  const BnData d = make_data(k);
  Tensor x = make(d.x, k.shape, {.dtype = DType::BFloat16, .device = Device::cuda(0)});
  Tensor w = make(d.w, {8}, {.device = Device::cuda(0)}), b = make(d.b, {8}, {.device = Device::cuda(0)});
  autocast::Guard guard(DeviceType::CUDA, DType::BFloat16);
  Tensor y = nn::batch_norm(x, {}, {}, w, b, true);
  EXPECT_EQ(y.dtype(), DType::BFloat16);
}

TEST_F(CudaBatchNorm, NoNewCudaMallocOnceWarm) {
  const BnCase k{.shape = {8, 16, 16, 16}, .channels_last = true};
  const BnData d = make_data(k);
  run(k, d, Device::cuda(0), DType::Float32, DType::Float32);  // warm-up
  const int64_t mallocs = cuda::memory_stats(0).num_device_mallocs;
  for (int i = 0; i < 3; ++i) run(k, d, Device::cuda(0), DType::Float32, DType::Float32);
  EXPECT_EQ(cuda::memory_stats(0).num_device_mallocs, mallocs);
}

TEST_F(CudaBatchNorm, FusedResidualAddAndRelu) {
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    for (bool training : {true, false}) {
      expect_fused_residual_matches({.shape = {4, 6, 5, 7}, .training = training, .dtype = dt});   // NCHW, S odd
      expect_fused_residual_matches({.shape = {4, 16, 4, 8}, .training = training, .dtype = dt});  // NCHW, vectors
      // NHWC: C % 8 != 0 (scalar loads), then vectors with row counts that leave tails in the multi-row loops.
      expect_fused_residual_matches({.shape = {4, 6, 5, 3}, .channels_last = true, .training = training, .dtype = dt});
      expect_fused_residual_matches({.shape = {8, 64, 9, 7}, .channels_last = true, .training = training, .dtype = dt});
      expect_fused_residual_matches({.shape = {64, 32}, .training = training, .dtype = dt});  // (N, C)
    }
    expect_fused_residual_matches({.shape = {4, 8, 6, 6}, .channels_last = true, .dtype = dt, .affine = false});
    expect_fused_residual_matches({.shape = {4, 8, 6, 6}, .channels_last = true, .dtype = dt, .running = false});
  }
  // Large enough for the split reduction and many row steps per thread.
  expect_fused_residual_matches({.shape = {32, 256, 14, 14}, .channels_last = true, .dtype = DType::BFloat16});
  expect_fused_residual_matches({.shape = {3, 4, 10}, .dtype = DType::Float64});
}

TEST_F(CudaBatchNorm, ResidualInAnotherLayout) {
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    for (bool training : {true, false}) {
      // x channels-last, the residual NCHW: read in x's layout; y and both gradients as with a channels-last one.
      expect_fused_residual_matches(
          {.shape = {4, 16, 5, 6}, .channels_last = true, .training = training, .dtype = dt, .residual_nchw = true});
      expect_fused_residual_matches(
          {.shape = {4, 6, 5, 3}, .channels_last = true, .training = training, .dtype = dt, .residual_nchw = true});
    }
  }
  // x NCHW, the residual channels-last or a transposed view.
  const Device gpu = Device::cuda(0);
  const auto xv = uniform(2 * 8 * 4 * 4, -2, 2, 51), rv = uniform(2 * 8 * 4 * 4, -1, 1, 52);
  const Tensor x = make(xv, {2, 8, 4, 4}, {.device = gpu});
  const Tensor res_nhwc = make(rv, {2, 8, 4, 4}, {.device = gpu}).contiguous(MemoryFormat::ChannelsLast);
  const Tensor res_t = make(rv, {2, 8, 4, 4}, {.device = gpu}).transpose(2, 3).contiguous().transpose(2, 3);
  const Tensor ref = relu(nn::batch_norm(x.cpu().to(DType::Float64), {}, {}, {}, {}, true) +
                          make(rv, {2, 8, 4, 4}, {.dtype = DType::Float64}));
  for (const Tensor& res : {res_nhwc, res_t}) {
    const Tensor y = nn::batch_norm_add_relu(x, res, {}, {}, {}, {}, true);
    EXPECT_TRUE(y.is_contiguous());
    expect_close_scaled(y, ref, 2e-5, "y, residual in another layout than NCHW x");
  }
}

// The residual's dtype decides: x's (after autocast) runs fused and keeps it; another is added by promotion,
// as relu(batch_norm(x) + residual) would.
TEST_F(CudaBatchNorm, ResidualDtypeFollowsTheAddsPromotion) {
  const Device gpu = Device::cuda(0);
  const auto xv = uniform(4 * 8 * 3 * 3, -2, 2, 61), rv = uniform(4 * 8 * 3 * 3, -1, 1, 62);
  const Tensor x = make(xv, {4, 8, 3, 3}, {.dtype = DType::BFloat16, .device = gpu});
  const Tensor w = make(uniform(8, 0.5, 1.5, 63), {8}, {.device = gpu});
  const Tensor b = make(uniform(8, -1, 1, 64), {8}, {.device = gpu});
  const Tensor res32 = make(rv, {4, 8, 3, 3}, {.device = gpu});
  const Tensor res16 = res32.to(DType::BFloat16);
  autocast::Guard guard(DeviceType::CUDA, DType::BFloat16);
  const Tensor y16 = nn::batch_norm_add_relu(x, res16, {}, {}, w, b, true);
  const Tensor y32 = nn::batch_norm_add_relu(x, res32, {}, {}, w, b, true);
  EXPECT_EQ(y16.dtype(), DType::BFloat16);
  EXPECT_EQ(y32.dtype(), DType::Float32);
  const Tensor bn = nn::batch_norm(x, {}, {}, w, b, true);  // bfloat16
  expect_close_scaled(y32, relu(bn.to(DType::Float32) + res32), 1e-6, "promoted y");
  expect_close_scaled(y16, relu(bn.to(DType::Float32) + res32), 2e-2, "fused y");
}

TEST_F(CudaBatchNorm, ResidualOnAnotherDeviceIsAClearError) {
  const Tensor x = zeros({2, 3, 2, 2}, {.device = Device::cuda(0)});
  expect_error(
      [&] {
        nn::batch_norm_add_relu(x, zeros({2, 3, 2, 2}), {}, {}, {}, {}, true);
      },
      {"batch_norm_add_relu", "residual", "cpu", "cuda:0", "[2, 3, 2, 2]"});
}

// ---------------------------------------------------------------- batch_norm_relu on every device

class BatchNormReluTest : public BackendTest {};

TEST_P(BatchNormReluTest, IsTheReluOfBatchNormAgainstAHandReference) {
  const int64_t n = 3, c = 2, l = 4;
  const auto xv = uniform(n * c * l, -2, 2, 31), wv = uniform(c, 0.5, 1.5, 32), bv = uniform(c, -1, 1, 33);
  std::vector<double> mean(c, 0), var(c, 0);
  for (int64_t i = 0; i < n * c * l; ++i) mean[(i / l) % c] += xv[i] / (n * l);
  for (int64_t i = 0; i < n * c * l; ++i) var[(i / l) % c] += std::pow(xv[i] - mean[(i / l) % c], 2) / (n * l);
  std::vector<double> ref(xv.size()), ref_eval(xv.size());
  const double rm[2] = {0.25, -0.5}, rv[2] = {1.5, 0.75};
  for (int64_t i = 0; i < n * c * l; ++i) {
    const int64_t k = (i / l) % c;
    ref[i] = std::max(0.0, (xv[i] - mean[k]) / std::sqrt(var[k] + 1e-5) * wv[k] + bv[k]);
    ref_eval[i] = std::max(0.0, (xv[i] - rm[k]) / std::sqrt(rv[k] + 1e-5) * wv[k] + bv[k]);
  }
  const Tensor x = make(xv, {n, c, l}, opts()), w = make(wv, {c}, opts()), b = make(bv, {c}, opts());
  Tensor running_mean = make({0.25, -0.5}, {2}, opts()), running_var = make({1.5, 0.75}, {2}, opts());
  expect_values(nn::batch_norm_relu(x, running_mean, running_var, w, b, /*training=*/false), {n, c, l}, ref_eval, 1e-5,
                1e-5);
  expect_values(nn::batch_norm_relu(x, running_mean, running_var, w, b, /*training=*/true, 0.5), {n, c, l}, ref, 1e-5,
                1e-5);
  const double unbias = static_cast<double>(n * l) / static_cast<double>(n * l - 1);
  expect_values(running_mean, {2}, {0.5 * 0.25 + 0.5 * mean[0], 0.5 * -0.5 + 0.5 * mean[1]}, 1e-5, 1e-6);
  expect_values(running_var, {2}, {0.5 * 1.5 + 0.5 * var[0] * unbias, 0.5 * 0.75 + 0.5 * var[1] * unbias}, 1e-5, 1e-6);
}

KILN_INSTANTIATE_BACKENDS(BatchNormReluTest);

TEST(BatchNormRelu, Gradients) {
  // Inputs away from the kink: y = 0 exactly has no derivative.
  check_gradients(
      [](const TensorList& in) {
        const TensorOptions on = {.dtype = DType::Float64, .device = in[0].device()};
        return TensorList{nn::batch_norm_relu(in[0], zeros({3}, on), ones({3}, on), in[1], in[2], true)};
      },
      {make_input({4, 3, 2}, -2, 2, 41), make_input({3}, 0.5, 1.5, 42), make_input({3}, -1, 1, 43)});
  check_gradients(
      [](const TensorList& in) {
        const TensorOptions on = {.dtype = DType::Float64, .device = in[0].device()};
        return TensorList{nn::batch_norm_relu(in[0], full({3}, 0.1, on), full({3}, 0.8, on), in[1], in[2], false)};
      },
      {make_input({4, 3, 2, 2}, -2, 2, 44), make_input({3}, 0.5, 1.5, 45), make_input({3}, -1, 1, 46)});
}

// ---------------------------------------------------------------- batch_norm_add_relu on every device

class BatchNormAddReluTest : public BackendTest {};

TEST_P(BatchNormAddReluTest, IsTheReluOfBatchNormPlusTheResidualAgainstAHandReference) {
  const int64_t n = 3, c = 2, l = 4;
  const auto xv = uniform(n * c * l, -2, 2, 71), wv = uniform(c, 0.5, 1.5, 72), bv = uniform(c, -1, 1, 73);
  const auto rv_ = uniform(n * c * l, -1.5, 1.5, 74);
  std::vector<double> mean(c, 0), var(c, 0);
  for (int64_t i = 0; i < n * c * l; ++i) mean[(i / l) % c] += xv[i] / (n * l);
  for (int64_t i = 0; i < n * c * l; ++i) var[(i / l) % c] += std::pow(xv[i] - mean[(i / l) % c], 2) / (n * l);
  std::vector<double> ref(xv.size()), ref_eval(xv.size());
  const double rm[2] = {0.25, -0.5}, rvar[2] = {1.5, 0.75};
  for (int64_t i = 0; i < n * c * l; ++i) {
    const int64_t k = (i / l) % c;
    ref[i] = std::max(0.0, (xv[i] - mean[k]) / std::sqrt(var[k] + 1e-5) * wv[k] + bv[k] + rv_[i]);
    ref_eval[i] = std::max(0.0, (xv[i] - rm[k]) / std::sqrt(rvar[k] + 1e-5) * wv[k] + bv[k] + rv_[i]);
  }
  const Tensor x = make(xv, {n, c, l}, opts()), w = make(wv, {c}, opts()), b = make(bv, {c}, opts());
  const Tensor res = make(rv_, {n, c, l}, opts());
  Tensor running_mean = make({0.25, -0.5}, {2}, opts()), running_var = make({1.5, 0.75}, {2}, opts());
  expect_values(nn::batch_norm_add_relu(x, res, running_mean, running_var, w, b, /*training=*/false), {n, c, l},
                ref_eval, 1e-5, 1e-5);
  expect_values(running_mean, {2}, {0.25, -0.5}, 0, 0);  // eval leaves them
  expect_values(nn::batch_norm_add_relu(x, res, running_mean, running_var, w, b, /*training=*/true, 0.5), {n, c, l},
                ref, 1e-5, 1e-5);
  const double unbias = static_cast<double>(n * l) / static_cast<double>(n * l - 1);
  expect_values(running_mean, {2}, {0.5 * 0.25 + 0.5 * mean[0], 0.5 * -0.5 + 0.5 * mean[1]}, 1e-5, 1e-6);
  expect_values(running_var, {2}, {0.5 * 1.5 + 0.5 * var[0] * unbias, 0.5 * 0.75 + 0.5 * var[1] * unbias}, 1e-5, 1e-6);
  // Hand-derived gradients of sum(y * g): d_residual = g where y > 0; in eval dx = g [y > 0] w / sqrt(rv + eps).
  const auto gv = uniform(n * c * l, -1, 1, 75);
  Tensor xg = make(xv, {n, c, l}, opts()).requires_grad_(), rg = make(rv_, {n, c, l}, opts()).requires_grad_();
  nn::batch_norm_add_relu(xg, rg, running_mean.clone(), running_var.clone(), w, b, false)
      .backward(make(gv, {n, c, l}, opts()));
  std::vector<double> gres(xv.size()), gx(xv.size());
  const double rm2[2] = {values(running_mean)[0], values(running_mean)[1]};
  const double rv2[2] = {values(running_var)[0], values(running_var)[1]};
  for (int64_t i = 0; i < n * c * l; ++i) {
    const int64_t k = (i / l) % c;
    const double pre = (xv[i] - rm2[k]) / std::sqrt(rv2[k] + 1e-5) * wv[k] + bv[k] + rv_[i];
    gres[i] = pre > 0 ? gv[i] : 0;
    gx[i] = gres[i] * wv[k] / std::sqrt(rv2[k] + 1e-5);
  }
  expect_values(rg.grad(), {n, c, l}, gres, 1e-6, 1e-6);
  expect_values(xg.grad(), {n, c, l}, gx, 1e-5, 1e-5);
}

TEST_P(BatchNormAddReluTest, BadResidualsNameTheOpAndTheShapes) {
  const Tensor x = zeros({2, 3, 2, 2}, opts());
  expect_error(
      [&] {
        nn::batch_norm_add_relu(x, zeros({2, 3, 2, 1}, opts()), {}, {}, {}, {}, true);
      },
      {"batch_norm_add_relu", "residual", "[2, 3, 2, 2]", "[2, 3, 2, 1]"});
  expect_error(
      [&] {
        nn::batch_norm_add_relu(x, zeros({3, 2, 2}, opts()), {}, {}, {}, {}, true);
      },
      {"batch_norm_add_relu", "[2, 3, 2, 2]", "[3, 2, 2]"});
  expect_error([&] { nn::batch_norm_add_relu(x, Tensor(), {}, {}, {}, {}, true); },
               {"batch_norm_add_relu", "residual", "defined"});
  // batch_norm's own checks still apply.
  expect_error([&] { nn::batch_norm_add_relu(x, x, {}, {}, zeros({4}, opts()), {}, true); },
               {"batch_norm", "weight", "[4]", "[3]"});
}

// The batch counter: each training call of the three ops adds 1 to num_batches_tracked (on CUDA inside the
// statistics kernel, also in 16 bits, channels-last and float32), eval calls leave it; a BatchNorm module counts
// its training batches with and without a momentum, and not in eval.
TEST_P(BatchNormAddReluTest, TrainingCallsCountTheirBatches) {
  Tensor counter = zeros({}, opts(DType::Int64));
  std::vector<DType> dtypes = {DType::Float32};
  if (dev().is_cuda()) dtypes.push_back(DType::BFloat16);
  for (DType dt : dtypes) {
    const Tensor x = make(uniform(4 * 8 * 3 * 3, -2, 2, 81), {4, 8, 3, 3}, opts()).to(dt);
    const Tensor xl = x.contiguous(MemoryFormat::ChannelsLast);
    Tensor rm = zeros({8}, opts()), rv = ones({8}, opts());
    const Tensor w = ones({8}, opts()), b = zeros({8}, opts());
    nn::batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5, counter);
    nn::batch_norm_relu(xl, rm, rv, w, b, true, 0.1, 1e-5, counter);
    nn::batch_norm_add_relu(xl, xl, rm, rv, w, b, true, 0.1, 1e-5, counter);
    nn::batch_norm(x, rm, rv, w, b, false, 0.1, 1e-5, counter);      // eval: not counted
    nn::batch_norm_relu(x, {}, {}, w, b, true, 0.1, 1e-5, counter);  // no running statistics: still a batch
  }
  expect_values(counter, {}, {4.0 * static_cast<double>(dtypes.size())}, 0, 0);
  expect_error(
      [&] {
        nn::batch_norm(zeros({2, 3}, opts()), {}, {}, {}, {}, true, 0.1, 1e-5, zeros({1}, opts()));
      },
      {"batch_norm", "num_batches_tracked", "Int64"});

  for (bool with_momentum : {true, false}) {
    nn::BatchNormOptions o;
    if (!with_momentum) o.momentum.reset();
    nn::BatchNorm2d bn(3, o);
    bn.to(dev());
    const Tensor x = make(uniform(2 * 3 * 2 * 2, -1, 1, 82), {2, 3, 2, 2}, opts());
    bn(x);
    bn.forward_add_relu(x, x);
    bn.eval();
    bn(x);
    expect_values(bn.num_batches_tracked, {}, {2}, 0, 0);
  }
}

KILN_INSTANTIATE_BACKENDS(BatchNormAddReluTest);

TEST(BatchNormAddRelu, Gradients) {
  // x, weight, bias and the residual; inputs away from the kink (y = 0 exactly has no derivative).
  check_gradients(
      [](const TensorList& in) {
        const TensorOptions on = {.dtype = DType::Float64, .device = in[0].device()};
        return TensorList{nn::batch_norm_add_relu(in[0], in[3], zeros({3}, on), ones({3}, on), in[1], in[2], true)};
      },
      {make_input({4, 3, 2}, -2, 2, 81), make_input({3}, 0.5, 1.5, 82), make_input({3}, -1, 1, 83),
       make_input({4, 3, 2}, -1.5, 1.5, 84)});
  check_gradients(
      [](const TensorList& in) {
        const TensorOptions on = {.dtype = DType::Float64, .device = in[0].device()};
        return TensorList{
            nn::batch_norm_add_relu(in[0], in[3], full({3}, 0.1, on), full({3}, 0.8, on), in[1], in[2], false)};
      },
      {make_input({4, 3, 2, 2}, -2, 2, 85), make_input({3}, 0.5, 1.5, 86), make_input({3}, -1, 1, 87),
       make_input({4, 3, 2, 2}, -1.5, 1.5, 88)});
  // Channels-last x (the GPU's rows layout when a GPU is visible).
  check_gradients(
      [](const TensorList& in) {
        return TensorList{
            nn::batch_norm_add_relu(contiguous(in[0], MemoryFormat::ChannelsLast), in[3], {}, {}, in[1], in[2], true)};
      },
      {make_input({3, 4, 2, 3}, -2, 2, 89), make_input({4}, 0.5, 1.5, 90), make_input({4}, -1, 1, 91),
       make_input({3, 4, 2, 3}, -1.5, 1.5, 92)});
}

}  // namespace
}  // namespace kiln::testing

#else
TEST(CudaBatchNorm, NeedsACudaBuild) { GTEST_SKIP() << "kiln was built without CUDA (KILN_CUDA=OFF)"; }
#endif
