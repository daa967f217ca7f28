// The layers as functions (functional.h): composed of kiln's differentiable ops, with fused GPU kernels
// (kiln/layers/cuda/) for batch norm and layer norm.
#include "kiln/layers/functional.h"
#include "kiln/layers/autocast_ops.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>  // std::tie

#include "kiln/autograd/autocast.h"       // autocast::inputs for the fused GPU paths
#include "kiln/autograd/column_sums.h"    // offer_column_sums: a layer norm's x gradient summed for the Linear before
#include "kiln/autograd/function.h"       // autograd::Function: the fused GPU paths' nodes
#include "kiln/autograd/grad_mode.h"      // NoGradGuard for the running-statistics update
#include "kiln/autograd/node.h"           // Node, SavedTensor, make_node, set_history: dropout's node
#include "kiln/autograd/sparse_grad.h"    // accumulate_sparse_grad: sparse embedding lookups
#include "kiln/layers/fp8_linear.h"       // fp8_begin_input, fp8_offer_input: dropout_add_layer_norm's fp8_next
#include "kiln/layers/linear_backward.h"  // detail::linear_weight_bias_grads, linear_input_grad
#include "kiln/tensor/capture.h"          // capture::Op: the op recorded for ONNX export
#include "kiln/tensor/error.h"            // KILN_CHECK
#include "kiln/tensor/fp8_ops.h"          // internal::fp8_quantize
#if KILN_WITH_CUDA
#include "kiln/layers/cuda/batch_norm.h"  // cuda_impl::batch_norm_forward / _backward
#include "kiln/layers/cuda/layer_norm.h"  // the fused GPU layer norm
#endif

namespace kiln::nn {
namespace {

// (C) -> (1, C, 1, ..., 1) with `rank` dims, to broadcast a per-channel tensor over (N, C, *).
Tensor per_channel(const Tensor& t, int64_t rank) {
  Shape shape(static_cast<size_t>(rank), 1);
  shape[1] = t.numel();
  return reshape(t, shape);
}

// Every dim except the channel dim 1.
Dims all_but_channel(int64_t rank) {
  Dims dims{0};
  for (int64_t d = 2; d < rank; ++d) dims.push_back(d);
  return dims;
}

// Whether x's last dims are `shape`.
bool ends_with(const Tensor& x, const Shape& shape) {
  const auto k = static_cast<int64_t>(shape.size());
  bool match = x.dim() >= k;
  for (int64_t i = 0; match && i < k; ++i) match = x.size(x.dim() - k + i) == shape[static_cast<size_t>(i)];
  return match;
}

void check_affine(const char* op, const Tensor& t, const char* name, const Shape& expected) {
  if (!t.defined()) return;
  KILN_CHECK(t.shape() == expected, op, ": ", name, " has shape ", t.shape(), " but the input needs ", expected,
             "; pass a ", name, " of shape ", expected, " (or none)");
}

#if KILN_WITH_CUDA
// The 16-bit cast of a layer norm's float32 output that its kernel also writes (autocast::offer_cast): the dtype to
// write it in (none: not wanted) and where forward leaves it; and whether backward sums x's gradient's columns for
// the Linear before (autograd::offer_column_sums): not in an FP8 region, where that Linear's FP8 product sums them
// as it quantises the gradient.
struct OutputCast {
  std::optional<DType> dtype;
  Tensor* values = nullptr;
  bool sum_x_grad = true;
};

// Whether a layer norm on `device` offers its x gradient's column sums (OutputCast::sum_x_grad), asked before
// autocast is turned off for the op.
bool sums_worth_offering(Device device) { return autocast::fp8_recipe(device.type()) == nullptr; }

// y, offering the cast its kernel wrote where there is one (for the next product's autocast cast to take).
Tensor offering_cast(const Tensor& y, const Tensor& cast) {
  if (cast.defined()) autocast::offer_cast(y, cast);
  return y;
}

// Layer norm on the GPU: one kernel forward, saving the per-row mean and 1/std for backward.
struct LayerNormFunction : autograd::Function<LayerNormFunction> {
  // x (..., *normalized), weight and bias (*normalized) or undefined.
  static Tensor forward(autograd::Context& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Shape& normalized, double eps, const OutputCast& cast) {
    const int64_t d = numel(normalized);
    const Tensor xc = contiguous(x), wc = weight.defined() ? contiguous(weight) : weight;
    auto saved = cuda_impl::layer_norm_forward(xc, d, wc, bias.defined() ? contiguous(bias) : bias, eps, {}, nullptr,
                                               cast.dtype);
    *cast.values = saved.y_low;
    ctx.save_for_backward({xc, wc, saved.mean, saved.rstd});
    ctx.set("normalized", normalized);
    return saved.y;
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const autograd::TensorList s = ctx.saved();
    const auto normalized = ctx.get<Shape>("normalized");
    auto g = cuda_impl::layer_norm_backward(contiguous(grads[0]), s[0], numel(normalized), s[2], s[3], s[1],
                                            ctx.needs_input_grad(0), ctx.needs_input_grad(1), ctx.needs_input_grad(2));
    return {g.dx, g.dweight.defined() ? reshape(g.dweight, normalized) : Tensor(),
            g.dbias.defined() ? reshape(g.dbias, normalized) : Tensor()};
  }
};

// layer_norm(x + residual) on the GPU: the sum formed in the forward kernel and saved (the layer's input for
// backward), and backward writing the gradient once in the residual's dtype and once more in x's when that is lower.
struct AddLayerNormFunction : autograd::Function<AddLayerNormFunction> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, const Tensor& residual, const Tensor& weight,
                        const Tensor& bias, const Shape& normalized, double eps, const OutputCast& cast) {
    const int64_t d = numel(normalized);
    const Tensor wc = weight.defined() ? contiguous(weight) : weight;
    auto saved = cuda_impl::layer_norm_forward(contiguous(x), d, wc, bias.defined() ? contiguous(bias) : bias, eps,
                                               contiguous(residual), nullptr, cast.dtype);
    *cast.values = saved.y_low;
    ctx.save_for_backward({saved.sum, wc, saved.mean, saved.rstd});
    ctx.set("normalized", normalized);
    ctx.set("x_dtype", x.dtype());
    ctx.set("sum_x_grad", cast.sum_x_grad);
    return saved.y;
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const autograd::TensorList s = ctx.saved();
    const auto normalized = ctx.get<Shape>("normalized");
    const auto x_dtype = ctx.get<DType>("x_dtype");
    const bool need_dx = ctx.needs_input_grad(0) || ctx.needs_input_grad(1);
    auto g = cuda_impl::layer_norm_backward(contiguous(grads[0]), s[0], numel(normalized), s[2], s[3], s[1], need_dx,
                                            ctx.needs_input_grad(2), ctx.needs_input_grad(3),
                                            ctx.needs_input_grad(0) ? std::optional<DType>(x_dtype) : std::nullopt, {},
                                            0, ctx.needs_input_grad(0) && ctx.get<bool>("sum_x_grad"));
    Tensor dx = ctx.needs_input_grad(0) ? (g.dx_low.defined() ? g.dx_low : g.dx) : Tensor();
    autograd::offer_column_sums(dx, g.dx_sums);  // the bias gradient of the Linear whose output x is
    return {dx, ctx.needs_input_grad(1) ? g.dx : Tensor(),
            g.dweight.defined() ? reshape(g.dweight, normalized) : Tensor(),
            g.dbias.defined() ? reshape(g.dbias, normalized) : Tensor()};
  }
};

