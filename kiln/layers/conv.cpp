// 2-d convolution (conv.h): a stride-1 1x1 convolution of a channels-last input as matrix products under one
// autograd node; on CUDA tensors cuDNN's convolutions (cuda/conv_cudnn.h) under another; everywhere else im2col +
// matmul over differentiable ops, so it runs on every backend and autograd derives its gradients. The window helpers
// (window_internal.h) are shared with pooling.cpp.
#include "kiln/layers/conv.h"
#include "kiln/layers/autocast_ops.h"

#include <atomic>
#include <cmath>
#include <memory>  // std::shared_ptr

#include "kiln/autograd/autocast.h"   // autocast::inputs
#include "kiln/autograd/functions.h"  // kiln::cat, kiln::matmul, kiln::as_strided, ...
#include "kiln/autograd/node.h"       // Node, SavedTensor, make_node, set_history
#include "kiln/layers/init.h"         // PyTorch's default initialisation
#include "kiln/layers/window_internal.h"
#include "kiln/tensor/capture.h"       // capture::Op: the op recorded for ONNX export
#include "kiln/tensor/error.h"         // KILN_CHECK
#include "kiln/tensor/internal_ops.h"  // raw ops: the nodes' work is not recorded

#if KILN_WITH_CUDA
#include "kiln/layers/cuda/conv_cudnn.h"      // cuda_impl::conv2d_forward, ...
#include "kiln/layers/cuda/space_to_depth.h"  // cuda_impl::space_to_depth
#endif

namespace kiln::nn {

namespace detail {

Tensor pad2d(const Tensor& input, std::array<int64_t, 4> tblr, double value) {
  Tensor x = contiguous(input);
  const auto [top, bottom, left, right] = tblr;
  if (top == 0 && bottom == 0 && left == 0 && right == 0) return x;
  const int64_t n = x.size(0), c = x.size(1), w = x.size(3);
  const TensorOptions o = x.options();
  // Rows first: (N, C, H, W) -> (N, C, top + H + bottom, W); then columns on the taller tensor.
  if (top > 0 || bottom > 0) {
    std::vector<Tensor> parts;
    if (top > 0) parts.push_back(full({n, c, top, w}, value, o));
    parts.push_back(x);
    if (bottom > 0) parts.push_back(full({n, c, bottom, w}, value, o));
    x = cat(parts, 2);
  }
  if (left > 0 || right > 0) {
    const int64_t hp = x.size(2);
    std::vector<Tensor> parts;
    if (left > 0) parts.push_back(full({n, c, hp, left}, value, o));
    parts.push_back(x);
    if (right > 0) parts.push_back(full({n, c, hp, right}, value, o));
    x = cat(parts, 3);
  }
  return contiguous(x);
}

bool space_to_depth_applies(const Shape& input, const Shape& weight, Pair stride, Pair padding, Pair dilation,
                            int64_t groups) {
  if (input.size() != 4 || weight.size() != 4 || groups != 1) return false;
  for (size_t i = 0; i < 2; ++i) {
    if (stride[i] != 2 || dilation[i] != 1 || padding[i] < 0) return false;
    const int64_t span = input[2 + i] + 2 * padding[i], k = weight[2 + i];
    if (k < 2 || span < k) return false;
    const int64_t out = (span - k) / 2 + 1, blocks = (span + 1) / 2, kernel_blocks = (k + 1) / 2;
    if (blocks - kernel_blocks + 1 != out) return false;
  }
  return true;
}

Tensor space_to_depth_input(const Tensor& input, Pair padding, int64_t channels) {
  const int64_t n = input.size(0), c = input.size(1), h = input.size(2), w = input.size(3);
  KILN_CHECK(channels >= 4 * c, "space_to_depth_input: ", channels, " channels cannot hold the 2 x 2 blocks of ", c);
#if KILN_WITH_CUDA
  // One pass on the GPU; the zero fill and the four strided copies below took about 0.5 ms of ResNet-50's step.
  if (cuda_impl::space_to_depth_fits(input, channels)) return cuda_impl::space_to_depth(input, padding.v, channels);
#endif
  const int64_t hb = (h + 2 * padding[0] + 1) / 2, wb = (w + 2 * padding[1] + 1) / 2;
  Tensor out =
      internal::zeros({n, channels, hb, wb},
                      {.dtype = input.dtype(), .device = input.device(), .memory_format = MemoryFormat::ChannelsLast});
  // out's memory is (N, Hb, Wb, channels); its first 4 C channels of a block are (a, b, c).
  const Tensor blocks =
      internal::as_strided(out, {n, hb, wb, 2, 2, c}, {hb * wb * channels, wb * channels, channels, 2 * c, c, 1});
  for (int64_t a = 0; a < 2; ++a) {
    // Padded row 2 i + a is input row 2 i + a - padding: the rows h0, h0 + 2, ... into block rows i0, i0 + 1, ...
    const int64_t h0 = ((a - padding[0]) % 2 + 2) % 2, i0 = (h0 + padding[0] - a) / 2, rows = (h - h0 + 1) / 2;
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t w0 = ((b - padding[1]) % 2 + 2) % 2, j0 = (w0 + padding[1] - b) / 2, cols = (w - w0 + 1) / 2;
      if (rows <= 0 || cols <= 0) continue;
      Tensor dst = internal::narrow(
          internal::narrow(internal::select(internal::select(blocks, 3, a), 3, b), 1, i0, rows), 2, j0, cols);
      const Tensor src =
          internal::permute(internal::slice(internal::slice(input, 2, h0, h, 2), 3, w0, w, 2), {0, 2, 3, 1});
      internal::copy_(dst, src);
    }
  }
  return out;
}

Tensor space_to_depth_conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, Pair padding,
                             int64_t channels) {
  const int64_t c_out = weight.size(0), c = weight.size(1);
  const int64_t kh = (weight.size(2) + 1) / 2, kw = (weight.size(3) + 1) / 2;
  // (C_out, C, 2 kh, 2 kw) -> (C_out, C, kh, 2, kw, 2) -> (C_out, 2, 2, C, kh, kw) -> (C_out, 4 C, kh, kw)
  const Tensor even = pad2d(weight, {0, weight.size(2) % 2, 0, weight.size(3) % 2}, 0.0);
  Tensor w = reshape(permute(reshape(even, {c_out, c, kh, 2, kw, 2}), {0, 3, 5, 1, 2, 4}), {c_out, 4 * c, kh, kw});
  if (channels > 4 * c) w = cat({w, zeros({c_out, channels - 4 * c, kh, kw}, w.options())}, 1);
  const Tensor x = space_to_depth_input(input.detach(), padding, channels);
  return conv2d(x, w.contiguous(MemoryFormat::ChannelsLast), bias, {.stride = 1, .padding = 0, .bias = bias.defined()});
}

