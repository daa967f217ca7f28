// nn::conv2d's cuDNN path (kiln/layers/cuda/conv_cudnn.*) against the CPU composed path in float64: outputs
// and the input, weight and bias gradients for stride, padding, dilation, groups (depthwise too), bias or
// none, non-square and 1x1 kernels, NCHW and channels-last inputs (formats of the output and gradients
// checked), non-contiguous and unbatched inputs, float32 with TF32 off (tight) and on (loose), float64,
// float16 and bfloat16 (loose); autocast; benchmark mode; no cudaMalloc once the algorithms are cached; bad
// input. The CPU float64 path is itself checked against a plain double loop in test_conv.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/autograd/autocast.h"  // autocast::Guard
#include "kiln/layers/conv.h"
#include "kiln/layers/cuda/conv_cudnn_graph.h"  // nn::cuda_impl::set_conv2d_graph_api, conv2d_graph_passes_run
#include "kiln/layers/window_internal.h"        // nn::detail::space_to_depth_input
#include "kiln/tensor/cuda.h"                   // cuda::is_available, allow_tf32, memory_stats
#include "support/test_support.h"

// The CUDA layer internals these tests call (nn::cuda_impl) exist only in a CUDA build.
#if KILN_TEST_CUDA
namespace kiln::testing {
namespace {

class CudaConvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    previous_tf32_ = cuda::allow_tf32();
    previous_benchmark_ = nn::cudnn_benchmark();
    previous_graph_api_ = nn::cuda_impl::conv2d_graph_api();
  }
  void TearDown() override {
    if (!cuda::is_available()) return;
    cuda::set_allow_tf32(previous_tf32_);
    nn::set_cudnn_benchmark(previous_benchmark_);
    nn::cuda_impl::set_conv2d_graph_api(previous_graph_api_);
  }

 private:
  bool previous_tf32_ = true;
  bool previous_benchmark_ = false;
  bool previous_graph_api_ = true;
};

struct ConvCase {
  std::string name;
  Shape x, w;  // (N, C_in, H, W), (C_out, C_in / groups, KH, KW)
  nn::Conv2dOptions o;
};

// Small shapes for every option, and one with channels in multiples of 8, where cuDNN picks tensor-core
// kernels (NHWC ones for channels-last).
std::vector<ConvCase> cases() {
  return {
      {"3x3 padding 1", {2, 3, 9, 8}, {4, 3, 3, 3}, {.padding = 1}},
      {"stride, dilation, non-square kernel, no bias",
       {2, 3, 9, 8},
       {5, 3, 3, 2},
       {.stride = {2, 1}, .padding = {1, 2}, .dilation = {2, 3}, .bias = false}},
      {"groups 2", {2, 4, 7, 6}, {6, 2, 3, 3}, {.stride = 2, .padding = 1, .groups = 2}},
      {"depthwise", {2, 8, 6, 6}, {8, 1, 3, 3}, {.padding = 1, .groups = 8}},
      {"depthwise, two outputs per channel", {1, 3, 5, 5}, {6, 1, 3, 1}, {.padding = {1, 0}, .groups = 3}},
      {"1x1", {2, 16, 5, 5}, {8, 16, 1, 1}, {}},
      {"1x1 stride 2, no bias", {2, 8, 6, 7}, {4, 8, 1, 1}, {.stride = 2, .bias = false}},
      {"kernel as large as the input", {2, 2, 4, 3}, {3, 2, 4, 3}, {}},
      {"32 -> 64 channels", {4, 32, 12, 12}, {64, 32, 3, 3}, {.padding = 1}},
  };
}

struct Tolerance {
  double rtol, atol;
};
// Outputs sum up to 288 products of values in [-1, 1] (magnitudes up to ~10), weight gradients up to 576.
// Full float32: tight enough that TF32 (inputs rounded to 10 mantissa bits, errors ~5e-3 here) would fail,
// loose enough for cuDNN's FFT and Winograd algorithms.
constexpr Tolerance kFloat32Values{1e-4, 1e-4}, kFloat32Grads{1e-4, 1e-3};
constexpr Tolerance kTF32Values{1e-2, 2e-2}, kTF32Grads{1e-2, 1e-1};
constexpr Tolerance kFloat64{1e-10, 1e-10};
// Both sides start from the same 16-bit inputs; the GPU accumulates in float32 and rounds its results to
// float16 (relative 5e-4) or bfloat16 (4e-3).
constexpr Tolerance kFloat16Values{1e-2, 2e-2}, kFloat16Grads{1e-2, 5e-2};
constexpr Tolerance kBFloat16Values{2e-2, 5e-2}, kBFloat16Grads{2e-2, 2e-1};

// The tensors of one run: inputs, output and gradients.
struct ConvRun {
  Tensor x, w, b, y, grad_output;
};

// conv2d forward and backward (with grad_output) on tensors made in `dtype` on `device` from the same
// deterministic values. `channels_last_x` / `channels_last_w` lay the input / weight out as NHWC;
// `non_contiguous` gives the input as a strided view.
ConvRun run_conv(const ConvCase& c, Device device, DType dtype, bool channels_last_x, bool channels_last_w = false,
                 bool non_contiguous_x = false) {
  const TensorOptions o{.dtype = dtype, .device = device};
  ConvRun r;
  r.x = make(uniform(numel(c.x), -1, 1, 1), c.x, o);
  if (channels_last_x) r.x = r.x.contiguous(MemoryFormat::ChannelsLast);
  if (non_contiguous_x) r.x = non_contiguous(r.x);
  r.x.requires_grad_();
  r.w = make(uniform(numel(c.w), -1, 1, 2), c.w, o);
  if (channels_last_w) r.w = r.w.contiguous(MemoryFormat::ChannelsLast);
  r.w.requires_grad_();
  if (c.o.bias) r.b = make(uniform(c.w[0], -1, 1, 3), {c.w[0]}, o).requires_grad_();
  r.y = nn::conv2d(r.x, r.w, r.b, c.o);
  r.grad_output = make(uniform(r.y.numel(), -1, 1, 4), r.y.shape(), o);
  r.y.backward(r.grad_output);
  return r;
}