// add_layer_norm(dropout(x), residual) on the GPU: the forward kernel draws the mask (internal::dropout's, from one
// draw of the generator: internal::draw_for, so that a CUDA graph's replays draw anew) and saves it as keep bits;
// backward is add_layer_norm's, writing x's gradient through the mask.
// The FP8 codes of the output asked of the fused kernel (dropout_add_layer_norm's fp8_next), and whether it wrote them.
struct OutputFp8 {
  const cuda_impl::Fp8Output* out = nullptr;  // null: none asked for
  bool* written = nullptr;
};

struct DropoutAddLayerNormFunction : autograd::Function<DropoutAddLayerNormFunction> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, const Tensor& residual, const Tensor& weight,
                        const Tensor& bias, const Shape& normalized, double eps, double p, Generator* gen,
                        const OutputCast& cast, const OutputFp8& fp8) {
    const int64_t d = numel(normalized);
    const Tensor wc = weight.defined() ? contiguous(weight) : weight;
    cuda_impl::FusedDropout dropout{.p = p};
    if (x.numel() > 0)
      dropout.draw = internal::draw_for(gen, x.device());  // as internal::dropout: no draw for no elements
    auto saved = cuda_impl::layer_norm_forward(contiguous(x), d, wc, bias.defined() ? contiguous(bias) : bias, eps,
                                               contiguous(residual), &dropout, cast.dtype, fp8.out);
    *cast.values = saved.y_low;
    if (fp8.written != nullptr) *fp8.written = saved.fp8_written;
    ctx.save_for_backward({saved.sum, wc, saved.mean, saved.rstd, saved.keep});
    ctx.set("normalized", normalized);
    ctx.set("x_dtype", x.dtype());
    ctx.set("p", p);
    ctx.set("sum_x_grad", cast.sum_x_grad);
    return saved.y;
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const autograd::TensorList s = ctx.saved();
    const auto normalized = ctx.get<Shape>("normalized");
    const bool need_dx = ctx.needs_input_grad(0) || ctx.needs_input_grad(1);
    auto g = cuda_impl::layer_norm_backward(
        contiguous(grads[0]), s[0], numel(normalized), s[2], s[3], s[1], need_dx, ctx.needs_input_grad(2),
        ctx.needs_input_grad(3),
        ctx.needs_input_grad(0) ? std::optional<DType>(ctx.get<DType>("x_dtype")) : std::nullopt, s[4],
        ctx.get<double>("p"), ctx.needs_input_grad(0) && ctx.get<bool>("sum_x_grad"));
    if (ctx.needs_input_grad(0)) autograd::offer_column_sums(g.dx_low, g.dx_sums);  // for the Linear before
    return {ctx.needs_input_grad(0) ? g.dx_low : Tensor(), ctx.needs_input_grad(1) ? g.dx : Tensor(),
            g.dweight.defined() ? reshape(g.dweight, normalized) : Tensor(),
            g.dbias.defined() ? reshape(g.dbias, normalized) : Tensor()};
  }
};

// The residual, weight and bias that add_layer_norm's fused GPU path normalises with (cast as layer_norm casts them:
// Float32 under autocast), or nothing where that path does not take (x, residual).
struct FusedAddInputs {
  Tensor residual, weight, bias;
};
std::optional<FusedAddInputs> fused_add_inputs(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                               const Tensor& weight_in, const Tensor& bias_in) {
  if (normalized_shape.empty() || !ends_with(x, normalized_shape) || !x.is_cuda() || residual.device() != x.device() ||
      numel(normalized_shape) > 1024)
    return std::nullopt;
  // The layer's own dtype: what layer_norm would normalise (Float32 under autocast). The residual must already
  // have it, and x either has it too or is 16-bit onto a Float32 residual.
  auto [r, weight, bias] = autocast::inputs(autocast_ops::layer_norm(), residual, weight_in, bias_in);
  const DType dt = r.dtype();
  const bool low_x = (x.dtype() == DType::BFloat16 || x.dtype() == DType::Float16) && dt == DType::Float32;
  auto fits = [&](const Tensor& t) { return !t.defined() || (t.dtype() == dt && t.device() == x.device()); };
  if (residual.dtype() != dt || !is_floating_point(dt) || !(low_x || x.dtype() == dt) || !fits(weight) || !fits(bias))
    return std::nullopt;
  check_affine("add_layer_norm", weight, "weight", normalized_shape);
  check_affine("add_layer_norm", bias, "bias", normalized_shape);
  return FusedAddInputs{r, weight, bias};
}
#endif

