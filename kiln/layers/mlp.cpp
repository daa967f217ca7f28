// A transformer MLP as one node (functional.h: nn::linear_gelu_linear, nn::gelu_backward_with_column_sums).
//
// Composed, linear(gelu(linear(x, w1, b1)), w2, b2) records three nodes, and the first product's bias gradient is a
// pass of its own over the GELU's input gradient dh (cuBLASLt's bias-gradient epilogue re-reads it). As one node,
// backward computes dh and its column sums in one pass (on CUDA one kernel: kiln/layers/cuda/gelu_sums.h), and the
// first product's weight gradient is a plain product. Every other value is the composed path's, from the same
// kernels: the forward bit for bit, and the gradients but for the order in which b1's sums are added.
#include <optional>
#include <tuple>  // std::tie
#include <utility>

#include "kiln/autograd/autocast.h"   // autocast::target_dtype, cast_to, DisableGuard
#include "kiln/autograd/function.h"   // autograd::Function
#include "kiln/autograd/grad_mode.h"  // NoGradGuard
#include "kiln/autograd/node.h"       // autograd::needs_grad
#include "kiln/layers/autocast_ops.h"
#include "kiln/layers/functional.h"
#include "kiln/layers/linear_backward.h"  // detail::linear_weight_bias_grads, linear_input_grad
#include "kiln/tensor/capture.h"          // capture::active: an exported forward keeps the ops it is made of
#include "kiln/tensor/error.h"            // KILN_CHECK
#include "kiln/tensor/internal_ops.h"     // raw ops: the node's forward and backward
#if KILN_WITH_CUDA
#include "kiln/layers/cuda/gelu_sums.h"  // cuda_impl::gelu_backward_sums
#endif

namespace kiln::nn {

std::pair<Tensor, Tensor> gelu_backward_with_column_sums(const Tensor& g, const Tensor& h, bool tanh_approximation) {
  KILN_CHECK(g.defined() && h.defined(), "gelu_backward_with_column_sums: g and h must be defined tensors");
  KILN_CHECK(g.shape() == h.shape() && g.dim() >= 1,
             "gelu_backward_with_column_sums: g and h must have one shape of "
             "at least 1 dim (rows, columns), got ",
             g.shape(), " and ", h.shape());
  KILN_CHECK(g.dtype() == h.dtype() && is_floating_point(g.dtype()) && !is_float8(g.dtype()),
             "gelu_backward_with_column_sums: g and h must have one floating dtype (float32, float64, bfloat16, ",
             "float16), got ", g.dtype(), " and ", h.dtype());
  KILN_CHECK(g.device() == h.device(), "gelu_backward_with_column_sums: g and h must be on one device, got ",
             g.device(), " and ", h.device());
  const int64_t cols = g.size(-1);
  const Tensor g2 = internal::reshape(g, {-1, cols}), h2 = internal::reshape(h, {-1, cols});
#if KILN_WITH_CUDA
  if (cuda_impl::gelu_backward_sums_fits(g2, h2)) {
    auto [dh, sums] = cuda_impl::gelu_backward_sums(g2, h2, tanh_approximation);
    return {internal::reshape(dh, g.shape()), sums};
  }
#endif
  const Tensor dh = internal::gelu_backward(g2, h2, tanh_approximation);
  const DType sum_dtype = g.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  return {internal::reshape(dh, g.shape()), internal::sum(dh, {0}, false, sum_dtype)};
}

namespace {

// x's values in the products' dtype, with no history (x itself, or autocast's cast of it), and the GELU's form.
struct MlpArgs {
  Tensor values;
  bool tanh_approximation = false;
};

// Tensor arguments: 0 x (..., in), 1 w1 (hidden, in), 2 b1 (hidden) or undefined, 3 w2 (out, hidden), 4 b2 (out) or
// undefined; w1, b1, w2, b2 and args.values in the products' dtype D; x in D or (autocast) float32.
struct MlpFunction : autograd::Function<MlpFunction> {
  static constexpr bool kAddsIntoGradientSums = true;  // x's gradient, as AutocastLinearFunction's