// A tensor's values as a float64 CPU tensor (no autograd history), for the references.
Tensor host(const Tensor& t) { return t.detach().to(Device::cpu(), DType::Float64).contiguous(); }

// The same run on the CPU in float64 from the GPU run's values (already rounded to its dtype), so the
// comparison measures the computation alone.
ConvRun reference(const ConvCase& c, const ConvRun& gpu) {
  ConvRun r;
  r.x = host(gpu.x).requires_grad_();
  r.w = host(gpu.w).requires_grad_();
  if (gpu.b.defined()) r.b = host(gpu.b).requires_grad_();
  r.y = nn::conv2d(r.x, r.w, r.b, c.o);
  r.grad_output = host(gpu.grad_output);
  r.y.backward(r.grad_output);
  return r;
}

void expect_close(const Tensor& actual, const Tensor& expected, Tolerance tol, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(actual.defined());
  ASSERT_TRUE(expected.defined());
  expect_values(actual, expected.shape(), values(expected), tol.rtol, tol.atol);
}

// Forward and gradients of one case on the GPU against the CPU in float64; formats and dtypes checked.
void expect_case_matches(const ConvCase& c, DType dtype, bool channels_last, Tolerance values_tol,
                         Tolerance grads_tol) {
  SCOPED_TRACE(c.name + (channels_last ? " (channels-last)" : " (NCHW)"));
  const ConvRun gpu = run_conv(c, Device::cuda(0), dtype, channels_last);
  const ConvRun ref = reference(c, gpu);
  EXPECT_EQ(gpu.y.device(), Device::cuda(0));
  EXPECT_EQ(gpu.y.dtype(), dtype);
  // Channels-last inputs give channels-last outputs unless the output is also plainly contiguous.
  if (channels_last && gpu.x.suggest_memory_format() == MemoryFormat::ChannelsLast) {
    EXPECT_TRUE(gpu.y.is_contiguous(MemoryFormat::ChannelsLast));
  } else {
    EXPECT_TRUE(gpu.y.is_contiguous());
  }
  expect_close(gpu.y, ref.y, values_tol, "output");
  expect_close(gpu.x.grad(), ref.x.grad(), grads_tol, "grad_input");
  expect_close(gpu.w.grad(), ref.w.grad(), grads_tol, "grad_weight");
  EXPECT_EQ(gpu.x.grad().dtype(), dtype);
  EXPECT_EQ(gpu.w.grad().dtype(), dtype);
  if (c.o.bias) {
    expect_close(gpu.b.grad(), ref.b.grad(), grads_tol, "grad_bias");
  } else {
    EXPECT_FALSE(gpu.b.defined());
  }
}

void expect_all_cases_match(DType dtype, Tolerance values_tol, Tolerance grads_tol) {
  for (const ConvCase& c : cases()) {
    for (bool channels_last : {false, true}) expect_case_matches(c, dtype, channels_last, values_tol, grads_tol);
  }
}

TEST_F(CudaConvTest, Float32WithoutTF32MatchesFloat64OnCpu) {
  cuda::set_allow_tf32(false);
  expect_all_cases_match(DType::Float32, kFloat32Values, kFloat32Grads);
}

TEST_F(CudaConvTest, Float32WithTF32IsCloseToFloat64) {
  cuda::set_allow_tf32(true);
  expect_all_cases_match(DType::Float32, kTF32Values, kTF32Grads);
}

TEST_F(CudaConvTest, Float64MatchesFloat64OnCpu) { expect_all_cases_match(DType::Float64, kFloat64, kFloat64); }

TEST_F(CudaConvTest, Float16IsCloseToFloat64) { expect_all_cases_match(DType::Float16, kFloat16Values, kFloat16Grads); }

TEST_F(CudaConvTest, BFloat16IsCloseToFloat64) {
  expect_all_cases_match(DType::BFloat16, kBFloat16Values, kBFloat16Grads);
}