#if KILN_WITH_CUDA
// What the CUDA batch norm needs besides its differentiable inputs (x, weight, bias).
struct BatchNormArgs {
  Tensor running_mean, running_var;
  bool training;
  double momentum, eps;
  bool relu;
  Tensor num_batches_tracked;  // training: +1 in the statistics kernel, where defined
};

// kiln's batch-norm kernels as one autograd node: forward saves the statistics it normalised with (and, when ReLU is
// fused, its mask: bits from the kernels, or the output, whose sign masks the gradient); backward is one reduction
// and one elementwise pass.
// residual (undefined, or x's shape and dtype) is added before the ReLU; its gradient, the masked dy, comes from
// the same elementwise pass as dx.
struct CudaBatchNorm : autograd::Function<CudaBatchNorm> {
  static Tensor forward(autograd::Context& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& residual, const BatchNormArgs& args) {
    cuda_impl::BatchNormForward out =
        cuda_impl::batch_norm_forward(x, weight, bias, args.running_mean, args.running_var, args.training,
                                      args.momentum, args.eps, args.relu, residual, args.num_batches_tracked);
    // The fused ReLU's mask: its bits where the kernels made them (inputs read 16 bytes at a time), else the output's
    // sign.
    const Tensor y_for_mask = args.relu && !out.relu_mask.defined() ? out.y : Tensor();
    ctx.save_for_backward({x, weight, y_for_mask, out.mean, out.invstd, out.relu_mask});
    ctx.set("training", args.training);
    ctx.set("bias_dtype", bias.defined() ? bias.dtype() : DType::Float32);
    return out.y;
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const autograd::TensorList s = ctx.saved();
    const Tensor &x = s[0], &weight = s[1], &y = s[2], &mean = s[3], &invstd = s[4], &relu_mask = s[5];
    const cuda_impl::BatchNormNeeds needs{ctx.needs_input_grad(0), ctx.needs_input_grad(1), ctx.needs_input_grad(2),
                                          ctx.needs_input_grad(3)};
    cuda_impl::BatchNormGrads g = cuda_impl::batch_norm_backward(grads[0], x, y, relu_mask, weight, mean, invstd,
                                                                 ctx.get<bool>("training"), needs);
    if (g.weight.defined()) g.weight = g.weight.to(weight.dtype());
    if (g.bias.defined()) g.bias = g.bias.to(ctx.get<DType>("bias_dtype"));
    return {g.input, g.weight, g.bias, g.residual};
  }
};

// Whether kiln's kernels take this batch norm: CUDA, (N, C), (N, C, L) or (N, C, H, W), floating, not empty,
// and the per-channel tensors on x's device (anything else takes the composed path, which reports errors).
bool cuda_batch_norm_applies(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                             const Tensor& weight, const Tensor& bias) {
  if (!x.is_cuda() || x.dim() < 2 || x.dim() > 4 || !x.is_floating_point() || x.numel() == 0) return false;
  for (const Tensor* t : {&running_mean, &running_var, &weight, &bias}) {
    if (t->defined() && (t->device() != x.device() || !t->is_floating_point())) return false;
  }
  if (running_mean.defined() &&
      (running_mean.dtype() != running_var.dtype() || !running_mean.is_contiguous() || !running_var.is_contiguous()))
    return false;
  return true;
}
#endif

// The checks both paths share; returns the values per channel.
int64_t check_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                         const Tensor& bias, bool training, const Tensor& num_batches_tracked) {
  if (num_batches_tracked.defined()) {
    KILN_CHECK(num_batches_tracked.numel() == 1 && num_batches_tracked.dtype() == DType::Int64,
               "batch_norm: num_batches_tracked must be a 1-element Int64 tensor (BatchNorm's buffer), got ",
               num_batches_tracked.shape(), " ", num_batches_tracked.dtype());
  }
  KILN_CHECK(x.dim() >= 2, "batch_norm: the input must be (N, C) or (N, C, *), got shape ", x.shape());
  const int64_t c = x.size(1);
  check_affine("batch_norm", weight, "weight", {c});
  check_affine("batch_norm", bias, "bias", {c});
  check_affine("batch_norm", running_mean, "running_mean", {c});
  check_affine("batch_norm", running_var, "running_var", {c});
  KILN_CHECK(running_mean.defined() == running_var.defined(),
             "batch_norm: pass both running_mean and running_var, or neither");
  const int64_t count = x.numel() / std::max<int64_t>(c, 1);  // values per channel
  if (training) {
    KILN_CHECK(count > 1, "batch_norm: training needs more than 1 value per channel, got input shape ", x.shape(),
               "; use a larger batch or eval()");
  } else {
    KILN_CHECK(running_mean.defined(),
               "batch_norm: eval mode needs running_mean and running_var; pass them, or training = true");
  }
  return count;
}

// On CUDA: kiln's kernels (ReLU fused when asked, the residual added before it when defined; it must then have
// x's shape, dtype and device); elsewhere: undefined, and the caller composes.
// (batch_norm / batch_norm_relu / batch_norm_add_relu have applied autocast already.)
// In training they add 1 to num_batches_tracked where it is defined (in the statistics kernel).
Tensor batch_norm_kernels(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                          const Tensor& bias, bool training, double momentum, double eps, bool relu,
                          const Tensor& num_batches_tracked, const Tensor& residual = {}) {
#if KILN_WITH_CUDA
  if (x.is_cuda()) {
    if (cuda_batch_norm_applies(x, running_mean, running_var, weight, bias) &&
        (!num_batches_tracked.defined() || num_batches_tracked.device() == x.device())) {
      return CudaBatchNorm::apply(
          x, weight, bias, residual,
          BatchNormArgs{running_mean, running_var, training, momentum, eps, relu, num_batches_tracked});
    }
  }
#else
  (void)x, (void)running_mean, (void)running_var, (void)weight, (void)bias, (void)training, (void)momentum, (void)eps,
      (void)relu, (void)num_batches_tracked, (void)residual;
#endif
  return Tensor();
}

}  // namespace