Tensor windows2d(const Tensor& padded, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                 std::array<int64_t, 2> dilation, std::array<int64_t, 2> out_size) {
  // Strides of the contiguous (N, C, Hp, Wp): (C Hp Wp, Hp Wp, Wp, 1).
  const Strides& s = padded.strides();
  return as_strided(padded, {padded.size(0), padded.size(1), out_size[0], out_size[1], kernel[0], kernel[1]},
                    {s[0], s[1], s[2] * stride[0], s[3] * stride[1], s[2] * dilation[0], s[3] * dilation[1]});
}

MemoryFormat output_format(const Tensor& input) {
  return input.dim() == 4 && !input.is_contiguous() && input.is_contiguous(MemoryFormat::ChannelsLast)
             ? MemoryFormat::ChannelsLast
             : MemoryFormat::Contiguous;
}

}  // namespace detail

// ---------------------------------------------------------------- cuDNN settings

namespace {
std::atomic<bool> cudnn_benchmark_enabled{false};
}  // namespace

void set_cudnn_benchmark(bool enabled) { cudnn_benchmark_enabled.store(enabled, std::memory_order_relaxed); }
bool cudnn_benchmark() { return cudnn_benchmark_enabled.load(std::memory_order_relaxed); }

// ---------------------------------------------------------------- 1x1 convolutions as matrix products