TEST_F(CudaConvTest, GradientFormatsFollowInputAndWeight) {
  cuda::set_allow_tf32(false);
  const ConvCase c{"3x3", {2, 8, 6, 5}, {4, 8, 3, 3}, {.padding = 1}};
  // Channels-last input and weight (a model moved with to(dev, ChannelsLast)): everything channels-last.
  {
    const ConvRun gpu =
        run_conv(c, Device::cuda(0), DType::Float32, /*channels_last_x=*/true, /*channels_last_w=*/true);
    EXPECT_TRUE(gpu.y.is_contiguous(MemoryFormat::ChannelsLast));
    EXPECT_TRUE(gpu.x.grad().is_contiguous(MemoryFormat::ChannelsLast));
    EXPECT_TRUE(gpu.w.grad().is_contiguous(MemoryFormat::ChannelsLast));
    const ConvRun ref = reference(c, gpu);
    expect_close(gpu.y, ref.y, kFloat32Values, "output");
    expect_close(gpu.w.grad(), ref.w.grad(), kFloat32Grads, "grad_weight");
  }
  // Channels-last input, NCHW weight: the weight is used as a channels-last copy, but its gradient comes back
  // in the weight's own layout.
  {
    const ConvRun gpu =
        run_conv(c, Device::cuda(0), DType::Float32, /*channels_last_x=*/true, /*channels_last_w=*/false);
    EXPECT_TRUE(gpu.y.is_contiguous(MemoryFormat::ChannelsLast));
    EXPECT_TRUE(gpu.x.grad().is_contiguous(MemoryFormat::ChannelsLast));
    EXPECT_TRUE(gpu.w.grad().is_contiguous());
    const ConvRun ref = reference(c, gpu);
    expect_close(gpu.w.grad(), ref.w.grad(), kFloat32Grads, "grad_weight");
    expect_close(gpu.x.grad(), ref.x.grad(), kFloat32Grads, "grad_input");
  }
  // NCHW input, channels-last weight: the computation is NCHW; the weight's gradient is channels-last.
  {
    const ConvRun gpu =
        run_conv(c, Device::cuda(0), DType::Float32, /*channels_last_x=*/false, /*channels_last_w=*/true);
    EXPECT_TRUE(gpu.y.is_contiguous());
    EXPECT_TRUE(gpu.w.grad().is_contiguous(MemoryFormat::ChannelsLast));
    const ConvRun ref = reference(c, gpu);
    expect_close(gpu.y, ref.y, kFloat32Values, "output");
    expect_close(gpu.w.grad(), ref.w.grad(), kFloat32Grads, "grad_weight");
  }
}

// A bf16 channels-last stride-2 first layer on 3 channels whose input needs no gradient runs over the input's 2 x 2
// blocks (nn::detail::space_to_depth_conv2d): the output and the weight's and bias's gradients against float64 on the
// CPU, at ResNet's stem geometry and at an even kernel; with the input needing a gradient, the plain path.
TEST_F(CudaConvTest, StridedFirstLayerOverTheInputsBlocksMatchesFloat64) {
  const ConvCase stem_cases[] = {
      {"7x7 stride 2 on 3 channels", {2, 3, 17, 16}, {8, 3, 7, 7}, {.stride = 2, .padding = 3, .bias = false}},
      {"4x4 stride 2 on 3 channels, bias", {3, 3, 12, 10}, {16, 3, 4, 4}, {.stride = 2, .padding = 1}},
  };
  for (const ConvCase& c : stem_cases) {
    SCOPED_TRACE(c.name);
    const TensorOptions o{.dtype = DType::BFloat16, .device = Device::cuda(0)};
    const Tensor x = make(uniform(numel(c.x), -1, 1, 1), c.x, o).contiguous(MemoryFormat::ChannelsLast);
    Tensor w = make(uniform(numel(c.w), -1, 1, 2), c.w, o).contiguous(MemoryFormat::ChannelsLast).requires_grad_();
    Tensor b = c.o.bias ? make(uniform(c.w[0], -1, 1, 3), {c.w[0]}, o).requires_grad_() : Tensor();
    const Tensor y = nn::conv2d(x, w, b, c.o);
    EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast));
    const Tensor dy = make(uniform(y.numel(), -1, 1, 4), y.shape(), o);
    y.backward(dy);
    EXPECT_FALSE(x.grad().defined());
    Tensor wr = host(w).requires_grad_(), br = c.o.bias ? host(b).requires_grad_() : Tensor();
    const Tensor yr = nn::conv2d(host(x), wr, br, c.o);
    yr.backward(host(dy));
    expect_close(y, yr, kBFloat16Values, "output");
    expect_close(w.grad(), wr.grad(), kBFloat16Grads, "grad_weight");
    if (c.o.bias) expect_close(b.grad(), br.grad(), kBFloat16Grads, "grad_bias");
  }
}

// The blocks of the space-to-depth form are made in one kernel on the GPU (cuda/space_to_depth.h): bit for bit the
// blocks the CPU makes with a zero fill and strided copies, for each input channel count, odd and even sizes, every
// padding the form takes, block channels that fill whole 16-byte vectors and ones that do not, and 2-, 4- and 8-byte
// dtypes.
TEST_F(CudaConvTest, SpaceToDepthBlocksOnTheGpuAreTheCpusBitForBit) {
  struct Case {
    int64_t n, c, h, w, pad_h, pad_w, channels;
  };
  const Case cases[] = {{2, 3, 17, 16, 3, 3, 16}, {3, 3, 12, 10, 1, 1, 12}, {1, 1, 9, 9, 1, 0, 4},
                        {2, 4, 8, 6, 0, 0, 16},   {1, 2, 5, 7, 2, 3, 10},   {1, 3, 1, 1, 0, 1, 16}};
  for (const DType dtype : {DType::BFloat16, DType::Float16, DType::Float32, DType::Float64}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << dtype << " input " << c.c << " x " << c.h << " x " << c.w << ", padding "
                                        << c.pad_h << ", " << c.pad_w << ", " << c.channels << " channels");
      const Shape shape{c.n, c.c, c.h, c.w};
      const Tensor x = make(uniform(numel(shape), -4, 4, 7), shape, {.dtype = dtype, .device = Device::cuda(0)})
                           .contiguous(MemoryFormat::ChannelsLast);
      const Tensor gpu = nn::detail::space_to_depth_input(x, {c.pad_h, c.pad_w}, c.channels);
      const Tensor cpu = nn::detail::space_to_depth_input(x.to(Device::cpu()), {c.pad_h, c.pad_w}, c.channels);
      ASSERT_EQ(gpu.shape(), cpu.shape());
      EXPECT_TRUE(gpu.is_contiguous(MemoryFormat::ChannelsLast));
      EXPECT_EQ(gpu.dtype(), dtype);
      const Tensor g = gpu.to(Device::cpu()).to(DType::Float64).contiguous(), r = cpu.to(DType::Float64).contiguous();
      EXPECT_EQ(max(abs(sub(g, r))).item<double>(), 0.0);
      // The padding channels and the padded border are zeros, and every input value is somewhere in the blocks.
      const double total = sum(abs(x.to(Device::cpu(), DType::Float64))).item<double>();
      EXPECT_NEAR(sum(abs(g)).item<double>(), total, 1e-12 * total);
    }
  }
}