static Tensor linear_as_one_op(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  KILN_CHECK(weight.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got shape ", weight.shape());
  KILN_CHECK(x.dim() >= 1, "linear: the input must have at least 1 dim (..., in_features), got a 0-d tensor");
  const int64_t in = weight.size(1), out = weight.size(0);
  KILN_CHECK(x.size(-1) == in, "linear: the input's last dim must be in_features = ", in, " (weight shape ",
             weight.shape(), "), got input shape ", x.shape());
  if (bias.defined()) {
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == out, "linear: bias must have shape [", out, "] (out_features), got ",
               bias.shape());
  }
  if (x.dim() == 2) {
    // (N, in) x (in, out) -> (N, out), bias fused into the GEMM.
    return bias.defined() ? addmm(bias, x, weight.t()) : mm(x, weight.t());
  }
  if (x.dim() == 1) {
    Tensor y = matmul(x, weight.t());  // (in) -> (out)
    return bias.defined() ? y + bias : y;
  }
  // (..., in) -> (M, in) -> (M, out) -> (..., out)
  Shape out_shape = x.shape();
  out_shape.back() = out;
  Tensor x2 = reshape(x, {-1, in});
  Tensor y = bias.defined() ? addmm(bias, x2, weight.t()) : mm(x2, weight.t());
  return reshape(y, out_shape);
}

namespace detail {

std::pair<Tensor, Tensor> linear_weight_bias_grads(const Tensor& g2, const Tensor& x2, bool want_w, bool want_b,
                                                   DType w_dtype, DType b_dtype) {
  const Tensor gt = internal::transpose(g2, 0, 1);  // (out, M)
  const Tensor offered = want_b ? autograd::take_column_sums(g2) : Tensor();
  if (want_w && want_b && !offered.defined()) {
    auto [dw, sums] = internal::mm_with_row_sums(gt, x2, w_dtype);  // (out, in), (out)
    return {dw, internal::cast(sums, b_dtype)};                     // sums itself where already in b_dtype
  }
  Tensor dw, db;
  if (want_w) dw = internal::mm(gt, x2, w_dtype);
  if (want_b) db = offered.defined() ? internal::cast(offered, b_dtype) : internal::sum(g2, {0}, false, b_dtype);
  return {dw, db};
}

Tensor linear_input_grad(const Tensor& g2, const Tensor& w, const Tensor& sum, const Shape& x_shape, DType x_dtype) {
  if (x_dtype == DType::Float32 && sum.defined() && sum.dtype() == DType::Float32 && sum.shape() == x_shape &&
      sum.is_contiguous()) {
    Tensor rows = internal::reshape(sum, {-1, w.size(1)});
    internal::addmm_(rows, g2, w);
    return sum;
  }
  return internal::reshape(internal::mm(g2, w, x_dtype), x_shape);
}

}  // namespace detail

namespace {

// nn::linear where autocast computes it in 16 bits from a float32 x (an activation of the float32 residual stream,
// say): one node instead of the cast of x, its reshape, the product and the reshape back. It takes x itself, so that
// x's gradient goes straight to x's slot, and adds dX (a widening product: float32 sums of 16-bit factors) into the
// float32 sum x's other uses began there (a residual connection's) in place, where the engine offers it. The 16-bit
// values of x (the cast a layer norm offers, or a new one) come as values, with no history of their own; the weight
// and bias are autocast's casts of the parameters (their histories reach the float32 parameters, in float32).
struct SixteenBitInput {
  Tensor values;  // x cast to the product's dtype, no history
};

struct AutocastLinearFunction : autograd::Function<AutocastLinearFunction> {
  static constexpr bool kAddsIntoGradientSums = true;

  // x (..., in) float32; w (out, in) and b (out) (or undefined) in the product's dtype; xv x's values in that dtype.
  static Tensor forward(autograd::Context& ctx, const Tensor& x, const Tensor& w, const Tensor& b,
                        const SixteenBitInput& xv) {
    const int64_t in = w.size(1), out = w.size(0);
    const Tensor x2 = internal::reshape(xv.values, {-1, in});  // (M, in)
    const Tensor y = b.defined() ? internal::addmm(b, x2, internal::transpose(w, 0, 1))
                                 : internal::mm(x2, internal::transpose(w, 0, 1));
    // What each gradient needs: W for dX, x's 16-bit values for dW.
    ctx.save_for_backward(
        {ctx.needs_input_grad(0) ? w : Tensor(), ctx.needs_input_grad(1) || ctx.needs_input_grad(2) ? x2 : Tensor()});
    ctx.set("x_shape", x.shape());
    Shape out_shape = x.shape();
    out_shape.back() = out;
    return internal::reshape(y, out_shape);
  }

  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const autograd::TensorList saved = ctx.saved();
    const auto x_shape = ctx.get<Shape>("x_shape");
    const Tensor& g = grads[0];
    const Tensor g2 = internal::reshape(g, {-1, g.size(-1)});  // (M, out)
    Tensor dx, dw, db;
    // dX added into the sum x's other uses began, where the engine offers it (then the engine adds nothing).
    if (ctx.needs_input_grad(0))
      dx = detail::linear_input_grad(g2, saved[0], ctx.gradient_sum(0), x_shape, DType::Float32);
    const bool want_w = ctx.needs_input_grad(1), want_b = ctx.needs_input_grad(2);
    if (want_w || want_b) {
      // In float32 where the parameter's cast takes its gradient so (the float32 sums of the product, unrounded).
      const auto dtype_for = [&](size_t i) {
        return ctx.gradient_dtype_wanted(i) == DType::Float32 ? DType::Float32 : g.dtype();
      };
      std::tie(dw, db) = detail::linear_weight_bias_grads(g2, saved[1], want_w, want_b, dtype_for(1), dtype_for(2));
    }
    return {dx, dw, db};
  }
};