namespace {

// What the backward of both convolution paths (1x1 as a matrix product, cuDNN) keeps: the input as computed on,
// saved where the weight needs a gradient, the weight as computed on, saved where the input needs one, the shapes
// of both, the weight argument's own memory format (given to grad_weight) and the computation dtype.
struct ConvolutionBackward : autograd::Node {
  autograd::SavedTensor input, weight;
  Shape input_shape, weight_shape;
  MemoryFormat weight_format = MemoryFormat::Contiguous;
  DType dtype = DType::Float32;
  void release_saved() override {
    input.reset();
    weight.reset();
  }
};

// Node N for y = conv(input, weight) + bias, computed on x and w (the input and weight in the layout the
// computation used), filled with what ConvolutionBackward keeps; null when no argument needs a gradient.
template <typename N>
std::shared_ptr<N> convolution_node(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& x,
                                    const Tensor& w) {
  if (!autograd::needs_grad(input, weight, bias)) return nullptr;
  auto node = autograd::make_node<N>(input, weight, bias);
  if (node->needs_input_grad(1)) node->input = autograd::SavedTensor(x, /*is_output=*/false);
  if (node->needs_input_grad(0)) node->weight = autograd::SavedTensor(w, /*is_output=*/false);
  node->input_shape = x.shape();
  node->weight_shape = weight.shape();
  node->weight_format = weight.suggest_memory_format();
  node->dtype = x.dtype();
  return node;
}

// (N, C, H, W) channels-last as the (N H W, C) matrix its memory is (a view).
Tensor nhwc_rows(const Tensor& t) {
  return internal::view(internal::permute(t, {0, 2, 3, 1}), {t.size(0) * t.size(2) * t.size(3), t.size(1)});
}

// Gradients of y = x w^T + b over the NHWC rows (pointwise_conv2d): grad_input = dy w, grad_weight = dy^T x and
// grad_bias = the column sums of dy, in one product with their sums; each only where an input needs it. grad_input
// is added straight into the gradient already summed for the input where the engine offers it (the block input of
// a residual network, whose other gradient came through the shortcut): the product's epilogue reads that sum
// (beta = 1) instead of the engine reading both gradients and writing their sum.
// input (N, C_in, H, W) channels-last; weight (C_out, C_in) rows; weight_shape the argument's (C_out, C_in, 1, 1).
struct PointwiseConvolutionBackward final : ConvolutionBackward {
  std::string_view name() const override { return "PointwiseConvolutionBackward"; }
  bool accepts_gradient_buffers() const override { return true; }
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    const Tensor g = internal::contiguous(grads[0].dtype() == dtype ? grads[0] : internal::cast(grads[0], dtype),
                                          MemoryFormat::ChannelsLast);  // (N, C_out, H, W)
    const Tensor g_rows = nhwc_rows(g);                                 // (N H W, C_out)
    Tensor grad_input, grad_weight, grad_bias;
    if (needs_input_grad(0)) {
      const Tensor w = weight.unpack(*this);  // (C_out, C_in)
      const Tensor sum = offered_buffers().empty() ? Tensor() : offered_buffers()[0];
      if (sum.defined() && sum.dtype() == dtype && sum.device() == g.device() && sum.shape() == input_shape &&
          sum.is_contiguous(MemoryFormat::ChannelsLast)) {
        Tensor rows = nhwc_rows(sum);
        internal::addmm_(rows, g_rows, w);  // sum += dy w, in place
        grad_input = sum;
      } else {
        grad_input = internal::permute(internal::reshape(internal::mm(g_rows, w), {input_shape[0], input_shape[2],
                                                                                   input_shape[3], input_shape[1]}),
                                       {0, 3, 1, 2});
      }
    }
    if (needs_input_grad(1) || needs_input_grad(2)) {
      const Tensor x_rows = nhwc_rows(input.unpack(*this));  // (N H W, C_in)
      if (needs_input_grad(2)) {  // dy^T x and the row sums of dy^T: the bias gradient from the same product
        auto [dw, db] = internal::mm_with_row_sums(internal::transpose(g_rows, 0, 1), x_rows);
        grad_weight = dw;
        grad_bias = db;
      } else {
        grad_weight = internal::mm(internal::transpose(g_rows, 0, 1), x_rows);
      }
      grad_weight = needs_input_grad(1)
                        ? internal::contiguous(internal::reshape(grad_weight, weight_shape), weight_format)
                        : Tensor();
    }
    return {grad_input, grad_weight, grad_bias};
  }
};