TEST_F(CudaConvTest, NonContiguousInput) {
  cuda::set_allow_tf32(false);
  const ConvCase c{"strided view", {2, 4, 7, 6}, {6, 2, 3, 3}, {.stride = 2, .padding = 1, .groups = 2}};
  const ConvRun gpu = run_conv(c, Device::cuda(0), DType::Float32, false, false, /*non_contiguous_x=*/true);
  ASSERT_FALSE(gpu.x.is_contiguous());
  const ConvRun ref = reference(c, gpu);
  expect_close(gpu.y, ref.y, kFloat32Values, "output");
  expect_close(gpu.x.grad(), ref.x.grad(), kFloat32Grads, "grad_input");
  expect_close(gpu.w.grad(), ref.w.grad(), kFloat32Grads, "grad_weight");
}

TEST_F(CudaConvTest, UnbatchedInputGivesAnUnbatchedOutput) {
  cuda::set_allow_tf32(false);
  const TensorOptions o{.device = Device::cuda(0)};
  Tensor x = make(uniform(3 * 6 * 5, -1, 1, 21), {3, 6, 5}, o).requires_grad_();
  Tensor w = make(uniform(2 * 3 * 3 * 3, -1, 1, 22), {2, 3, 3, 3}, o).requires_grad_();
  Tensor y = nn::conv2d(x, w, {}, {.padding = 1});
  ASSERT_EQ(y.shape(), (Shape{2, 6, 5}));
  y.sum().backward();
  Tensor xc = x.detach().to(Device::cpu(), DType::Float64).requires_grad_();
  Tensor wc = w.detach().to(Device::cpu(), DType::Float64).requires_grad_();
  Tensor yc = nn::conv2d(xc, wc, {}, {.padding = 1});
  yc.sum().backward();
  expect_close(y, yc, kFloat32Values, "output");
  expect_close(x.grad(), xc.grad(), kFloat32Grads, "grad_input");
  expect_close(w.grad(), wc.grad(), kFloat32Grads, "grad_weight");
}

TEST_F(CudaConvTest, GradientsOnlyWhereNeeded) {
  cuda::set_allow_tf32(false);
  const TensorOptions o{.device = Device::cuda(0)};
  const Tensor xv = make(uniform(2 * 3 * 5 * 5, -1, 1, 31), {2, 3, 5, 5}, o);
  const Tensor wv = make(uniform(4 * 3 * 3 * 3, -1, 1, 32), {4, 3, 3, 3}, o);
  const Tensor bv = make(uniform(4, -1, 1, 33), {4}, o);
  const Tensor xr = xv.to(Device::cpu(), DType::Float64), wr = wv.to(Device::cpu(), DType::Float64);
  // Only the input requires grad (a frozen layer): backward-data alone.
  {
    Tensor x = xv.detach().requires_grad_();
    Tensor y = nn::conv2d(x, wv, bv, {.padding = 1});
    ASSERT_TRUE(y.requires_grad());
    y.sum().backward();
    Tensor xc = xr.detach().requires_grad_();
    nn::conv2d(xc, wr, bv.to(Device::cpu(), DType::Float64), {.padding = 1}).sum().backward();
    expect_close(x.grad(), xc.grad(), kFloat32Grads, "grad_input");
  }
  // Only the weight (the first layer of a network): backward-filter alone.
  {
    Tensor w = wv.detach().requires_grad_();
    nn::conv2d(xv, w, {}, {.padding = 1}).sum().backward();
    Tensor wc = wr.detach().requires_grad_();
    nn::conv2d(xr, wc, {}, {.padding = 1}).sum().backward();
    expect_close(w.grad(), wc.grad(), kFloat32Grads, "grad_weight");
  }
  // Only the bias: the sum of grad_output over N, H, W (here 2 * 5 * 5 = 50 for each channel).
  {
    Tensor b = bv.detach().requires_grad_();
    nn::conv2d(xv, wv, b, {.padding = 1}).sum().backward();
    expect_values(b.grad(), {4}, {50, 50, 50, 50}, 1e-6, 1e-6);
  }
  // Nothing requires grad: no graph.
  EXPECT_FALSE(nn::conv2d(xv, wv, bv, {.padding = 1}).requires_grad());
}