// out = x * mask: the gradient is g * mask, one multiply (mask holds 0 or 1 / (1 - p) in x's dtype).
struct DropoutBackward final : autograd::Node {
  autograd::SavedTensor mask;
  std::string_view name() const override { return "DropoutBackward"; }
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    return {internal::mul(grads[0], mask.unpack(*this))};
  }
  void release_saved() override { mask.reset(); }
};

}  // namespace

static Tensor dropout_as_one_op(const Tensor& x, double p, bool training, Generator* gen) {
  KILN_CHECK(p >= 0 && p < 1, "dropout: p must lie in [0, 1), got ", p,
             " (p is the probability of zeroing an element)");
  if (!training || p == 0) return x;
  KILN_CHECK(x.is_floating_point(), "dropout: the input must be floating point, got ", x.dtype());
  // One kernel draws the mask (exactly bernoulli(1 - p)'s, scaled by 1 / (1 - p), from one draw of gen),
  // keeps it and writes x * mask: the expected value of each element is unchanged.
  auto [out, mask] = internal::dropout(x, p, gen);
  if (autograd::needs_grad(x)) {
    auto node = autograd::make_node<DropoutBackward>(x);
    node->mask = autograd::SavedTensor(mask, /*is_output=*/false);
    autograd::set_history(out, node);
  }
  return out;
}

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in, const Tensor& bias_in,
                  double eps) {
  capture::Op cap("layer_norm");
  const auto describe = [&] {
    return capture::Args{{x_in, weight_in, bias_in}, {{"normalized_shape", normalized_shape}, {"eps", eps}}};
  };
  // Under autocast the whole layer runs in float32 (Policy::Float32), on every device.
  auto [x, weight, bias] = autocast::inputs(autocast_ops::layer_norm(), x_in, weight_in, bias_in);
#if KILN_WITH_CUDA
  const std::optional<DType> offer = autocast::cast_worth_offering(x.device());  // before autocast is off
#endif
  autocast::DisableGuard as_one_op;  // the ops inside run as cast, as one op of the table
  const auto k = static_cast<int64_t>(normalized_shape.size());
  KILN_CHECK(k >= 1, "layer_norm: normalized_shape must name at least one dim");
  KILN_CHECK(ends_with(x, normalized_shape), "layer_norm: the input's last ", k, " dims must be normalized_shape ",
             normalized_shape, ", got input shape ", x.shape());
  check_affine("layer_norm", weight, "weight", normalized_shape);
  check_affine("layer_norm", bias, "bias", normalized_shape);
#if KILN_WITH_CUDA
  if (x.is_cuda() && x.is_floating_point() && (!weight.defined() || weight.device() == x.device()) &&
      (!bias.defined() || bias.device() == x.device())) {
    if ((!weight.defined() || weight.dtype() == x.dtype()) && (!bias.defined() || bias.dtype() == x.dtype())) {
      Tensor cast;
      const Tensor y = LayerNormFunction::apply(x, weight, bias, normalized_shape, eps, OutputCast{offer, &cast});
      return cap.done(offering_cast(y, cast), describe);
    }
  }
#endif
  Dims dims;
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) dims.push_back(d);
  Tensor centered = x - mean(x, dims, true);        // (..., *normalized_shape)
  Tensor var = mean(square(centered), dims, true);  // biased, (..., 1, ..., 1)
  Tensor y = centered * rsqrt(var + eps);
  if (weight.defined()) y = y * weight;  // broadcasts over the leading dims
  if (bias.defined()) y = y + bias;
  return cap.done(y, describe);
}

Tensor add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape, const Tensor& weight_in,
                      const Tensor& bias_in, double eps) {
  capture::Op cap("add_layer_norm");
  const auto describe = [&] {
    return capture::Args{{x, residual, weight_in, bias_in}, {{"normalized_shape", normalized_shape}, {"eps", eps}}};
  };
  KILN_CHECK(x.defined() && residual.defined(), "add_layer_norm: x and residual must be defined tensors");
  KILN_CHECK(x.shape() == residual.shape(), "add_layer_norm: x and residual must have one shape, got ", x.shape(),
             " and ", residual.shape(), "; add them and call layer_norm to broadcast");
#if KILN_WITH_CUDA
  if (auto in = fused_add_inputs(x, residual, normalized_shape, weight_in, bias_in)) {
    const std::optional<DType> offer = autocast::cast_worth_offering(x.device());  // before autocast is off
    const bool sums = sums_worth_offering(x.device());
    autocast::DisableGuard as_one_op;
    Tensor cast;
    const Tensor y = AddLayerNormFunction::apply(x, in->residual, in->weight, in->bias, normalized_shape, eps,
                                                 OutputCast{offer, &cast, sums});
    return cap.done(offering_cast(y, cast), describe);
  }
#endif
  return cap.done(layer_norm(x + residual, normalized_shape, weight_in, bias_in, eps), describe);
}

// y with its FP8 codes offered to the product with `state` (dropout_add_layer_norm's fp8_next): the codes the kernel
// wrote (`written`), or y quantised now.
static Tensor offering_fp8(const Tensor& y, amp::Fp8ScalingState* state, std::optional<Fp8InputCodes>& codes,
                           bool written) {
  if (!codes) return y;
  if (!written) {
    const int64_t in = y.size(-1);
    codes->codes = internal::fp8_quantize(internal::reshape(contiguous(y.detach()), {y.numel() / in, in}),
                                          codes->codes.dtype(), codes->input_scale, codes->input_amax);
  }
  fp8_offer_input(y, *state, std::move(*codes));
  return y;
}