// A 1x1, stride-1, unpadded, ungrouped convolution of a channels-last (N, C_in, H, W) input: y = x w^T + b over the
// (N H W, C_in) rows of its memory, one matrix product, and the (N, C_out, H, W) channels-last view of the result.
// (conv2d has applied autocast and checked the arguments.)
Tensor pointwise_conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  const Tensor x = internal::contiguous(input, MemoryFormat::ChannelsLast);
  const int64_t n = x.size(0), c_in = x.size(1), h = x.size(2), w = x.size(3), c_out = weight.size(0);
  const Tensor rows = nhwc_rows(x);
  const Tensor w2 = internal::reshape(weight, {c_out, c_in});
  const Tensor wt = internal::transpose(w2, 0, 1);
  const Tensor y_rows = bias.defined() ? internal::addmm(bias, rows, wt) : internal::mm(rows, wt);  // (N H W, C_out)
  Tensor y = internal::permute(internal::reshape(y_rows, {n, h, w, c_out}), {0, 3, 1, 2});
  if (auto node = convolution_node<PointwiseConvolutionBackward>(input, weight, bias, x, w2)) {
    autograd::set_history(y, node);
  }
  return y;
}

}  // namespace

// ---------------------------------------------------------------- conv2d on CUDA (cuDNN)

#if KILN_WITH_CUDA
namespace {

// Gradients of y = conv(x, w) + b: grad_input by cuDNN's backward-data, grad_weight by its backward-filter,
// grad_bias = the sum of grad_output over N, OH, OW; each only where an input needs it.
// input (N, C_in, H, W) and weight (C_out, C_in / groups, KH, KW), both in `format`.
struct CudnnConvolutionBackward final : ConvolutionBackward {
  cuda_impl::ConvGeometry geometry;
  MemoryFormat format = MemoryFormat::Contiguous;        // of the computation
  MemoryFormat input_format = MemoryFormat::Contiguous;  // the input's (and output's), given to grad_input

  std::string_view name() const override { return "CudnnConvolutionBackward"; }
  bool accepts_gradient_buffers() const override {
    return needs_input_grad(0) && format == input_format &&
           cuda_impl::conv2d_backward_data_can_accumulate(geometry, weight_shape, dtype);
  }
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    const Tensor g = grads[0].dtype() == dtype ? grads[0] : internal::cast(grads[0], dtype);  // (N, C_out, OH, OW)
    Tensor grad_input, grad_weight, grad_bias;
    if (needs_input_grad(0)) {
      // Into the gradient already summed for the input where the engine offers it and one cuDNN graph can add
      // there (as PointwiseConvolutionBackward does with its product).
      const Tensor sum = offered_buffers().empty() ? Tensor() : offered_buffers()[0];
      if (sum.defined() && format == input_format && sum.dtype() == dtype && sum.device() == g.device() &&
          sum.shape() == input_shape && sum.is_contiguous(format) &&
          cuda_impl::conv2d_backward_data_accumulate(g, weight.unpack(*this), sum, geometry, format)) {
        grad_input = sum;
      } else {
        grad_input = internal::contiguous(
            cuda_impl::conv2d_backward_data(g, weight.unpack(*this), input_shape, geometry, format), input_format);
      }
    }
    if (needs_input_grad(1)) {
      grad_weight = internal::contiguous(
          cuda_impl::conv2d_backward_filter(g, input.unpack(*this), weight_shape, geometry, format), weight_format);
    }
    if (needs_input_grad(2)) grad_bias = internal::sum(g, {0, 2, 3});  // (C_out)
    return {grad_input, grad_weight, grad_bias};
  }
};

