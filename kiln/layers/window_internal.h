// kiln/layers/window_internal.h — internal to kiln_layers (not installed API): the padding and sliding-window
// view that conv2d and the pooling functions compose from differentiable ops.
//
//   Tensor xp = detail::pad2d(x, {1, 1, 1, 1}, 0.0);                      // (N, C, H, W) -> (N, C, H + 2, W + 2)
//   Tensor win = detail::windows2d(xp, {3, 3}, {1, 1}, {1, 1}, {H, W});   // (N, C, H, W, 3, 3), a view of xp
#pragma once

#include <array>
#include <cstdint>

#include "kiln/layers/conv.h"  // Pair
#include "kiln/tensor/tensor.h"

namespace kiln::nn::detail {

// (N, C, H, W) -> (N, C, top + H + bottom, left + W + right), contiguous, the border filled with `value`.
// Built with cat, so gradients flow back to the input (in-place writes into a recorded tensor are refused).
Tensor pad2d(const Tensor& input, std::array<int64_t, 4> top_bottom_left_right, double value);

// A view of the contiguous (N, C, Hp, Wp) `padded` with shape (N, C, OH, OW, KH, KW): element
// [n, c, i, j, a, b] is padded[n, c, i * sH + a * dH, j * sW + b * dW].
Tensor windows2d(const Tensor& padded, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                 std::array<int64_t, 2> dilation, std::array<int64_t, 2> out_size);

// A stride-2 convolution (dilation 1, one group) as a stride-1 convolution over its input's 2 x 2 blocks ("space to
// depth"): the input (N, C, H, W), zero-padded by `padding` and by one more row or column where that leaves an odd
// size, becomes X (N, channels, ceil(Hp / 2), ceil(Wp / 2)) channels-last, block (i, j)'s element (a, b, c) at
// channel (2 a + b) C + c and the channels from 4 C on zero (space_to_depth_input); the weight, zero-padded to an
// even size, becomes (C_out, channels, ceil(KH / 2), ceil(KW / 2)) likewise through differentiable ops, so that its
// gradient (and the bias's) comes back through them. The input gets no gradient: the form is for inputs that need
// none (a network's first layer on its data). space_to_depth_applies: whether the blocks' convolution has conv2d's
// output size (it may be one larger, when the last block row would read only padding).
bool space_to_depth_applies(const Shape& input, const Shape& weight, Pair stride, Pair padding, Pair dilation,
                            int64_t groups);
Tensor space_to_depth_input(const Tensor& input, Pair padding, int64_t channels);
Tensor space_to_depth_conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, Pair padding,
                             int64_t channels);

// ChannelsLast for a 4-d tensor laid out NHWC (and not also plain contiguous), else Contiguous: the format the
// layer's output is given.
MemoryFormat output_format(const Tensor& input);

}  // namespace kiln::nn::detail
