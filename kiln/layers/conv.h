// kiln/layers/conv.h — 2-d convolution: the function and the Conv2d module.
//
//   auto conv = std::make_shared<nn::Conv2d>(3, 64, 7, nn::Conv2dOptions{.stride = 2, .padding = 3, .bias = false});
//   Tensor y = (*conv)(x);                            // x (N, 3, 224, 224) -> y (N, 64, 112, 112)
//   Tensor z = nn::conv2d(x, w, b, {.stride = 1, .padding = 1, .groups = 2});
//
// NCHW shapes; inputs in channels-last memory format give channels-last outputs. Parameter names and
// default initialisation as PyTorch's ("weight" (out, in / groups, kh, kw), "bias" (out)).
//
// On CUDA tensors conv2d runs cuDNN's convolutions (forward, and backward for the input, weight and bias
// gradients), under autocast in the autocast dtype; float32 uses TF32 tensor cores when
// kiln::cuda::allow_tf32() is on (the default). The weight is used in the input's memory format (a
// channels-last copy for a channels-last input unless it already is one, as PyTorch does): keep model and
// input in one format (module.to(dev, MemoryFormat::ChannelsLast)) to avoid that copy. A bf16 channels-last
// stride-2 convolution on at most 4 input channels whose input needs no gradient (an image network's first layer)
// runs as a stride-1 convolution over the input's 2 x 2 blocks on 16 channels, where cuDNN's bf16 kernels for so few
// channels are slow; the output and the weight's gradient are the convolution's. Elsewhere it is im2col + matmul
// over differentiable ops.
//
//   nn::set_cudnn_benchmark(true);   // time every cuDNN algorithm once per problem, as torch.backends.cudnn.benchmark
#pragma once

#include <array>
#include <cstdint>

#include "kiln/layers/module.h"
#include "kiln/tensor/generator.h"

namespace kiln::nn {

// Per-dim settings are {height, width}; a single number means the same for both.
struct Pair {
  std::array<int64_t, 2> v;  // {height, width}
  // The same value for both dims.
  Pair(int64_t both) : v{both, both} {}  // NOLINT: implicit, so {.stride = 2} reads naturally
  // Height and width.
  Pair(int64_t h, int64_t w) : v{h, w} {}
  // v[i]: 0 the height, 1 the width.
  int64_t operator[](size_t i) const { return v[i]; }
};

// Conv2d's stride, padding, dilation, groups and bias, with PyTorch's defaults.
struct Conv2dOptions {
  Pair stride = 1;     // the step between applications of the kernel
  Pair padding = 0;    // zeros on each side
  Pair dilation = 1;   // the spacing between kernel elements
  int64_t groups = 1;  // blocked connections: in and out channels must be multiples of it
  bool bias = true;    // false: no "bias" parameter (Conv2d)
};

// input (N, C_in, H, W), weight (C_out, C_in / groups, KH, KW), bias (C_out) or undefined
//   -> (N, C_out, (H + 2 pH - dH (KH - 1) - 1) / sH + 1, (W + ...) / sW + 1).
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {}, const Conv2dOptions& options = {});

// How the cuDNN path picks an algorithm the first time it meets a problem (shapes, memory format, dtype,
// stride/padding/dilation/groups, TF32 setting, device); the choice is cached for the process' life.
// Off (the default): cuDNN's heuristics, the first algorithm whose workspace fits in memory. On: every
// algorithm is run and timed once per problem (one host synchronisation each time, so the first steps are
// slower) and the fastest is kept, as PyTorch's torch.backends.cudnn.benchmark; worth it when the shapes stay
// the same from step to step. Process-wide and thread-safe; no effect on the CPU. Ignored while
// kiln::deterministic() is on (kiln/tensor/determinism.h): then only deterministic algorithms are chosen,
// by the heuristics.
void set_cudnn_benchmark(bool enabled);
bool cudnn_benchmark();  // whether set_cudnn_benchmark turned it on (off by default)

// 2-D convolution over (N, C, H, W) or channels-last input (cuDNN on the GPU), as torch.nn.Conv2d.
class Conv2d : public Module {
 public:
  // kiln::Error for non-positive sizes, strides or dilations, negative padding, or channels not multiples of groups.
  Conv2d(int64_t in_channels, int64_t out_channels, Pair kernel_size, Conv2dOptions options = {});
  Tensor forward(const Tensor& input) override;
  // PyTorch's default: kaiming_uniform_(a = sqrt(5)) on the weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) bias.
  void reset_parameters(Generator* gen = nullptr);

  // C_in, the input's channels.
  int64_t in_channels, out_channels;  // C_out, the output's channels
  Pair kernel_size;                   // {KH, KW}
  Conv2dOptions options;              // as constructed
  Tensor weight;                      // (out_channels, in_channels / groups, KH, KW)
  Tensor bias;                        // (out_channels); undefined without bias
};

}  // namespace kiln::nn