// input (N, C_in, H, W) on a GPU, arguments already checked -> (N, C_out, OH, OW) in the input's format.
// (conv2d has applied autocast already.)
Tensor conv2d_cudnn(const Tensor& input, const Tensor& weight, const Tensor& bias,
                    const cuda_impl::ConvGeometry& geometry) {
  const MemoryFormat out_format = detail::output_format(input);
  // cuDNN wants input, weight and output in one layout: the weight follows the input, as in PyTorch. Float64
  // stays NCHW, where cuDNN has its double kernels (PyTorch does the same); its output is copied back.
  const MemoryFormat format = input.dtype() == DType::Float64 ? MemoryFormat::Contiguous : out_format;
  const Tensor x = internal::contiguous(input, format);   // (N, C_in, H, W)
  const Tensor w = internal::contiguous(weight, format);  // (C_out, C_in / groups, KH, KW)
  Tensor y = internal::contiguous(cuda_impl::conv2d_forward(x, w, geometry, format), out_format);  // (N, C_out, OH, OW)
  if (bias.defined())
    internal::add_(y, internal::reshape(bias, {1, bias.size(0), 1, 1}));  // one broadcast add, in place
  if (auto node = convolution_node<CudnnConvolutionBackward>(input, weight, bias, x, w)) {
    node->geometry = geometry;
    node->format = format;
    node->input_format = out_format;
    autograd::set_history(y, node);
  }
  return y;
}

}  // namespace
#endif  // KILN_WITH_CUDA

// ---------------------------------------------------------------- conv2d

#if KILN_WITH_CUDA
constexpr int64_t kSpaceToDepthChannels = 16;  // the blocks' channels: 4 C_in (C_in <= 4) zero-padded to 16
#endif

Tensor conv2d(const Tensor& input_arg, const Tensor& weight_arg, const Tensor& bias_arg, const Conv2dOptions& options) {
  capture::Op cap("conv2d");
  const auto describe = [&] {
    return capture::Args{{input_arg, weight_arg, bias_arg},
                         {{"stride", std::vector<int64_t>{options.stride[0], options.stride[1]}},
                          {"padding", std::vector<int64_t>{options.padding[0], options.padding[1]}},
                          {"dilation", std::vector<int64_t>{options.dilation[0], options.dilation[1]}},
                          {"groups", options.groups}}};
  };
  // Autocast first (Policy::LowerPrecision), as PyTorch does before its checks, so that mixed input and weight
  // dtypes are cast rather than refused, and the whole layer (bias included) runs in the low dtype on every device.
  const auto [input_in, weight, bias] = autocast::inputs(autocast_ops::conv(), input_arg, weight_arg, bias_arg);
  autocast::DisableGuard as_one_op;
  KILN_CHECK(input_in.defined() && weight.defined(), "conv2d: input and weight must be defined tensors");
  KILN_CHECK(input_in.dim() == 4 || input_in.dim() == 3,
             "conv2d: expected a 4-d input (N, C_in, H, W) or a 3-d unbatched input (C_in, H, W), got shape ",
             input_in.shape());
  KILN_CHECK(weight.dim() == 4, "conv2d: expected a 4-d weight (C_out, C_in / groups, KH, KW), got shape ",
             weight.shape());
  const int64_t groups = options.groups;
  KILN_CHECK(groups > 0, "conv2d: groups must be positive, got ", groups);
  for (size_t i = 0; i < 2; ++i) {
    KILN_CHECK(options.stride[i] > 0 && options.dilation[i] > 0 && options.padding[i] >= 0,
               "conv2d: stride and dilation must be positive and padding non-negative, got stride (", options.stride[0],
               ", ", options.stride[1], "), dilation (", options.dilation[0], ", ", options.dilation[1], "), padding (",
               options.padding[0], ", ", options.padding[1], ")");
  }
  KILN_CHECK(input_in.device() == weight.device() && (!bias.defined() || bias.device() == weight.device()),
             "conv2d: input (", input_in.device(), "), weight (", weight.device(),
             ") and bias must be on one device; move them with to()");
  KILN_CHECK(input_in.dtype() == weight.dtype() && (!bias.defined() || bias.dtype() == weight.dtype()),
             "conv2d: input (", input_in.dtype(), "), weight (", weight.dtype(),
             ") and bias must have one dtype; cast them with to()");
  KILN_CHECK(input_in.is_floating_point(), "conv2d: expected a floating-point input, got ", input_in.dtype());

  const bool unbatched = input_in.dim() == 3;
  const Tensor input = unbatched ? unsqueeze(input_in, 0) : input_in;
  const int64_t n = input.size(0), c_in = input.size(1), h = input.size(2), w = input.size(3);
  const int64_t c_out = weight.size(0), c_in_g = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  KILN_CHECK(c_out % groups == 0, "conv2d: the weight's ", c_out, " output channels (shape ", weight.shape(),
             ") are not divisible by groups = ", groups);
  KILN_CHECK(c_in == c_in_g * groups, "conv2d: input of shape ", input_in.shape(), " has ", c_in,
             " channels, but the weight of shape ", weight.shape(), " with groups = ", groups, " expects ",
             c_in_g * groups, " (weight.size(1) * groups)");
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == c_out), "conv2d: expected a bias of shape (", c_out,
             "), got shape ", bias.shape());
  const int64_t oh = (h + 2 * options.padding[0] - options.dilation[0] * (kh - 1) - 1) / options.stride[0] + 1;
  const int64_t ow = (w + 2 * options.padding[1] - options.dilation[1] * (kw - 1) - 1) / options.stride[1] + 1;
  const bool fits = h + 2 * options.padding[0] >= options.dilation[0] * (kh - 1) + 1 &&
                    w + 2 * options.padding[1] >= options.dilation[1] * (kw - 1) + 1;
  KILN_CHECK(fits && oh > 0 && ow > 0, "conv2d: the input of shape ", input_in.shape(), " with padding (",
             options.padding[0], ", ", options.padding[1], ") is smaller than the dilated kernel (",
             options.dilation[0] * (kh - 1) + 1, ", ", options.dilation[1] * (kw - 1) + 1,
             "), so the output would be empty; use a larger input or more padding");

  // A 1x1 convolution with stride 1, no padding and one group, on a channels-last input, is one matrix product:
  // the input is an (N H W, C_in) matrix as it lies in memory, y = x w^T + b, and its backward is two more products
  // (dx = dy w, dw = dy^T x) and the bias's column sums (pointwise_conv2d). On an H200 cuDNN's legacy convolution
  // API ran ResNet-50's stride-1 1x1 layers (the bottlenecks' first and last) at 2 to 5 times the time of the
  // same products (bench_conv beside pytorch_conv.py); cuBLASLt's matmul runs them at the products' speed.
  const bool one_by_one = kh == 1 && kw == 1 && groups == 1 && options.stride[0] == 1 && options.stride[1] == 1 &&
                          options.padding[0] == 0 && options.padding[1] == 0;
  if (one_by_one && input.suggest_memory_format() == MemoryFormat::ChannelsLast) {
    const Tensor y = pointwise_conv2d(input, weight, bias);
    return cap.done(unbatched ? squeeze(y, 0) : y, describe);  // (N, C_out, H, W), channels-last
  }

