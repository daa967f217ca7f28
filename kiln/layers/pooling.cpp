// 2-d pooling (pooling.h) composed from differentiable ops: pad, take the sliding-window view
// (window_internal.h), reduce over the window dims. Output sizes, padding limits and divisors as PyTorch's.
#include "kiln/layers/pooling.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <vector>

#include "kiln/autograd/functions.h"  // kiln::amax, kiln::mean, kiln::cat, ...
#include "kiln/layers/window_internal.h"
#include "kiln/tensor/capture.h"  // capture::Op: the op recorded for ONNX export
#include "kiln/tensor/error.h"    // KILN_CHECK

#if KILN_WITH_CUDA
#include "kiln/autograd/function.h"    // autograd::Function
#include "kiln/layers/cuda/pooling.h"  // cuda_impl::max_pool2d_forward, ...
#endif

namespace kiln::nn {

namespace {

// The geometry of one spatial dim of a pooling: output size as PyTorch's pooling_output_shape, and the
// padding on the far side that the last (ceil-mode) window needs.
struct PoolDim {
  int64_t in, kernel, stride, pad, out, pad_far;
};

PoolDim pool_dim(const char* op, int64_t in, int64_t kernel, int64_t stride, int64_t pad, bool ceil_mode) {
  const int64_t span = in + 2 * pad - kernel + (ceil_mode ? stride - 1 : 0);
  // Floor division (span may be negative when the kernel is larger than the padded input).
  int64_t out = (span >= 0 ? span / stride : -((-span + stride - 1) / stride)) + 1;
  // In ceil mode the last window must start inside the input or the near padding.
  if (ceil_mode && out > 0 && (out - 1) * stride >= in + pad) --out;
  KILN_CHECK(out > 0, op, ": the input size ", in, " with padding ", pad, " is smaller than the kernel size ", kernel,
             ", so the output would be empty; use a smaller kernel or a larger input");
  const int64_t pad_far = std::max(pad, (out - 1) * stride + kernel - in - pad);
  return {in, kernel, stride, pad, out, pad_far};
}

struct Pool2dGeometry {
  bool unbatched;
  Tensor input;  // 4-d
  MemoryFormat format;
  PoolDim h, w;
};

Pool2dGeometry check_pool(const char* op, const Tensor& input, const Pool2dOptions& options) {
  KILN_CHECK(input.defined(), op, ": the input is an undefined tensor");
  KILN_CHECK(input.dim() == 4 || input.dim() == 3, op,
             ": expected a 4-d input (N, C, H, W) or a 3-d unbatched input (C, H, W), got shape ", input.shape());
  KILN_CHECK(input.is_floating_point(), op, ": expected a floating-point input, got ", input.dtype());
  const Pair stride = options.stride.value_or(options.kernel_size);
  for (size_t i = 0; i < 2; ++i) {
    KILN_CHECK(options.kernel_size[i] > 0 && stride[i] > 0, op, ": kernel_size and stride must be positive, got (",
               options.kernel_size[0], ", ", options.kernel_size[1], ") and (", stride[0], ", ", stride[1], ")");
    KILN_CHECK(options.padding[i] >= 0 && options.padding[i] <= options.kernel_size[i] / 2, op, ": padding (",
               options.padding[0], ", ", options.padding[1],
               ") must be non-negative and at most half the kernel size (", options.kernel_size[0], ", ",
               options.kernel_size[1], ")");
  }
  Pool2dGeometry g;
  g.unbatched = input.dim() == 3;
  g.input = g.unbatched ? unsqueeze(input, 0) : input;
  g.format = detail::output_format(g.input);
  g.h = pool_dim(op, g.input.size(2), options.kernel_size[0], stride[0], options.padding[0], options.ceil_mode);
  g.w = pool_dim(op, g.input.size(3), options.kernel_size[1], stride[1], options.padding[1], options.ceil_mode);
  return g;
}

// (N, C, OH, OW) in the input's format, without the batch dim for an unbatched input.
Tensor finish(const Pool2dGeometry& g, const Tensor& y) {
  const Tensor out = contiguous(y, g.format);
  return g.unbatched ? squeeze(out, 0) : out;
}

// (N, C, H, W) padded with `value` -> the window view (N, C, OH, OW, KH, KW).
Tensor pool_windows(const Pool2dGeometry& g, double value) {
  const Tensor padded = detail::pad2d(g.input, {g.h.pad, g.h.pad_far, g.w.pad, g.w.pad_far}, value);
  return detail::windows2d(padded, {g.h.kernel, g.w.kernel}, {g.h.stride, g.w.stride}, {1, 1}, {g.h.out, g.w.out});
}

// Per output index of one dim, the number of elements PyTorch's avg_pool divides by: the window clipped to
// [-pad, in + pad) when padding counts, else clipped to the input [0, in).
std::vector<double> divisors(const PoolDim& d, bool count_include_pad) {
  std::vector<double> out(static_cast<size_t>(d.out));
  for (int64_t i = 0; i < d.out; ++i) {
    int64_t start = i * d.stride - d.pad;
    int64_t end = std::min(start + d.kernel, d.in + d.pad);
    if (!count_include_pad) {
      start = std::max<int64_t>(start, 0);
      end = std::min(end, d.in);
    }
    out[static_cast<size_t>(i)] = static_cast<double>(end - start);
  }
  return out;
}

// One spatial dim of adaptive average pooling: (..., in, ...) -> (..., out, ...) along `dim`; cell i averages
// [floor(i in / out), ceil((i + 1) in / out)). Averages over rectangles are separable, so the dims go one by one.
Tensor adaptive_mean_dim(const Tensor& x, int64_t dim, int64_t out) {
  const int64_t in = x.size(dim);
  if (in == out) return x;
  if (in % out == 0) return mean(unflatten(x, dim, {out, in / out}), {dim + 1});
  std::vector<Tensor> cells;
  cells.reserve(static_cast<size_t>(out));
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = i * in / out;
    const int64_t end = ((i + 1) * in + out - 1) / out;
    cells.push_back(mean(narrow(x, dim, start, end - start), {dim}, /*keepdim=*/true));
  }
  return cat(cells, dim);
}

#if KILN_WITH_CUDA
// kiln's pooling kernels as autograd nodes (CUDA inputs). Their backward is not itself differentiable.
cuda_impl::PoolParams pool_params(const Pool2dGeometry& g, bool count_include_pad) {
  return {.kernel = {g.h.kernel, g.w.kernel},
          .stride = {g.h.stride, g.w.stride},
          .pad = {g.h.pad, g.w.pad},
          .out = {g.h.out, g.w.out},
          .count_include_pad = count_include_pad};
}

struct CudaMaxPool2d : autograd::Function<CudaMaxPool2d> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, const cuda_impl::PoolParams& p) {
    auto [y, indices] = cuda_impl::max_pool2d_forward(x, p);
    ctx.save_for_backward({x, indices});
    ctx.set("params", p);
    return y;
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const autograd::TensorList s = ctx.saved();
    return {cuda_impl::max_pool2d_backward(grads[0], s[1], ctx.get<cuda_impl::PoolParams>("params"), s[0])};
  }
};