TEST_F(CudaConvTest, AutocastRunsInTheLowerPrecision) {
  const ConvCase c{"autocast", {2, 16, 8, 8}, {32, 16, 3, 3}, {.padding = 1}};
  for (DType half : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(std::string("autocast to ") + std::string(dtype_name(half)));
    const TensorOptions o{.device = Device::cuda(0)};  // float32 parameters and input, as in mixed-precision training
    Tensor x = make(uniform(numel(c.x), -1, 1, 41), c.x, o).requires_grad_();
    Tensor w = make(uniform(numel(c.w), -1, 1, 42), c.w, o).requires_grad_();
    Tensor b = make(uniform(c.w[0], -1, 1, 43), {c.w[0]}, o).requires_grad_();
    Tensor y;
    {
      autocast::Guard cast(DeviceType::CUDA, half);
      y = nn::conv2d(x, w, b, c.o);
    }
    EXPECT_EQ(y.dtype(), half);
    y.sum().backward();
    // Gradients reach the float32 leaves in float32.
    EXPECT_EQ(x.grad().dtype(), DType::Float32);
    EXPECT_EQ(w.grad().dtype(), DType::Float32);
    EXPECT_EQ(b.grad().dtype(), DType::Float32);
    // Against float64 on the CPU from the inputs rounded to the autocast dtype.
    auto rounded = [&](const Tensor& t) { return t.detach().to(half).to(Device::cpu(), DType::Float64); };
    Tensor xc = rounded(x).requires_grad_(), wc = rounded(w).requires_grad_(), bc = rounded(b).requires_grad_();
    Tensor yc = nn::conv2d(xc, wc, bc, c.o);
    yc.sum().backward();
    expect_close(y, yc, kBFloat16Values, "output");
    expect_close(x.grad(), xc.grad(), kBFloat16Grads, "grad_input");
    expect_close(w.grad(), wc.grad(), kBFloat16Grads, "grad_weight");
    expect_close(b.grad(), bc.grad(), kBFloat16Grads, "grad_bias");
  }
  // Outside the guard float32 stays float32.
  Tensor x = make(uniform(numel(c.x), -1, 1, 41), c.x, {.device = Device::cuda(0)});
  Tensor w = make(uniform(numel(c.w), -1, 1, 42), c.w, {.device = Device::cuda(0)});
  EXPECT_EQ(nn::conv2d(x, w, {}, c.o).dtype(), DType::Float32);
}

TEST_F(CudaConvTest, BenchmarkModeGivesTheSameValues) {
  cuda::set_allow_tf32(false);
  nn::set_cudnn_benchmark(true);
  EXPECT_TRUE(nn::cudnn_benchmark());
  expect_all_cases_match(DType::Float32, kFloat32Values, kFloat32Grads);
  // Half precision too: the timed algorithms include the tensor-core ones.
  for (const ConvCase& c : cases())
    expect_case_matches(c, DType::Float16, /*channels_last=*/true, kFloat16Values, kFloat16Grads);
  nn::set_cudnn_benchmark(false);
  EXPECT_FALSE(nn::cudnn_benchmark());
}

// Half-precision convolutions go through cuDNN's graph API (conv_cudnn_graph.h): every ungrouped case of both
// formats runs its three passes there, heuristics' plan and timed plan alike, and matches the float64 reference;
// grouped ones stay on the legacy API. With the graph API turned off every pass takes the legacy API, with the same
// results against the reference.
TEST_F(CudaConvTest, HalfPrecisionTakesTheGraphApi) {
  if (!nn::cuda_impl::conv2d_graph_api_compiled()) GTEST_SKIP() << "kiln was built without cudnn-frontend";
  nn::cuda_impl::set_conv2d_graph_api(true);
  for (bool benchmark : {false, true}) {
    nn::set_cudnn_benchmark(benchmark);
    SCOPED_TRACE(benchmark ? "benchmark mode" : "heuristics");
    for (const ConvCase& c : cases()) {
      for (bool channels_last : {false, true}) {
        const int64_t before = nn::cuda_impl::conv2d_graph_passes_run();
        expect_case_matches(c, DType::BFloat16, channels_last, kBFloat16Values, kBFloat16Grads);
        expect_case_matches(c, DType::Float16, channels_last, kFloat16Values, kFloat16Grads);
        const int64_t ran = nn::cuda_impl::conv2d_graph_passes_run() - before;
        SCOPED_TRACE(c.name + (channels_last ? " (channels-last)" : " (NCHW)"));
        if (c.o.groups != 1 || (c.name == "1x1" && channels_last)) {
          EXPECT_EQ(ran, 0);  // grouped: the legacy API; 1x1 of a channels-last input: a matrix product (nn::linear)
        } else if (c.x[1] % 8 == 0 && c.w[0] % 8 == 0) {
          EXPECT_EQ(ran, 2 * 3);  // channels in multiples of 8: the graph API's tensor-core engines take all three
        } else {
          EXPECT_LE(ran, 2 * 3);  // odd channel counts: passes the graph API has no engine for take the legacy API
        }
      }
    }
  }
  nn::cuda_impl::set_conv2d_graph_api(false);
  nn::set_cudnn_benchmark(false);
  const int64_t before = nn::cuda_impl::conv2d_graph_passes_run();
  expect_all_cases_match(DType::Float16, kFloat16Values, kFloat16Grads);
  expect_all_cases_match(DType::BFloat16, kBFloat16Values, kBFloat16Grads);
  EXPECT_EQ(nn::cuda_impl::conv2d_graph_passes_run(), before);
}