#if KILN_WITH_CUDA
  if (input.is_cuda()) {
    // A stride-2 first layer on at most 4 input channels (ResNet's 7x7 stem on RGB images) in bf16, its input needing
    // no gradient, runs over the input's 2 x 2 blocks as a stride-1 convolution on 16 channels: cuDNN's bf16 kernels
    // for 3 channels took 3.0 ms for ResNet-50's stem forward and weight gradient (batch 256, 224 x 224, an H100;
    // bench/experiments/stem_channels.cpp), 7% of the training step, and padding the channels to 8 gained 10% of that.
    if (input.dtype() == DType::BFloat16 && c_in <= 4 && !capture::active() && !autograd::needs_grad(input) &&
        input.suggest_memory_format() == MemoryFormat::ChannelsLast &&
        detail::space_to_depth_applies(input.shape(), weight.shape(), options.stride, options.padding, options.dilation,
                                       groups)) {
      const Tensor y = detail::space_to_depth_conv2d(input, weight, bias, options.padding, kSpaceToDepthChannels);
      return cap.done(unbatched ? squeeze(y, 0) : y, describe);
    }
    const cuda_impl::ConvGeometry geometry{
        .stride = options.stride.v, .padding = options.padding.v, .dilation = options.dilation.v, .groups = groups};
    if (cuda_impl::conv2d_supported(input, weight, geometry)) {
      Tensor y = conv2d_cudnn(input, weight, bias, geometry);
      return cap.done(unbatched ? squeeze(y, 0) : y, describe);
    }
  }
