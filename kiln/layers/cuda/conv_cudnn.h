// kiln/layers/cuda/conv_cudnn.h — 2-d convolution on CUDA tensors through cuDNN: forward, backward-data and
// backward-filter, each pass through cuDNN's graph API where conv_cudnn_graph.h takes it (float16, bfloat16), else
// through its legacy convolution API, with the algorithm of each problem chosen once and cached (internal;
// nn::conv2d in kiln/layers/conv.cpp calls it and records the autograd node).
//
//   const ConvGeometry g{.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1};
//   Tensor y  = conv2d_forward(x, w, g, MemoryFormat::ChannelsLast);                     // (N, C_out, OH, OW)
//   Tensor dx = conv2d_backward_data(dy, w, x.shape(), g, MemoryFormat::ChannelsLast);    // (N, C_in, H, W)
//   Tensor dw = conv2d_backward_filter(dy, x, w.shape(), g, MemoryFormat::ChannelsLast);  // (C_out, C_in / g, KH, KW)
//
// Every tensor of one call is laid out in one memory format, NCHW (Contiguous) or NHWC (ChannelsLast), as
// cuDNN wants input, filter and output alike; arguments in another layout are copied into it first, and
// results come out in it. Dtypes: float32 (TF32 tensor cores only when cuda::allow_tf32()), float64,
// float16 and bfloat16 (float accumulation). Algorithms: cuDNN's heuristics by default, or timed once per
// problem when nn::cudnn_benchmark() is on. Workspaces come from the caching allocator; all work is queued on
// the current kiln stream of the tensors' device.
#pragma once

#include <array>
#include <cstdint>

#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

struct ConvGeometry {
  std::array<int64_t, 2> stride{1, 1};    // {height, width}
  std::array<int64_t, 2> padding{0, 0};   // zeros on each side
  std::array<int64_t, 2> dilation{1, 1};  //
  int64_t groups = 1;
};

// A problem's extents and geometry as the algorithm and graph caches key them: x's (N, C_in, H, W), w's
// (C_out, C_in / groups, KH, KW), then stride, padding and dilation.
std::array<int64_t, 14> conv_key_dims(const Shape& x, const Shape& w, const ConvGeometry& g);

// Whether cuDNN's 4-d descriptors can describe this problem: no empty tensor, and every extent and element
// count of input (N, C_in, H, W), weight (C_out, C_in / groups, KH, KW) and output within int32. The caller
// takes another path otherwise.
bool conv2d_supported(const Tensor& input, const Tensor& weight, const ConvGeometry& g);

// input (N, C_in, H, W), weight (C_out, C_in / groups, KH, KW) -> (N, C_out, OH, OW) in `format`, no bias.
Tensor conv2d_forward(const Tensor& input, const Tensor& weight, const ConvGeometry& g, MemoryFormat format);

// grad_output (N, C_out, OH, OW), weight -> grad_input of shape input_shape (N, C_in, H, W), in `format`.
Tensor conv2d_backward_data(const Tensor& grad_output, const Tensor& weight, const Shape& input_shape,
                            const ConvGeometry& g, MemoryFormat format);

// grad_input_sum += the grad_input of grad_output through weight, in place, where one cuDNN graph does both
// (conv2d_graph_backward_data_accumulate): grad_input_sum (N, C_in, H, W) dense in `format`, of grad_output's dtype
// and device. Returns false, having changed nothing, where it does not, or where the graph ran slower than the pass
// and a separate addition on the H200 (strided convolutions with kernels larger than 1x1); the caller then adds
// conv2d_backward_data's result.
bool conv2d_backward_data_accumulate(const Tensor& grad_output, const Tensor& weight, const Tensor& grad_input_sum,
                                     const ConvGeometry& g, MemoryFormat format);
// Whether conv2d_backward_data_accumulate may take problems of this geometry, weight shape and dtype: float16 or
// bfloat16, ungrouped, not strided with a kernel larger than 1x1. (nn::conv2d's backward node accepts the autograd
// engine's gradient sums only then, so that the engine orders the backward around the nodes that add into them.)
bool conv2d_backward_data_can_accumulate(const ConvGeometry& g, const Shape& weight_shape, DType dtype);

// grad_output (N, C_out, OH, OW), input -> grad_weight of shape weight_shape (C_out, C_in / groups, KH, KW),
// in `format`.
Tensor conv2d_backward_filter(const Tensor& grad_output, const Tensor& input, const Shape& weight_shape,
                              const ConvGeometry& g, MemoryFormat format);

}  // namespace kiln::nn::cuda_impl