// In benchmark mode a CUDA graph capture takes the plans the eager steps before it timed (timing inside a capture
// would synchronise the device): capturing a step already run eagerly builds no graph, and its replay gives the eager
// step's output bit for bit. A problem first met inside a capture gets the heuristics' plan there, and is timed when
// met again outside one.
TEST_F(CudaConvTest, GraphCaptureTakesThePlansTimedBeforeIt) {
  if (!nn::cuda_impl::conv2d_graph_api_compiled()) GTEST_SKIP() << "kiln was built without cudnn-frontend";
  nn::cuda_impl::set_conv2d_graph_api(true);
  nn::set_cudnn_benchmark(true);
  const TensorOptions o{.dtype = DType::BFloat16, .device = Device::cuda(0)};
  auto make_step = [&](int64_t hw, uint64_t seed, Tensor& y) {
    const Shape xs{4, 16, hw, hw}, ws{32, 16, 3, 3}, ys{4, 32, hw, hw};
    Tensor x = make(uniform(numel(xs), -1, 1, seed), xs, o).contiguous(MemoryFormat::ChannelsLast).requires_grad_();
    Tensor w = make(uniform(numel(ws), -1, 1, seed + 1), ws, o).requires_grad_();
    Tensor gy = make(uniform(numel(ys), -1, 1, seed + 2), ys, o).contiguous(MemoryFormat::ChannelsLast);
    return [x, w, gy, &y] {
      y = nn::conv2d(x, w, {}, {.padding = 1, .bias = false});
      y.backward(gy);
    };
  };
  Tensor y;
  auto step = make_step(8, 51, y);
  step();  // eager: the three passes' graphs built and their plans timed
  cuda::synchronize();
  const Tensor y_eager = y.detach().clone();
  int64_t built = nn::cuda_impl::conv2d_graph_plans_built();
  const int64_t ran = nn::cuda_impl::conv2d_graph_passes_run();
  cuda::Graph graph;
  graph.capture(step, /*warmup=*/0);
  EXPECT_EQ(nn::cuda_impl::conv2d_graph_plans_built(), built);
  EXPECT_EQ(nn::cuda_impl::conv2d_graph_passes_run(), ran + 3);
  graph.replay();
  cuda::synchronize();
  expect_values(y.detach(), y_eager.shape(), values(y_eager), 0, 0);

  // A new shape, first inside a capture: the heuristics' plans (three graphs); then eagerly: timed ones (three more).
  Tensor y2;
  auto step2 = make_step(6, 61, y2);
  cuda::Graph graph2;
  graph2.capture(step2, /*warmup=*/0);
  EXPECT_EQ(nn::cuda_impl::conv2d_graph_plans_built(), built + 3);
  graph2.replay();
  step2();
  cuda::synchronize();
  EXPECT_EQ(nn::cuda_impl::conv2d_graph_plans_built(), built + 6);
}

// A problem for the fused cuDNN graphs' tests: x (N, C_in, H, W), w (C_out, C_in, KH, KW) and the geometry.
struct GraphProblem {
  Shape x, w;
  nn::cuda_impl::ConvGeometry g;
  Shape y() const {  // (N, C_out, OH, OW)
    return {x[0], w[0], (x[2] + 2 * g.padding[0] - w[2]) / g.stride[0] + 1,
            (x[3] + 2 * g.padding[1] - w[3]) / g.stride[1] + 1};
  }
  nn::Conv2dOptions options() const {
    return {.stride = {g.stride[0], g.stride[1]}, .padding = {g.padding[0], g.padding[1]}, .bias = false};
  }
};
// A stride-1 and a strided 3x3 problem.
const std::vector<GraphProblem> kGraphProblems{{{8, 64, 16, 16}, {64, 64, 3, 3}, {.padding = {1, 1}}},
                                               {{4, 32, 9, 9}, {48, 32, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}}};

// The forward pass with its channel sums (cuDNN's convolution + statistics graph; float16 only on the H200 with cuDNN
// 9, bfloat16 checked to be refused cleanly where it has no engine): y as the float64 reference, and
// each channel's sum and sum of squares within the rounding of y to its 16-bit type (2^-8 of the magnitudes summed,
// plus float32 accumulation). The sums' tensors start as NaN, so an engine that added to them instead of writing them
// fails here.
TEST_F(CudaConvTest, ForwardWithChannelSumsGivesTheOutputsSums) {
  if (!nn::cuda_impl::conv2d_graph_api_compiled()) GTEST_SKIP() << "kiln was built without cudnn-frontend";
  nn::cuda_impl::set_conv2d_graph_api(true);
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    for (const GraphProblem& p : kGraphProblems) {
      SCOPED_TRACE(::kiln::detail::str_cat(dtype, " x ", p.x, " w ", p.w));
      const TensorOptions o{.dtype = dtype, .device = Device::cuda(0)};
      const Tensor x = make(uniform(numel(p.x), -1, 1, 71), p.x, o).contiguous(MemoryFormat::ChannelsLast);
      const Tensor w = make(uniform(numel(p.w), -1, 1, 72), p.w, o).contiguous(MemoryFormat::ChannelsLast);
      const int64_t c = p.w[0];
      const Shape y_shape = p.y();
      const Tensor y = empty(y_shape, o).contiguous(MemoryFormat::ChannelsLast);
      const TensorOptions f32{.dtype = DType::Float32, .device = Device::cuda(0)};
      const nn::cuda_impl::ConvChannelSums sums{full({c}, std::nan(""), f32), full({c}, std::nan(""), f32)};
      std::string why_not;
      const bool ran =
          nn::cuda_impl::conv2d_graph_forward_with_sums(x, w, y, sums, p.g, /*channels_last=*/true, &why_not);
      if (dtype == DType::BFloat16 && !ran) {
        // cuDNN 9 has no bfloat16 engine for this graph on the H200 (its statistics node refuses the data type): the
        // call must then say so and leave the sums alone.
        EXPECT_NE(why_not.find("NOT_SUPPORTED"), std::string::npos) << why_not;
        EXPECT_TRUE(std::isnan(values(sums.sum)[0]));
        continue;
      }
      ASSERT_TRUE(ran) << "cuDNN offered no engine for the convolution + statistics graph: " << why_not;

      const Tensor y64 = nn::conv2d(host(x), host(w), {}, p.options());
      expect_close(y, y64, dtype == DType::BFloat16 ? kBFloat16Values : kFloat16Values, "output");
      const std::vector<double> ref = values(y64);  // NCHW order
      const int64_t plane = y_shape[2] * y_shape[3];
      std::vector<double> sum(c, 0.0), sum_sq(c, 0.0), sum_abs(c, 0.0);
      for (size_t i = 0; i < ref.size(); ++i) {
        const int64_t ch = (static_cast<int64_t>(i) / plane) % c;
        sum[ch] += ref[i];
        sum_sq[ch] += ref[i] * ref[i];
        sum_abs[ch] += std::abs(ref[i]);
      }
      const std::vector<double> got_sum = values(sums.sum), got_sq = values(sums.sum_of_squares);
      for (int64_t ch = 0; ch < c; ++ch) {
        EXPECT_NEAR(got_sum[ch], sum[ch], sum_abs[ch] / 256 + 1e-3) << "sum of channel " << ch;
        EXPECT_NEAR(got_sq[ch], sum_sq[ch], sum_sq[ch] / 128 + 1e-3) << "sum of squares of channel " << ch;
      }
    }
  }
}

