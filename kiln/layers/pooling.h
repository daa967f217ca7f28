// kiln/layers/pooling.h — 2-d pooling: max, average, adaptive average; functions and modules.
//
//   auto pool = std::make_shared<nn::MaxPool2d>(nn::Pool2dOptions{.kernel_size = 3, .stride = 2, .padding = 1});
//   Tensor y = (*pool)(x);                                   // (N, C, 112, 112) -> (N, C, 56, 56)
//   Tensor g = nn::adaptive_avg_pool2d(x, {1, 1});           // (N, C, H, W) -> (N, C, 1, 1)
//
// NCHW shapes (a 3-d input (C, H, W) is taken as one sample); output sizes and padding rules as PyTorch's
// (ceil_mode included). Max pooling pads with -inf, average pooling with zeros (counted unless
// count_include_pad is false). In max pooling the first maximum of a window (row-major) takes the whole
// gradient, as in PyTorch. CUDA tensors run kiln's kernels, NCHW or channels-last.
#pragma once

#include <optional>

#include "kiln/layers/conv.h"  // nn::Pair
#include "kiln/layers/module.h"

namespace kiln::nn {

// Options of max_pool2d and avg_pool2d (and their modules), as torch.nn.MaxPool2d's arguments.
struct Pool2dOptions {
  Pair kernel_size = 2;           // the window, {height, width}
  std::optional<Pair> stride{};   // default: kernel_size
  Pair padding = 0;               // at most half the kernel size
  bool ceil_mode = false;         // round the output size up rather than down (a last window may overhang)
  bool count_include_pad = true;  // average pooling only
};

// The maximum over each window of a floating-point (N, C, H, W) or unbatched (C, H, W) input, in its memory format.
Tensor max_pool2d(const Tensor& input, const Pool2dOptions& options);
// The mean over each window (padding counted with count_include_pad), inputs as max_pool2d's.
Tensor avg_pool2d(const Tensor& input, const Pool2dOptions& options);
// Output (N, C, out_h, out_w); cell (i, j) averages rows [floor(i H / out_h), ceil((i + 1) H / out_h)), and
// columns likewise, as PyTorch.
Tensor adaptive_avg_pool2d(const Tensor& input, Pair output_size);

// 2-D max pooling, as torch.nn.MaxPool2d.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Pool2dOptions options);  // checked at forward
  Tensor forward(const Tensor& input) override;
  Pool2dOptions options;  // as constructed
};

// 2-D average pooling, as torch.nn.AvgPool2d.
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Pool2dOptions options);  // checked at forward
  Tensor forward(const Tensor& input) override;
  Pool2dOptions options;  // as constructed
};

// Average pooling to a given output size, as torch.nn.AdaptiveAvgPool2d.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Pair output_size);  // kiln::Error unless both sizes are positive
  Tensor forward(const Tensor& input) override;
  Pair output_size;  // {out_h, out_w}
};

}  // namespace kiln::nn
