// kiln/layers/window_internal.h — internal to kiln_layers (not installed API): the padding and sliding-window
// view that conv2d and the pooling functions compose from differentiable ops.
//
//   Tensor xp = detail::pad2d(x, {1, 1, 1, 1}, 0.0);                      // (N, C, H, W) -> (N, C, H + 2, W + 2)
//   Tensor win = detail::windows2d(xp, {3, 3}, {1, 1}, {1, 1}, {H, W});   // (N, C, H, W, 3, 3), a view of xp
#pragma once

#include <array>
#include <cstdint>

#include "kiln/tensor/tensor.h"

namespace kiln::nn::detail {

// (N, C, H, W) -> (N, C, top + H + bottom, left + W + right), contiguous, the border filled with `value`.
// Built with cat, so gradients flow back to the input (in-place writes into a recorded tensor are refused).
Tensor pad2d(const Tensor& input, std::array<int64_t, 4> top_bottom_left_right, double value);

// A view of the contiguous (N, C, Hp, Wp) `padded` with shape (N, C, OH, OW, KH, KW): element
// [n, c, i, j, a, b] is padded[n, c, i * sH + a * dH, j * sW + b * dW].
Tensor windows2d(const Tensor& padded, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                 std::array<int64_t, 2> dilation, std::array<int64_t, 2> out_size);

// ChannelsLast for a 4-d tensor laid out NHWC (and not also plain contiguous), else Contiguous: the format the
// layer's output is given.
MemoryFormat output_format(const Tensor& input);

}  // namespace kiln::nn::detail
