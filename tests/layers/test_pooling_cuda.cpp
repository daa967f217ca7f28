// kiln's CUDA pooling kernels (kiln/layers/cuda/pooling.cu through nn::max_pool2d / avg_pool2d /
// adaptive_avg_pool2d) against the CPU composed path in float64 on the same (rounded) inputs: outputs and input
// gradients for several kernel / stride / padding / ceil_mode / count_include_pad combinations, NCHW and
// channels-last (the output keeps the input's format), 16-bit inputs, adaptive sizes that do not divide; max
// pooling's ties against an independent reference of PyTorch's rule (the first maximum of a window in row-major
// order takes the whole gradient); no cudaMalloc once warm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kiln/layers/pooling.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

enum class Kind { Max, Avg, Adaptive };

struct PoolRun {
  Tensor y, gx;
};

// Forward on x (values xv, shape s, dtype dt, device dev), backward with gy (values gv of y's shape).
PoolRun run_pool(Kind kind, const nn::Pool2dOptions& o, nn::Pair out, const std::vector<double>& xv, const Shape& s,
                 DType dt, Device dev, bool channels_last, uint64_t seed) {
  Tensor x = make(xv, s, {.dtype = dt, .device = dev});
  if (channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  x.requires_grad_();
  Tensor y = kind == Kind::Max   ? nn::max_pool2d(x, o)
             : kind == Kind::Avg ? nn::avg_pool2d(x, o)
                                 : nn::adaptive_avg_pool2d(x, out);
  // The same upstream gradient on both devices: drawn for y's shape, rounded to dt.
  const std::vector<double> gv = values(make(uniform(y.numel(), -1, 1, seed), {y.numel()}, {.dtype = dt}));
  y.backward(make(gv, y.shape(), {.dtype = dt, .device = dev}));
  return {y, x.grad()};
}

void expect_close(const Tensor& a, const Tensor& r, double tol, const char* what) {
  ASSERT_EQ(a.shape(), r.shape()) << what;
  const std::vector<double> av = values(a), rv = values(r);
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < av.size(); ++i) {
    if (!(std::abs(av[i] - rv[i]) <= tol * std::max(1.0, std::abs(rv[i])))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << av.size() << " differ; first at " << first << ": "
                    << (first >= 0 ? av[first] : 0.0) << " vs " << (first >= 0 ? rv[first] : 0.0);
}

double tol_for(DType dt) {
  switch (dt) {
    case DType::Float64: return 1e-12;
    case DType::Float32: return 1e-5;
    case DType::Float16: return 2e-3;
    default: return 1.6e-2;
  }
}

void expect_matches_composed(Kind kind, const nn::Pool2dOptions& o, const Shape& s, DType dt, bool channels_last,
                             nn::Pair out = 1) {
  SCOPED_TRACE(std::string(kind == Kind::Max   ? "max"
                           : kind == Kind::Avg ? "avg"
                                               : "adaptive") +
               " " + std::string(dtype_name(dt)) + (channels_last ? " channels_last" : "") + " input [" +
               std::to_string(s[0]) + " " + std::to_string(s[1]) + " " + std::to_string(s[2]) + " " +
               std::to_string(s[3]) + "]");
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  // Distinct values within each plane (no ties), so the composed amax and the kernel's argmax route gradients
  // alike. 16-bit floats: the integers (37 i mod 256) - 128, exact in bfloat16 and distinct over any 256
  // consecutive elements (planes here hold fewer).
  std::vector<double> xv = uniform(n, -4, 4, 51);
  if (dt == DType::Float16 || dt == DType::BFloat16) {
    for (int64_t i = 0; i < n; ++i) xv[i] = static_cast<double>((i * 37) % 256 - 128);
  }
  xv = values(make(xv, {n}, {.dtype = dt}));
  const PoolRun got = run_pool(kind, o, out, xv, s, dt, Device::cuda(0), channels_last, 52);
  const PoolRun ref = run_pool(kind, o, out, xv, s, DType::Float64, Device::cpu(), false, 52);
  EXPECT_EQ(got.y.dtype(), dt);
  EXPECT_TRUE(got.y.is_contiguous(channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous));
  expect_close(got.y, ref.y, tol_for(dt), "output");
  expect_close(got.gx, ref.gx, tol_for(dt), "grad input");
}

class CudaPooling : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  }
};

