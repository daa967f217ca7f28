// kiln/layers/cuda/conv_cudnn_graph.h — one convolution pass through cuDNN's graph API (cudnn-frontend), the
// path conv_cudnn.cpp tries first for float16 and bfloat16 (internal).
//
//   if (!conv2d_graph_pass(ConvPass::Forward, x, w, y, g, /*channels_last=*/true)) { ...the legacy API... }
//
// Why: cuDNN 9's legacy convolution API (cudnnFind*AlgorithmEx) reaches only part of the engines that its graph
// API offers; on an H200 the legacy API ran some of ResNet-18's small-image convolutions (3x3 at 4x4 and 8x8,
// the strided 1x1 ones) at 1.5 to 3.4 times the time of the graph API's engines (bench_conv beside
// pytorch_conv.py). Each problem's graph is built once and cached with its plan: cuDNN's first heuristic choice
// by default, or, with nn::cudnn_benchmark() on, every candidate timed once and the fastest kept; a CUDA graph
// capture takes the plans timed before it (its eager warm-up steps).
#pragma once

#include <cstdint>
#include <string>

#include "kiln/layers/cuda/conv_cudnn.h"  // ConvGeometry
#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

enum class ConvPass : int64_t { Forward, BackwardData, BackwardFilter };

// Runs one pass over dense tensors of one dtype, all in one memory format (channels_last or NCHW): x (N, C_in, H, W),
// w (C_out, C_in, KH, KW), y (N, C_out, OH, OW); the pass writes y (Forward), x (BackwardData: x is dx, y is dy) or
// w (BackwardFilter: w is dw, y is dy). Returns false, having run nothing, where this path does not take the
// problem: not float16 or bfloat16, groups other than 1, deterministic mode (the legacy path filters its
// algorithms), kiln built without cudnn-frontend, the path turned off (set_conv2d_graph_api), or no cuDNN engine
// for it (remembered per problem). Errors of the CUDA runtime or of a chosen plan throw.
bool conv2d_graph_pass(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y, const ConvGeometry& g,
                       bool channels_last);

// The per-channel sums a forward pass can write beside y: over (N, OH, OW), float32, each a contiguous (C_out) tensor.
struct ConvChannelSums {
  Tensor sum;             // sum of y
  Tensor sum_of_squares;  // sum of y^2
};

// The forward pass with each output channel's sum and sum of squares (cuDNN's convolution + statistics graph: the
// statistics batch norm takes next, without reading y again), on conv2d_graph_pass's terms. Two graphs are tried in
// turn: the sums of y as stored, then the sums of the float32 products that a pointwise identity rounds into y; either
// agrees with sums of y to y's rounding. Returns false, having run nothing, where conv2d_graph_pass would, or where
// cuDNN has no engine for either graph (such engines may be compiled at run time, once per problem); why_not, when
// given, then gets each graph's failed build step with cuDNN's message (left as it is where the path was not tried).
bool conv2d_graph_forward_with_sums(const Tensor& x, const Tensor& w, const Tensor& y, const ConvChannelSums& sums,
                                    const ConvGeometry& g, bool channels_last, std::string* why_not = nullptr);

// dx_sum += the backward-data pass of dy through w, in one cuDNN graph: the convolution's float32 result and a
// pointwise add that reads dx_sum and writes the sum back into it (the block input of a residual network, whose
// other gradient came through the shortcut, then costs no separate addition: that reads both gradients and writes
// their sum). dx_sum has the input's shape and dy's dtype and device, dense in the pass's format. Returns false,
// having run nothing, where conv2d_graph_pass would, where cuDNN has no engine for the graph (its engines may be
// compiled at run time, once per problem; why_not, when given, then gets the failed build step). bench_conv
// --accumulate times it against the pass and a separate addition.
bool conv2d_graph_backward_data_accumulate(const Tensor& dx_sum, const Tensor& w, const Tensor& dy,
                                           const ConvGeometry& g, bool channels_last, std::string* why_not = nullptr);

// On by default when kiln has cudnn-frontend; off sends every convolution through the legacy API (bench_conv
// --cudnn-api legacy and the tests compare the two).
void set_conv2d_graph_api(bool enabled);
bool conv2d_graph_api();

// Whether kiln was built with cudnn-frontend (scripts/setup.sh installs it); without it conv2d_graph_pass takes
// nothing.
bool conv2d_graph_api_compiled();

// How many passes conv2d_graph_pass has run, and how many graphs (with their plans) it has built, in this process
// (a test's check that the path is taken, and that a CUDA graph capture reuses the plans timed before it).
int64_t conv2d_graph_passes_run();
int64_t conv2d_graph_plans_built();
int64_t conv2d_graph_accumulations_run();  // of those passes, the backward-data passes added into a sum

}  // namespace kiln::nn::cuda_impl