struct CudaAvgPool2d : autograd::Function<CudaAvgPool2d> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, const cuda_impl::PoolParams& p) {
    ctx.save_for_backward({x});  // for its shape and layout only
    ctx.set("params", p);
    return cuda_impl::avg_pool2d_forward(x, p);
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    return {cuda_impl::avg_pool2d_backward(grads[0], ctx.get<cuda_impl::PoolParams>("params"), ctx.saved()[0])};
  }
};

struct CudaAdaptiveAvgPool2d : autograd::Function<CudaAdaptiveAvgPool2d> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, std::array<int64_t, 2> out) {
    ctx.save_for_backward({x});  // for its shape and layout only
    return cuda_impl::adaptive_avg_pool2d_forward(x, out);
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    return {cuda_impl::adaptive_avg_pool2d_backward(grads[0], ctx.saved()[0])};
  }
};
#endif

// A pooling call's arguments as a capture record holds them.
std::vector<capture::Attr> pool_attrs(const Pool2dOptions& o) {
  const Pair stride = o.stride.value_or(o.kernel_size);
  return {{"kernel_size", std::vector<int64_t>{o.kernel_size[0], o.kernel_size[1]}},
          {"stride", std::vector<int64_t>{stride[0], stride[1]}},
          {"padding", std::vector<int64_t>{o.padding[0], o.padding[1]}},
          {"ceil_mode", int64_t{o.ceil_mode}},
          {"count_include_pad", int64_t{o.count_include_pad}}};
}

}  // namespace

Tensor max_pool2d(const Tensor& input, const Pool2dOptions& options) {
  capture::Op cap("max_pool2d");
  const auto describe = [&] { return capture::Args{{input}, pool_attrs(options)}; };
  const Pool2dGeometry g = check_pool("max_pool2d", input, options);
#if KILN_WITH_CUDA
  if (g.input.is_cuda()) {
    const Tensor y = CudaMaxPool2d::apply(contiguous(g.input, g.format), pool_params(g, true));
    return cap.done(g.unbatched ? squeeze(y, 0) : y, describe);
  }
#endif
  // -inf padding never wins: every window overlaps the input (padding <= kernel / 2, ceil-mode rule).
  const Tensor win = pool_windows(g, -std::numeric_limits<double>::infinity());
  // (N, C, OH, OW, KH, KW) -> (N, C, OH, OW, KH KW) -> (N, C, OH, OW). max over one dim gives the whole gradient
  // to the first maximum of a window, as PyTorch and kiln's GPU kernel do (amax would split it between ties).
  const Tensor flat = reshape(win, {win.size(0), win.size(1), g.h.out, g.w.out, g.h.kernel * g.w.kernel});
  return cap.done(finish(g, std::get<0>(max(flat, 4))), describe);
}