const std::vector<nn::Pool2dOptions> kOptions = {
    {.kernel_size = 2},
    {.kernel_size = 3, .stride = 2, .padding = 1},
    {.kernel_size = 3, .stride = 1, .padding = 1},  // overlapping windows: gradients gather from 9 outputs
    {.kernel_size = 3, .stride = 2, .padding = 1, .ceil_mode = true},
    {.kernel_size = {2, 4}, .stride = nn::Pair(1, 3), .padding = {0, 2}},
    {.kernel_size = 2, .stride = nn::Pair(2, 3), .ceil_mode = true},
    {.kernel_size = 2, .stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false},
    {.kernel_size = 3, .stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false},
};

TEST_F(CudaPooling, MaxAndAvgMatchTheComposedPath) {
  for (size_t i = 0; i < kOptions.size(); ++i) {
    SCOPED_TRACE("options #" + std::to_string(i));
    for (bool cl : {false, true}) {
      for (Kind kind : {Kind::Max, Kind::Avg}) {
        expect_matches_composed(kind, kOptions[i], {2, 3, 7, 9}, DType::Float32, cl);
        expect_matches_composed(kind, kOptions[i], {1, 16, 6, 5}, DType::Float64, cl);
      }
    }
  }
}

TEST_F(CudaPooling, SixteenBitInputs) {
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    for (bool cl : {false, true}) {
      for (Kind kind : {Kind::Max, Kind::Avg}) expect_matches_composed(kind, kOptions[1], {2, 8, 9, 9}, dt, cl);
      expect_matches_composed(Kind::Adaptive, {}, {2, 8, 9, 7}, dt, cl, nn::Pair(4, 3));
    }
  }
}

TEST_F(CudaPooling, AdaptiveAvgMatchesTheComposedPathForUnevenSizes) {
  const std::vector<std::pair<Shape, nn::Pair>> cases = {
      {{2, 3, 7, 5}, nn::Pair(3, 2)}, {{1, 4, 10, 10}, nn::Pair(4, 4)}, {{2, 3, 5, 7}, nn::Pair(5, 7)},
      {{2, 5, 6, 6}, nn::Pair(1, 1)}, {{1, 2, 3, 3}, nn::Pair(5, 4)},   {{2, 16, 14, 14}, nn::Pair(7, 7)},
  };
  for (const auto& [shape, out] : cases) {
    for (bool cl : {false, true}) expect_matches_composed(Kind::Adaptive, {}, shape, DType::Float32, cl, out);
  }
}

TEST_F(CudaPooling, UnbatchedInputs) {
  const auto xv = uniform(3 * 6 * 6, -1, 1, 61);
  const Tensor xg = make(xv, {3, 6, 6}, {.device = Device::cuda(0)}), xc = make(xv, {3, 6, 6});
  const nn::Pool2dOptions o{.kernel_size = 3, .stride = 2, .padding = 1};
  expect_values(nn::max_pool2d(xg, o), {3, 3, 3}, values(nn::max_pool2d(xc, o)), 1e-6, 1e-6);
  expect_values(nn::avg_pool2d(xg, o), {3, 3, 3}, values(nn::avg_pool2d(xc, o)), 1e-6, 1e-6);
  expect_values(nn::adaptive_avg_pool2d(xg, {2, 4}), {3, 2, 4}, values(nn::adaptive_avg_pool2d(xc, {2, 4})), 1e-6,
                1e-6);
}