// The backward-data pass added into a gradient sum in one cuDNN graph: sum + dx against the float64 reference (dx by
// the CPU's float64 convolution), within one rounding of the result to its 16-bit type; and the same through
// nn::conv2d's backward, where the engine offers the node the sum the other path's gradient began (a residual block's
// input; nn::conv2d takes the graph for stride 1 and for 1x1 kernels, a separate addition otherwise).
TEST_F(CudaConvTest, BackwardDataAccumulateAddsIntoTheSum) {
  if (!nn::cuda_impl::conv2d_graph_api_compiled()) GTEST_SKIP() << "kiln was built without cudnn-frontend";
  nn::cuda_impl::set_conv2d_graph_api(true);
  std::vector<GraphProblem> problems = kGraphProblems;
  problems.push_back({{4, 32, 8, 8}, {64, 32, 1, 1}, {.stride = {2, 2}}});  // and a strided 1x1 one
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    const Tolerance tol = dtype == DType::BFloat16 ? kBFloat16Grads : kFloat16Grads;
    for (const GraphProblem& p : problems) {
      SCOPED_TRACE(::kiln::detail::str_cat(dtype, " x ", p.x, " w ", p.w));
      const TensorOptions o{.dtype = dtype, .device = Device::cuda(0)};
      const Shape y_shape = p.y();
      const Tensor w = make(uniform(numel(p.w), -1, 1, 81), p.w, o).contiguous(MemoryFormat::ChannelsLast);
      const Tensor dy = make(uniform(numel(y_shape), -1, 1, 82), y_shape, o).contiguous(MemoryFormat::ChannelsLast);
      const Tensor sum0 = make(uniform(numel(p.x), -4, 4, 83), p.x, o).contiguous(MemoryFormat::ChannelsLast);
      const nn::Conv2dOptions co = p.options();
      // The float64 reference: sum + dx.
      Tensor x64 = zeros(p.x, {.dtype = DType::Float64}).requires_grad_();
      nn::conv2d(x64, host(w), {}, co).backward(host(dy));
      const Tensor want = host(sum0) + x64.grad();

      const Tensor sum = sum0.clone(MemoryFormat::ChannelsLast);
      std::string why_not;
      const int64_t before = nn::cuda_impl::conv2d_graph_accumulations_run();
      ASSERT_TRUE(
          nn::cuda_impl::conv2d_graph_backward_data_accumulate(sum, w, dy, p.g, /*channels_last=*/true, &why_not))
          << "cuDNN offered no engine for the backward-data + add graph: " << why_not;
      EXPECT_EQ(nn::cuda_impl::conv2d_graph_accumulations_run(), before + 1);
      EXPECT_TRUE(sum.is_contiguous(MemoryFormat::ChannelsLast));
      expect_close(sum, want, tol, "sum + dx");

      // Through autograd: the convolution's node finds the shortcut's gradient (sum0, through a multiplication by 1)
      // begun for x, with the convolution made before the shortcut and after it (the engine runs it last either way).
      for (bool conv_first : {true, false}) {
        SCOPED_TRACE(conv_first ? "convolution made first" : "shortcut made first");
        Tensor x = zeros(p.x, o).contiguous(MemoryFormat::ChannelsLast).requires_grad_();
        Tensor y, shortcut;
        if (conv_first) {
          y = nn::conv2d(x, w, {}, co);
          shortcut = x * 1.0;
        } else {
          shortcut = x * 1.0;
          y = nn::conv2d(x, w, {}, co);
        }
        const int64_t runs = nn::cuda_impl::conv2d_graph_accumulations_run();
        autograd::backward({y, shortcut}, {dy, sum0});
        // nn::conv2d leaves strided convolutions with kernels larger than 1x1 to the separate addition.
        const bool takes_graph = p.g.stride[0] == 1 || p.w[2] * p.w[3] == 1;
        EXPECT_EQ(nn::cuda_impl::conv2d_graph_accumulations_run(), runs + (takes_graph ? 1 : 0));
        ASSERT_TRUE(x.grad().defined());
        expect_close(x.grad(), want, tol, "x.grad");
      }
    }
  }
}

// Sums that cannot take the channel sums are refused before anything runs, with what was wrong, in builds with and
// without cudnn-frontend and on any device (no GPU needed: the check comes first).
TEST(ConvChannelSumsChecks, BadSumsGiveClearErrors) {
  const TensorOptions f32{.dtype = DType::Float32};
  const Tensor x = zeros({1, 2, 4, 4}, f32), w = zeros({4, 2, 3, 3}, f32), y = zeros({1, 4, 4, 4}, f32);
  const nn::cuda_impl::ConvGeometry g{.padding = {1, 1}};
  auto run = [&](const nn::cuda_impl::ConvChannelSums& sums) {
    (void)nn::cuda_impl::conv2d_graph_forward_with_sums(x, w, y, sums, g, /*channels_last=*/false);
  };
  expect_error([&] { run({Tensor(), zeros({4}, f32)}); }, {"sums.sum is undefined", "4 values"});
  expect_error(
      [&] {
        run({zeros({4}, f32), zeros({3}, f32)});
      },
      {"sums.sum_of_squares", "contiguous float32 tensor of 4 values", "got float32 [3]"});
  expect_error(
      [&] {
        run({zeros({4}, {.dtype = DType::Float64}), zeros({4}, f32)});
      },
      {"sums.sum", "float32", "got float64 [4]"});
  expect_error([&] { run({zeros({4, 2}, f32).select(1, 0), zeros({4}, f32)}); }, {"sums.sum", "(not contiguous)"});
}