Tensor dropout_add_layer_norm(const Tensor& x_in, const Tensor& residual, double p, bool training,
                              const Shape& normalized_shape, const Tensor& weight, const Tensor& bias, double eps,
                              Generator* gen, amp::Fp8ScalingState* fp8_next) {
  capture::Op cap("dropout_add_layer_norm");
  const auto describe = [&] {
    return capture::Args{
        {x_in, residual, weight, bias},
        {{"p", p}, {"training", int64_t{training}}, {"normalized_shape", normalized_shape}, {"eps", eps}}};
  };
  // Every check before the draw, so that a bad call leaves the generator as it was.
  KILN_CHECK(p >= 0 && p < 1, "dropout_add_layer_norm: p must lie in [0, 1), got ", p,
             " (p is the probability of zeroing an element of x)");
  KILN_CHECK(x_in.defined() && residual.defined(), "dropout_add_layer_norm: x and residual must be defined tensors");
  KILN_CHECK(x_in.shape() == residual.shape(), "dropout_add_layer_norm: x and residual must have one shape, got ",
             x_in.shape(), " and ", residual.shape(), "; call dropout, add them and call layer_norm to broadcast");
  KILN_CHECK(x_in.device() == residual.device(), "dropout_add_layer_norm: x is on ", x_in.device(), " but residual on ",
             residual.device(), "; move them to one device");
  const auto k = static_cast<int64_t>(normalized_shape.size());
  KILN_CHECK(k >= 1 && ends_with(x_in, normalized_shape), "dropout_add_layer_norm: the input's last ", k,
             " dims must be normalized_shape ", normalized_shape, " (at least one dim), got input shape ",
             x_in.shape());
  check_affine("dropout_add_layer_norm", weight, "weight", normalized_shape);
  check_affine("dropout_add_layer_norm", bias, "bias", normalized_shape);
  if (!training || p == 0)
    return cap.done(add_layer_norm(x_in, residual, normalized_shape, weight, bias, eps), describe);
  KILN_CHECK(x_in.is_floating_point() && residual.is_floating_point(),
             "dropout_add_layer_norm: x and residual must be floating point, got ", x_in.dtype(), " and ",
             residual.dtype(), "; convert them with .to(DType::Float32) first");
  // The next FP8 product's step begins here where its input's codes can be made here (fp8_begin_input).
  std::optional<Fp8InputCodes> codes;
  if (fp8_next != nullptr) codes = fp8_begin_input(*fp8_next, x_in.shape(), x_in.device());
#if KILN_WITH_CUDA
  {
    auto [x] = autocast::inputs(autocast_ops::dropout(), x_in);  // as nn::dropout casts it
    if (auto in = fused_add_inputs(x, residual, normalized_shape, weight, bias);
        in && in->residual.dtype() != DType::Float64) {
      const std::optional<DType> offer = autocast::cast_worth_offering(x.device());
      const bool sums = sums_worth_offering(x.device());
      autocast::DisableGuard as_one_op;
      Tensor cast;
      std::optional<cuda_impl::Fp8Output> fp8_out;
      if (codes) fp8_out = cuda_impl::Fp8Output{codes->codes, codes->input_scale, codes->input_amax};
      bool written = false;
      const Tensor y = DropoutAddLayerNormFunction::apply(x, in->residual, in->weight, in->bias, normalized_shape, eps,
                                                          p, gen, OutputCast{offer, &cast, sums},
                                                          OutputFp8{fp8_out ? &*fp8_out : nullptr, &written});
      return cap.done(offering_fp8(offering_cast(y, cast), fp8_next, codes, written), describe);
    }
  }
#endif
  const Tensor y = add_layer_norm(dropout(x_in, p, true, gen), residual, normalized_shape, weight, bias, eps);
  return cap.done(offering_fp8(y, fp8_next, codes, false), describe);
}

Tensor group_norm(const Tensor& x_in, int64_t num_groups, const Tensor& weight_in, const Tensor& bias_in, double eps) {
  capture::Op cap("group_norm");
  auto [x, weight, bias] =
      autocast::inputs(autocast_ops::group_norm(), x_in, weight_in, bias_in);  // float32 under autocast
  autocast::DisableGuard as_one_op;
  KILN_CHECK(x.dim() >= 2, "group_norm: the input must be (N, C, *), got shape ", x.shape());
  const int64_t n = x.size(0), c = x.size(1);
  KILN_CHECK(num_groups > 0 && c % num_groups == 0, "group_norm: the number of channels C = ", c,
             " must be divisible by num_groups = ", num_groups, " (input shape ", x.shape(), ")");
  check_affine("group_norm", weight, "weight", {c});
  check_affine("group_norm", bias, "bias", {c});
  // (N, C, *) -> (N, G, C/G * prod(*)): each group of a sample is one row.
  Tensor g = reshape(x, {n, num_groups, -1});
  Tensor centered = g - mean(g, {2}, true);
  Tensor var = mean(square(centered), {2}, true);
  Tensor y = reshape(centered * rsqrt(var + eps), x.shape());
  if (weight.defined()) y = y * per_channel(weight, x.dim());
  if (bias.defined()) y = y + per_channel(bias, x.dim());
  return cap.done(y, [&] {
    return capture::Args{{x_in, weight_in, bias_in}, {{"num_groups", num_groups}, {"eps", eps}}};
  });
}