  static Tensor forward(autograd::Context& ctx, const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                        const Tensor& b2, const MlpArgs& args) {
    const Tensor x2 = internal::reshape(args.values, {-1, w1.size(1)});  // (M, in)
    const Tensor h = b1.defined() ? internal::addmm(b1, x2, internal::transpose(w1, 0, 1))
                                  : internal::mm(x2, internal::transpose(w1, 0, 1));  // (M, hidden)
    const Tensor a = internal::gelu(h, args.tanh_approximation);
    const Tensor y = b2.defined() ? internal::addmm(b2, a, internal::transpose(w2, 0, 1))
                                  : internal::mm(a, internal::transpose(w2, 0, 1));  // (M, out)
    const bool first = ctx.needs_input_grad(0) || ctx.needs_input_grad(1) || ctx.needs_input_grad(2);
    // What each gradient needs: w1 for dX, x for dW1, h for the GELU's gradient, a for dW2, w2 for a's gradient.
    ctx.save_for_backward({ctx.needs_input_grad(0) ? w1 : Tensor(), ctx.needs_input_grad(1) ? x2 : Tensor(),
                           first ? h : Tensor(), ctx.needs_input_grad(3) ? a : Tensor(), first ? w2 : Tensor()});
    ctx.set("x_shape", x.shape());
    ctx.set("x_dtype", x.dtype());
    ctx.set("tanh", args.tanh_approximation);
    Shape out_shape = x.shape();
    out_shape.back() = w2.size(0);
    return internal::reshape(y, out_shape);
  }

  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const autograd::TensorList saved = ctx.saved();
    const Tensor& g = grads[0];
    const Tensor g2 = internal::reshape(g, {-1, g.size(-1)});  // (M, out)
    // In float32 where the parameter's cast takes its gradient so (the float32 sums of the product, unrounded).
    const auto dtype_for = [&](size_t i) {
      return ctx.gradient_dtype_wanted(i) == DType::Float32 ? DType::Float32 : g.dtype();
    };
    Tensor dx, dw1, db1, dw2, db2;
    // The second product, as nn::linear's node computes it (b2's gradient offered where the op after the MLP, a layer
    // norm's backward, summed g's columns as it wrote g).
    const bool want_w2 = ctx.needs_input_grad(3), want_b2 = ctx.needs_input_grad(4);
    if (want_w2 || want_b2) {
      std::tie(dw2, db2) = detail::linear_weight_bias_grads(g2, saved[3], want_w2, want_b2, dtype_for(3), dtype_for(4));
    }
    const bool want_x = ctx.needs_input_grad(0), want_w1 = ctx.needs_input_grad(1), want_b1 = ctx.needs_input_grad(2);
    if (want_x || want_w1 || want_b1) {
      const Tensor &h = saved[2], &w2 = saved[4];
      const bool tanh = ctx.get<bool>("tanh");
      const Tensor da = internal::mm(g2, w2);  // (M, hidden), in the products' dtype
      Tensor dh;
      if (want_b1) {
        auto [d, sums] = gelu_backward_with_column_sums(da, h, tanh);
        dh = d;
        db1 = internal::cast(sums, dtype_for(2));  // sums itself where already in that dtype
      } else {
        dh = internal::gelu_backward(da, h, tanh);
      }
      if (want_w1) dw1 = internal::mm(internal::transpose(dh, 0, 1), saved[1], dtype_for(1));  // (hidden, in)
      if (want_x) {  // added into the sum x's other uses began, where the engine offers it
        dx = detail::linear_input_grad(dh, saved[0], ctx.gradient_sum(0), ctx.get<Shape>("x_shape"),
                                       ctx.get<DType>("x_dtype"));
      }
    }
    return {dx, dw1, db1, dw2, db2};
  }
};

bool fits_device(const Tensor& t, const Tensor& x) {
  return !t.defined() || (is_floating_point(t.dtype()) && !is_float8(t.dtype()) && t.device() == x.device());
}

// linear_gelu_linear as one MlpFunction, where it applies: grad mode on with a gradient wanted, no capture for export,
// x of at least 2 dims and elements, shapes that fit, one device, and the products' dtype D either autocast's 16-bit
// dtype for linear (x float32 or D, the parameters cast as linear casts them) or, without autocast, the dtype of x
// and every parameter. Undefined elsewhere (the composed path then runs, and raises any error).
Tensor mlp_as_one_node(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                       bool tanh_approximation) {
  if (capture::active() || !autograd::needs_grad(x, w1, b1, w2, b2)) return {};
  if (!x.defined() || !w1.defined() || !w2.defined() || x.dim() < 2 || x.numel() == 0) return {};
  if (w1.dim() != 2 || w2.dim() != 2 || w1.size(1) != x.size(-1) || w2.size(1) != w1.size(0) || w1.size(0) == 0 ||
      w2.size(0) == 0) {
    return {};
  }
  if (b1.defined() && (b1.dim() != 1 || b1.size(0) != w1.size(0))) return {};
  if (b2.defined() && (b2.dim() != 1 || b2.size(0) != w2.size(0))) return {};
  if (!fits_device(x, x) || !fits_device(w1, x) || !fits_device(b1, x) || !fits_device(w2, x) || !fits_device(b2, x)) {
    return {};
  }
  const std::optional<DType> cast = autocast::target_dtype(autocast_ops::linear(), x.device(), x.dtype());
  MlpArgs args{.values = {}, .tanh_approximation = tanh_approximation};
  if (cast) {
    if (*cast != DType::BFloat16 && *cast != DType::Float16) return {};
    if (x.dtype() != DType::Float32 && x.dtype() != *cast) return {};
    const Tensor w1c = autocast::cast_to(w1, *cast), b1c = autocast::cast_to(b1, *cast);
    const Tensor w2c = autocast::cast_to(w2, *cast), b2c = autocast::cast_to(b2, *cast);
    {
      NoGradGuard values_only;  // the cast's values: the function's node is the only one x's gradient passes
      args.values = x.dtype() == *cast ? x.detach() : autocast::cast_to(x, *cast).detach();
    }
    autocast::DisableGuard as_one_op;
    return MlpFunction::apply(x, w1c, b1c, w2c, b2c, args);
  }
  const DType d = x.dtype();
  for (const Tensor* t : {&w1, &b1, &w2, &b2}) {
    if (t->defined() && t->dtype() != d) return {};
  }
  args.values = x.detach();
  return MlpFunction::apply(x, w1, b1, w2, b2, args);
}

}  // namespace

Tensor linear_gelu_linear(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                          bool tanh_approximation) {
  if (Tensor y = mlp_as_one_node(x, w1, b1, w2, b2, tanh_approximation); y.defined()) return y;
  return linear(gelu(linear(x, w1, b1), tanh_approximation), w2, b2);
}

}  // namespace kiln::nn