Tensor avg_pool2d(const Tensor& input, const Pool2dOptions& options) {
  capture::Op cap("avg_pool2d");
  const auto describe = [&] { return capture::Args{{input}, pool_attrs(options)}; };
  const Pool2dGeometry g = check_pool("avg_pool2d", input, options);
#if KILN_WITH_CUDA
  if (g.input.is_cuda()) {
    const Tensor y = CudaAvgPool2d::apply(contiguous(g.input, g.format), pool_params(g, options.count_include_pad));
    return cap.done(g.unbatched ? squeeze(y, 0) : y, describe);
  }
#endif
  const Tensor win = pool_windows(g, 0.0);
  const std::vector<double> dh = divisors(g.h, options.count_include_pad);
  const std::vector<double> dw = divisors(g.w, options.count_include_pad);
  const double full_window = static_cast<double>(g.h.kernel * g.w.kernel);
  const bool uniform = std::all_of(dh.begin(), dh.end(), [&](double v) { return v == g.h.kernel; }) &&
                       std::all_of(dw.begin(), dw.end(), [&](double v) { return v == g.w.kernel; });
  if (uniform) return cap.done(finish(g, div(sum(win, {4, 5}), full_window)), describe);
  // The divisor (OH, OW), computed once on the host, broadcast over (N, C).
  std::vector<double> d(dh.size() * dw.size());
  for (size_t i = 0; i < dh.size(); ++i)
    for (size_t j = 0; j < dw.size(); ++j) d[i * dw.size() + j] = dh[i] * dw[j];
  const Tensor divisor = from_vector(d, {g.h.out, g.w.out}, g.input.device()).to(g.input.dtype());
  return cap.done(finish(g, div(sum(win, {4, 5}), divisor)), describe);
}

Tensor adaptive_avg_pool2d(const Tensor& input, Pair output_size) {
  capture::Op cap("adaptive_avg_pool2d");
  const auto describe = [&] {
    return capture::Args{{input}, {{"output_size", std::vector<int64_t>{output_size[0], output_size[1]}}}};
  };
  KILN_CHECK(input.defined(), "adaptive_avg_pool2d: the input is an undefined tensor");
  KILN_CHECK(input.dim() == 4 || input.dim() == 3,
             "adaptive_avg_pool2d: expected a 4-d input (N, C, H, W) or a 3-d unbatched input (C, H, W), got shape ",
             input.shape());
  KILN_CHECK(input.is_floating_point(), "adaptive_avg_pool2d: expected a floating-point input, got ", input.dtype());
  KILN_CHECK(output_size[0] > 0 && output_size[1] > 0, "adaptive_avg_pool2d: output_size must be positive, got (",
             output_size[0], ", ", output_size[1], ")");
  KILN_CHECK(input.size(-2) > 0 && input.size(-1) > 0, "adaptive_avg_pool2d: the input of shape ", input.shape(),
             " has an empty spatial dim");
#if KILN_WITH_CUDA
  if (input.is_cuda()) {
    const bool unbatched = input.dim() == 3;
    const Tensor x = unbatched ? unsqueeze(input, 0) : input;
    const Tensor y = CudaAdaptiveAvgPool2d::apply(contiguous(x, detail::output_format(x)),
                                                  std::array<int64_t, 2>{output_size[0], output_size[1]});
    return cap.done(unbatched ? squeeze(y, 0) : y, describe);
  }
#endif
  const MemoryFormat format = detail::output_format(input);
  const int64_t hd = input.dim() - 2;
  const Tensor y = adaptive_mean_dim(adaptive_mean_dim(input, hd, output_size[0]), hd + 1, output_size[1]);
  return cap.done(input.dim() == 4 ? contiguous(y, format) : contiguous(y), describe);
}

// ---------------------------------------------------------------- modules

MaxPool2d::MaxPool2d(Pool2dOptions options) : Module("MaxPool2d"), options(options) {}
Tensor MaxPool2d::forward(const Tensor& input) { return max_pool2d(input, options); }

AvgPool2d::AvgPool2d(Pool2dOptions options) : Module("AvgPool2d"), options(options) {}
Tensor AvgPool2d::forward(const Tensor& input) { return avg_pool2d(input, options); }

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Pair output_size) : Module("AdaptiveAvgPool2d"), output_size(output_size) {
  KILN_CHECK(output_size[0] > 0 && output_size[1] > 0, "AdaptiveAvgPool2d: output_size must be positive, got (",
             output_size[0], ", ", output_size[1], ")");
}
Tensor AdaptiveAvgPool2d::forward(const Tensor& input) { return adaptive_avg_pool2d(input, output_size); }

}  // namespace kiln::nn