static Tensor batch_norm_as_one_op(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                                   const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                                   const Tensor& num_batches_tracked) {
  const int64_t count = check_batch_norm(x, running_mean, running_var, weight, bias, training, num_batches_tracked);
  if (Tensor y = batch_norm_kernels(x, running_mean, running_var, weight, bias, training, momentum, eps, false,
                                    num_batches_tracked);
      y.defined())
    return y;
  const int64_t c = x.size(1);
  const Dims dims = all_but_channel(x.dim());
  Tensor y;
  if (training) {
    if (num_batches_tracked.defined()) {
      NoGradGuard no_grad;
      Tensor counter = num_batches_tracked;
      counter.add_(1);
    }
    Tensor batch_mean = mean(x, dims, true);  // (1, C, 1, ...)
    Tensor centered = x - batch_mean;
    Tensor batch_var = mean(square(centered), dims, true);  // biased
    y = centered * rsqrt(batch_var + eps);
    if (running_mean.defined()) {
      NoGradGuard no_grad;
      Tensor rm = running_mean, rv = running_var;  // handles share the buffers
      Tensor m = reshape(batch_mean.detach(), {c}).to(rm.dtype());
      Tensor v = (reshape(batch_var.detach(), {c}) * (static_cast<double>(count) / static_cast<double>(count - 1)))
                     .to(rv.dtype());
      rm.mul_(1 - momentum).add_(m, momentum);
      rv.mul_(1 - momentum).add_(v, momentum);
    }
  } else {
    Tensor m = per_channel(running_mean, x.dim()).to(x.dtype());
    Tensor v = per_channel(running_var, x.dim()).to(x.dtype());
    y = (x - m) * rsqrt(v + eps);
  }
  if (weight.defined()) y = y * per_channel(weight, x.dim());
  if (bias.defined()) y = y + per_channel(bias, x.dim());
  // A 16-bit input with float32 parameters computes in float32 and returns the input's dtype, as PyTorch and the
  // GPU kernels do (what mixed precision relies on: batch norm keeps the activations' dtype).
  if ((x.dtype() == DType::Float16 || x.dtype() == DType::BFloat16) && y.dtype() != x.dtype()) y = y.to(x.dtype());
  return y;
}

static Tensor batch_norm_relu_as_one_op(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                                        const Tensor& weight, const Tensor& bias, bool training, double momentum,
                                        double eps, const Tensor& num_batches_tracked) {
  check_batch_norm(x, running_mean, running_var, weight, bias, training, num_batches_tracked);
  if (Tensor y = batch_norm_kernels(x, running_mean, running_var, weight, bias, training, momentum, eps, true,
                                    num_batches_tracked);
      y.defined())
    return y;
  return relu(
      batch_norm_as_one_op(x, running_mean, running_var, weight, bias, training, momentum, eps, num_batches_tracked));
}

static Tensor batch_norm_add_relu_as_one_op(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                                            const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                                            bool training, double momentum, double eps,
                                            const Tensor& num_batches_tracked) {
  KILN_CHECK(x.defined() && residual.defined(), "batch_norm_add_relu: x and residual must be defined tensors");
  KILN_CHECK(residual.shape() == x.shape(), "batch_norm_add_relu: the residual must have the input's shape ", x.shape(),
             ", got ", residual.shape(), "; to broadcast it, compose relu(batch_norm(x, ...) + residual)");
  KILN_CHECK(residual.device() == x.device(), "batch_norm_add_relu: the input (", x.shape(), ") is on ", x.device(),
             " but the residual (", residual.shape(), ") is on ", residual.device(), "; move the residual with .to(",
             x.device(), ")");
  check_batch_norm(x, running_mean, running_var, weight, bias, training, num_batches_tracked);
  // Fused when the sum stays in x's dtype (batch norm's output dtype on the GPU), i.e. the residual has it.
  if (residual.dtype() == x.dtype()) {
    if (Tensor y = batch_norm_kernels(x, running_mean, running_var, weight, bias, training, momentum, eps, true,
                                      num_batches_tracked, residual);
        y.defined())
      return y;
  }
  return relu(
      batch_norm_as_one_op(x, running_mean, running_var, weight, bias, training, momentum, eps, num_batches_tracked) +
      residual);
}

// nn::linear as one AutocastLinearFunction, where it applies: autocast computes a Linear on x's device in 16 bits, x
// is a float32 tensor whose gradient is wanted, with at least 2 dims and elements, and the weight and bias fit it
// (any other case, errors included, takes the composed path). Undefined where it does not apply.
static Tensor linear_from_float32(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (x.dtype() != DType::Float32 || x.dim() < 2 || x.numel() == 0 || !autograd::needs_grad(x)) return {};
  const std::optional<DType> dtype = autocast::target_dtype(autocast_ops::linear(), x.device(), DType::Float32);
  if (dtype != DType::BFloat16 && dtype != DType::Float16) return {};
  const auto fits = [&](const Tensor& t) {
    return is_floating_point(t.dtype()) && !is_float8(t.dtype()) && t.device() == x.device();
  };
  if (weight.dim() != 2 || weight.size(1) != x.size(-1) || weight.size(0) == 0 || !fits(weight)) return {};
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0) || !fits(bias))) return {};
  const Tensor wc = autocast::cast_to(weight, *dtype), bc = autocast::cast_to(bias, *dtype);
  SixteenBitInput xv;
  {
    NoGradGuard values_only;  // the cast's values: the function's node is the only one x's gradient passes
    xv.values = autocast::cast_to(x, *dtype).detach();
  }
  autocast::DisableGuard as_one_op;
  return AutocastLinearFunction::apply(x, wc, bc, xv);
}