// PyTorch's tie rule, written out: the first window position (row-major) holding the maximum takes the gradient.
TEST_F(CudaPooling, MaxTiesGoToTheFirstMaximum) {
  // 3 channels take the one-element kernels; 8 float32 channels in channels-last take the 4-channel vectors.
  for (const int64_t c : {int64_t{3}, int64_t{8}}) {
  SCOPED_TRACE("channels " + std::to_string(c));
  const int64_t n = 2, h = 7, w = 8, k = 3, s = 2, p = 1;
  std::vector<double> xv = uniform(n * c * h * w, 0, 3, 71);
  for (double& v : xv) v = std::floor(v);  // values 0, 1, 2: many ties
  const int64_t oh = (h + 2 * p - k) / s + 1, ow = (w + 2 * p - k) / s + 1;
  const std::vector<double> gv = uniform(n * c * oh * ow, -1, 1, 72);
  std::vector<double> y_ref(gv.size()), gx_ref(xv.size(), 0.0);
  for (int64_t nc = 0; nc < n * c; ++nc)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t at = -1;
        for (int64_t r = i * s - p; r < i * s - p + k; ++r)
          for (int64_t q = j * s - p; q < j * s - p + k; ++q) {
            if (r < 0 || r >= h || q < 0 || q >= w) continue;
            const int64_t e = (nc * h + r) * w + q;
            if (xv[e] > best) best = xv[e], at = e;
          }
        const int64_t o = (nc * oh + i) * ow + j;
        y_ref[o] = best;
        gx_ref[at] += gv[o];
      }
  for (bool cl : {false, true}) {
    SCOPED_TRACE(cl ? "channels_last" : "NCHW");
    Tensor x = make(xv, {n, c, h, w}, {.device = Device::cuda(0)});
    if (cl) x = x.contiguous(MemoryFormat::ChannelsLast);
    x.requires_grad_();
    Tensor y = nn::max_pool2d(x, {.kernel_size = k, .stride = s, .padding = p});
    expect_values(y, {n, c, oh, ow}, y_ref, 0, 0);
    y.backward(make(gv, {n, c, oh, ow}, {.device = Device::cuda(0)}));
    expect_values(x.grad(), {n, c, h, w}, gx_ref, 1e-6, 1e-6);
  }
  }
}

TEST_F(CudaPooling, MaxPropagatesNaN) {
  std::vector<double> xv = uniform(16, -1, 1, 81);
  xv[5] = kNaN;  // in the top-left 2x2 window of (4, 4)
  const Tensor y = nn::max_pool2d(make(xv, {1, 1, 4, 4}, {.device = Device::cuda(0)}), {.kernel_size = 2});
  const std::vector<double> v = values(y);
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_FALSE(std::isnan(v[1]) || std::isnan(v[2]) || std::isnan(v[3]));
  // Channels-last with 4 float32 channels (the vector kernel): the NaN of channel 2 stays in channel 2.
  std::vector<double> xc = uniform(4 * 16, -1, 1, 82);
  xc[2 * 16 + 5] = kNaN;  // channel 2, position (1, 1)
  const Tensor yc = nn::max_pool2d(
      make(xc, {1, 4, 4, 4}, {.device = Device::cuda(0)}).contiguous(MemoryFormat::ChannelsLast), {.kernel_size = 2});
  const std::vector<double> vc = values(yc);  // (1, 4, 2, 2) in logical order
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(std::isnan(vc[static_cast<size_t>(i)]), i == 2 * 4) << "output " << i;
}

TEST_F(CudaPooling, ResNetStemShapeInChannelsLast) {
  // The 3x3, stride 2, padding 1 pool of ResNet's stem, 64 channels: the vector kernels in bf16 and float32.
  for (DType dt : {DType::BFloat16, DType::Float32})
    expect_matches_composed(Kind::Max, kOptions[1], {2, 64, 16, 14}, dt, true);
}

TEST_F(CudaPooling, GlobalAverageInChannelsLast) {
  // ResNet's head (output 1 x 1): the vector kernels of every floating dtype, one image and several, planes of 1
  // to 49 pixels; NCHW beside them through the generic kernel.
  for (DType dt : {DType::BFloat16, DType::Float16, DType::Float32, DType::Float64}) {
    for (const Shape& s : {Shape{2, 64, 7, 7}, Shape{3, 16, 4, 4}, Shape{1, 8, 1, 1}, Shape{2, 24, 3, 5}}) {
      expect_matches_composed(Kind::Adaptive, {}, s, dt, true, nn::Pair(1, 1));
      expect_matches_composed(Kind::Adaptive, {}, s, dt, false, nn::Pair(1, 1));
    }
  }
}

TEST_F(CudaPooling, NoNewCudaMallocOnceWarm) {
  const auto xv = uniform(4 * 16 * 12 * 12, -1, 1, 91);
  auto step = [&] {
    for (Kind kind : {Kind::Max, Kind::Avg, Kind::Adaptive})
      run_pool(kind, kOptions[1], nn::Pair(3, 5), xv, {4, 16, 12, 12}, DType::Float32, Device::cuda(0), true, 92);
  };
  step();  // warm-up
  const int64_t mallocs = cuda::memory_stats(0).num_device_mallocs;
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(cuda::memory_stats(0).num_device_mallocs, mallocs);
}

}  // namespace
}  // namespace kiln::testing