#endif

  const MemoryFormat format = detail::output_format(input);

  // im2col: (N, C_in, Hp, Wp) -> windows (N, C_in, OH, OW, KH, KW) -> (N OH OW, groups, C_in_g KH KW).
  const int64_t ph = options.padding[0], pw = options.padding[1];
  const Tensor padded = detail::pad2d(input, {ph, ph, pw, pw}, 0.0);
  const Tensor win = detail::windows2d(padded, {kh, kw}, {options.stride[0], options.stride[1]},
                                       {options.dilation[0], options.dilation[1]}, {oh, ow});
  const int64_t m = n * oh * ow, k = c_in_g * kh * kw, c_out_g = c_out / groups;
  Tensor cols = reshape(permute(win, {0, 2, 3, 1, 4, 5}), {m, groups, k});

  Tensor out;  // (N OH OW, C_out)
  if (groups == 1) {
    out = matmul(reshape(cols, {m, k}), transpose(reshape(weight, {c_out, k}), 0, 1));
  } else {
    // Per group: (groups, M, K) x (groups, K, C_out_g) -> (groups, M, C_out_g) -> (M, groups C_out_g).
    const Tensor wg = transpose(reshape(weight, {groups, c_out_g, k}), 1, 2);
    out = reshape(permute(matmul(permute(cols, {1, 0, 2}), wg), {1, 0, 2}), {m, c_out});
  }
  if (bias.defined()) out = add(out, bias);
  // (N, OH, OW, C_out) -> (N, C_out, OH, OW): a channels-last view; copy to the input's format.
  Tensor y = contiguous(permute(reshape(out, {n, oh, ow, c_out}), {0, 3, 1, 2}), format);
  return cap.done(unbatched ? squeeze(y, 0) : y, describe);
}

// ---------------------------------------------------------------- Conv2d

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Pair kernel_size, Conv2dOptions options)
    : Module("Conv2d"),
      in_channels(in_channels),
      out_channels(out_channels),
      kernel_size(kernel_size),
      options(options) {
  KILN_CHECK(in_channels > 0 && out_channels > 0, "Conv2d: in_channels and out_channels must be positive, got ",
             in_channels, " and ", out_channels);
  KILN_CHECK(kernel_size[0] > 0 && kernel_size[1] > 0, "Conv2d: kernel_size must be positive, got (", kernel_size[0],
             ", ", kernel_size[1], ")");
  KILN_CHECK(options.groups > 0 && in_channels % options.groups == 0 && out_channels % options.groups == 0,
             "Conv2d: groups = ", options.groups, " must be positive and divide in_channels = ", in_channels,
             " and out_channels = ", out_channels);
  for (size_t i = 0; i < 2; ++i) {
    KILN_CHECK(options.stride[i] > 0 && options.dilation[i] > 0 && options.padding[i] >= 0,
               "Conv2d: stride and dilation must be positive and padding non-negative, got stride (", options.stride[0],
               ", ", options.stride[1], "), dilation (", options.dilation[0], ", ", options.dilation[1], "), padding (",
               options.padding[0], ", ", options.padding[1], ")");
  }
  weight =
      register_parameter("weight", empty({out_channels, in_channels / options.groups, kernel_size[0], kernel_size[1]}));
  if (options.bias) bias = register_parameter("bias", empty({out_channels}));
  reset_parameters();
}

void Conv2d::reset_parameters(Generator* gen) {
  // kaiming_uniform_(a = sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = C_in / groups * KH * KW.
  init::kaiming_uniform_(weight, std::sqrt(5.0), init::FanMode::FanIn, init::Nonlinearity::LeakyReLU, gen);
  if (bias.defined()) {
    const auto [fan_in, fan_out] = init::calculate_fan_in_and_fan_out(weight);
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    init::uniform_(bias, -bound, bound, gen);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  KILN_CHECK((input.dim() == 4 || input.dim() == 3) && input.size(input.dim() - 3) == in_channels,
             "Conv2d: expected input of shape (N, ", in_channels, ", H, W) or (", in_channels,
             ", H, W) (in_channels = ", in_channels, "), got shape ", input.shape());
  return conv2d(input, weight, bias, options);
}

}  // namespace kiln::nn