// The layers made of several ops run as one op of the autocast table: inputs cast by the layer's policy, then
// the ops inside with autocast off (as PyTorch runs a composite op below its autocast dispatch).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  capture::Op cap("linear");
  const auto describe = [&] { return capture::Args{{x, weight, bias}, {}}; };
  if (Tensor y = linear_from_float32(x, weight, bias); y.defined()) return cap.done(y, describe);
  auto [xc, wc, bc] = autocast::inputs(autocast_ops::linear(), x, weight, bias);
  autocast::DisableGuard as_one_op;
  return cap.done(linear_as_one_op(xc, wc, bc), describe);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  capture::Op cap("dropout");
  auto [xc] = autocast::inputs(autocast_ops::dropout(), x);
  autocast::DisableGuard as_one_op;
  return cap.done(dropout_as_one_op(xc, p, training, gen), [&] {
    return capture::Args{{x}, {{"p", p}, {"training", int64_t{training}}}};
  });
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps, const Tensor& num_batches_tracked) {
  capture::Op cap("batch_norm");
  auto [xc, wc, bc] = autocast::inputs(autocast_ops::batch_norm(), x, weight, bias);
  autocast::DisableGuard as_one_op;
  return cap.done(
      batch_norm_as_one_op(xc, running_mean, running_var, wc, bc, training, momentum, eps, num_batches_tracked), [&] {
        return capture::Args{{x, running_mean, running_var, weight, bias},
                             {{"training", int64_t{training}}, {"eps", eps}}};
      });
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps,
                       const Tensor& num_batches_tracked) {
  capture::Op cap("batch_norm_relu");
  auto [xc, wc, bc] = autocast::inputs(autocast_ops::batch_norm(), x, weight, bias);
  autocast::DisableGuard as_one_op;
  return cap.done(
      batch_norm_relu_as_one_op(xc, running_mean, running_var, wc, bc, training, momentum, eps, num_batches_tracked),
      [&] {
        return capture::Args{{x, running_mean, running_var, weight, bias},
                             {{"training", int64_t{training}}, {"eps", eps}}};
      });
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                           double momentum, double eps, const Tensor& num_batches_tracked) {
  capture::Op cap("batch_norm_add_relu");
  // x, weight and bias as batch_norm casts them; the residual joins by the add's own promotion, as in
  // relu(batch_norm(x) + residual) (PyTorch's autocast leaves an add's inputs alone too).
  auto [xc, wc, bc] = autocast::inputs(autocast_ops::batch_norm(), x, weight, bias);
  autocast::DisableGuard as_one_op;
  return cap.done(batch_norm_add_relu_as_one_op(xc, residual, running_mean, running_var, wc, bc, training, momentum,
                                                eps, num_batches_tracked),
                  [&] {
                    return capture::Args{{x, running_mean, running_var, weight, bias, residual},
                                         {{"training", int64_t{training}}, {"eps", eps}}};
                  });
}

namespace {

// nn::embedding with sparse = true: the forward is the table lookup; the backward adds the rows' gradients to the
// weight's sparse gradient (lookups of the padding row left out, as PyTorch's) and hands the engine none.
struct SparseEmbeddingFunction : autograd::Function<SparseEmbeddingFunction> {
  static Tensor forward(autograd::Context& ctx, const Tensor& weight, const Tensor& index, int64_t padding) {
    ctx.set("weight", weight);  // the leaf the rows accumulate into
    ctx.set("index", index);
    ctx.set("padding", padding);  // -1: none
    return internal::embedding(weight, index);
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const Tensor weight = ctx.get<Tensor>("weight");
    const Tensor index = ctx.get<Tensor>("index");
    const int64_t padding = ctx.get<int64_t>("padding");
    const int64_t n = index.numel();
    Tensor rows = internal::contiguous(internal::reshape(grads[0], {n, weight.size(1)}));            // (N, D)
    Tensor idx = internal::contiguous(internal::reshape(internal::cast(index, DType::Int64), {n}));  // (N)
    if (padding >= 0) {
      const Tensor keep = internal::reshape(internal::nonzero(internal::ne(idx, padding)), {-1});
      idx = internal::index_select(idx, 0, keep);
      rows = internal::index_select(rows, 0, keep);
    }
    autograd::accumulate_sparse_grad(weight, {idx, internal::cast(rows, weight.dtype()), weight.shape()});
    return {Tensor(), Tensor()};
  }
};

}  // namespace

Tensor embedding(const Tensor& index, const Tensor& weight, std::optional<int64_t> padding_idx, bool sparse) {
  capture::Op cap("embedding");
  const auto describe = [&] { return capture::Args{{weight, index}, {}}; };
  KILN_CHECK(weight.dim() == 2, "embedding: weight must be 2-D (num_embeddings, embedding_dim), got shape ",
             weight.shape());
  KILN_CHECK(is_integral(index.dtype()), "embedding: indices must be Int64 or Int32, got ", index.dtype(),
             "; cast them with .to(DType::Int64)");
  if (sparse && GradMode::is_enabled() && weight.requires_grad()) {
    KILN_CHECK(weight.is_leaf(),
               "embedding: sparse gradients accumulate into the weight itself, so it must be a leaf "
               "(a parameter), not the result of an op; use sparse = false for a computed table");
    int64_t pad = -1;
    if (padding_idx) {
      const int64_t v = weight.size(0);
      KILN_CHECK(*padding_idx >= -v && *padding_idx < v, "embedding: padding_idx ", *padding_idx,
                 " is out of range for ", v, " embeddings; use a value in [-", v, ", ", v, ")");
      pad = *padding_idx < 0 ? *padding_idx + v : *padding_idx;
    }
    return cap.done(SparseEmbeddingFunction::apply(weight, index, pad), describe);
  }
  Tensor out = kiln::embedding(weight, index);  // (..., D)
  if (!padding_idx) return cap.done(out, describe);
  const int64_t v = weight.size(0);
  int64_t pad = *padding_idx;
  KILN_CHECK(pad >= -v && pad < v, "embedding: padding_idx ", pad, " is out of range for ", v,
             " embeddings; use a value in [-", v, ", ", v, ")");
  if (pad < 0) pad += v;
  // Lookups of the padding row take the detached value: the same numbers, but no gradient to that row.
  Tensor is_pad = unsqueeze(index == Scalar(pad), -1);  // (..., 1)
  return cap.done(where(is_pad, out.detach(), out), describe);
}

}  // namespace kiln::nn