// A sum the backward-data pass cannot add into is refused before anything runs, naming both dtypes (no GPU needed).
TEST(ConvAccumulateChecks, BadSumGivesAClearError) {
  const TensorOptions f32{.dtype = DType::Float32};
  const Tensor w = zeros({4, 2, 3, 3}, f32), dy = zeros({1, 4, 4, 4}, f32);
  const nn::cuda_impl::ConvGeometry g{.padding = {1, 1}};
  expect_error(
      [&] {
        (void)nn::cuda_impl::conv2d_graph_backward_data_accumulate(zeros({1, 2, 4, 4}, {.dtype = DType::Float64}), w,
                                                                   dy, g, /*channels_last=*/false);
      },
      {"the sum (float64", "must have the gradient's dtype and device (float32"});
  expect_error(
      [&] {
        (void)nn::cuda_impl::conv2d_graph_backward_data_accumulate(zeros({2, 4, 4}, f32), w, dy, g, false);
      },
      {"the sum 4-d"});
}

// After a warm-up the algorithms are cached and every buffer (workspaces too) comes from the caching
// allocator's cache: repeated training steps on the same shapes make no cudaMalloc.
void expect_no_device_mallocs_in_steady_state() {
  const ConvCase c{"steady state", {8, 32, 16, 16}, {64, 32, 3, 3}, {.padding = 1}};
  for (bool channels_last : {false, true}) {
    SCOPED_TRACE(channels_last ? "channels-last" : "NCHW");
    for (DType dtype : {DType::Float32, DType::BFloat16}) {  // the legacy API; the graph API
      SCOPED_TRACE(::kiln::detail::str_cat(dtype));
      for (int i = 0; i < 2; ++i) run_conv(c, Device::cuda(0), dtype, channels_last);  // warm-up
      cuda::synchronize();
      const int64_t mallocs = cuda::memory_stats(0).num_device_mallocs;
      for (int i = 0; i < 5; ++i) run_conv(c, Device::cuda(0), dtype, channels_last);
      cuda::synchronize();
      EXPECT_EQ(cuda::memory_stats(0).num_device_mallocs, mallocs);
    }
  }
}

TEST_F(CudaConvTest, NoDeviceMallocsOnceAlgorithmsAreCached) {
  nn::set_cudnn_benchmark(false);
  expect_no_device_mallocs_in_steady_state();
}

TEST_F(CudaConvTest, NoDeviceMallocsOnceAlgorithmsAreCachedInBenchmarkMode) {
  nn::set_cudnn_benchmark(true);
  expect_no_device_mallocs_in_steady_state();
}

TEST_F(CudaConvTest, BadInputGivesTheSameClearErrors) {
  const TensorOptions o{.device = Device::cuda(0)};
  Tensor w = zeros({4, 3, 3, 3}, o);
  expect_error([&] { nn::conv2d(zeros({1, 1, 2, 3, 5}, o), w); }, {"conv2d", "4-d input", "[1, 1, 2, 3, 5]"});
  expect_error(
      [&] {
        nn::conv2d(zeros({1, 2, 5, 5}, o), w);
      },
      {"conv2d", "[1, 2, 5, 5]", "2 channels", "[4, 3, 3, 3]", "expects 3"});
  expect_error(
      [&] {
        nn::conv2d(zeros({1, 6, 5, 5}, o), zeros({4, 2, 3, 3}, o), {}, {.groups = 3});
      },
      {"conv2d", "4 output channels", "groups = 3"});
  expect_error(
      [&] {
        nn::conv2d(zeros({1, 3, 2, 5}, o), w);
      },
      {"conv2d", "[1, 3, 2, 5]", "smaller than the dilated kernel"});
  expect_error([&] { nn::conv2d(zeros({1, 3, 5, 5}, o), w, zeros({3}, o)); }, {"conv2d", "bias of shape (4)", "[3]"});
  expect_error(
      [&] {
        nn::conv2d(zeros({1, 3, 5, 5}, {.dtype = DType::Float64, .device = Device::cuda(0)}), w);
      },
      {"conv2d", "float64", "one dtype"});
  expect_error([&] { nn::conv2d(zeros({1, 3, 5, 5}, o), w, {}, {.stride = 0}); }, {"conv2d", "stride", "positive"});
  expect_error([&] { nn::conv2d(zeros({1, 3, 5, 5}, o), zeros({4, 3, 3, 3})); }, {"conv2d", "one device"});
  expect_error([&] { nn::conv2d(zeros({1, 3, 5, 5}, o), w, zeros({4})); }, {"conv2d", "one device"});
  expect_error(
      [&] {
        nn::conv2d(zeros({1, 3, 5, 5}, {.dtype = DType::Int64, .device = Device::cuda(0)}),
                   zeros({4, 3, 3, 3}, {.dtype = DType::Int64, .device = Device::cuda(0)}));
      },
      {"conv2d", "floating-point"});
}

}  // namespace
}  // namespace kiln::testing

#else
TEST(CudaConv, NeedsACudaBuild) { GTEST_SKIP() << "kiln was built without CUDA (KILN_CUDA=OFF)"; }
#endif
