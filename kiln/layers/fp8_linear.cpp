// The FP8 Linear (fp8_linear.h): its autograd function, nn::Linear's FP8 state, and amp::prepare_fp8.
#include "kiln/layers/fp8_linear.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/autograd/autocast.h"      // DisableGuard: the ops around the function run as one op
#include "kiln/autograd/checkpoint.h"    // in_recomputation: one scale update per forward
#include "kiln/autograd/function.h"      // autograd::Function
#include "kiln/autograd/stacked_cast.h"  // autocast::detail::stacked_shadow: the stacked biases' values
#include "kiln/layers/functional.h"      // nn::linear, for empty inputs
#include "kiln/layers/linear.h"
#include "kiln/tensor/error.h"        // KILN_CHECK
#include "kiln/tensor/fp8_ops.h"      // internal::fp8_quantize, internal::fp8_gemm
#include "kiln/tensor/owned_split.h"  // internal::split_owned: the stacked products' gradients

namespace kiln::nn {
namespace {

constexpr int64_t kInput = 0, kWeight = 1, kGrad = 2;  // the columns of a Linear's Fp8ScalingState

int64_t round_up16(int64_t m) { return (m + 15) / 16 * 16; }

// t (R, C) with zero rows appended up to `rows` (t itself when it has them): FP8 GEMMs need R % 16 == 0.
Tensor pad_rows(const Tensor& t, int64_t rows) {
  if (t.size(0) == rows) return t;
  Tensor out = internal::zeros({rows, t.size(1)}, {.dtype = t.dtype(), .device = t.device()});
  out.narrow(0, 0, t.size(0)).copy_(t);
  return out;
}

// The first `rows` rows of t, contiguous.
Tensor first_rows(const Tensor& t, int64_t rows) { return t.size(0) == rows ? t : t.narrow(0, 0, rows).contiguous(); }

// The dtypes the FP8 quantisation reads and the FP8 GEMM writes.
bool fp8_gemm_dtype(DType t) { return t == DType::Float32 || t == DType::BFloat16 || t == DType::Float16; }

Tensor cell(const Tensor& t, int64_t j) { return t.narrow(0, j, 1); }  // (1,) view

// What an FP8 product takes besides its differentiable tensors.
struct Fp8Call {
  amp::Fp8ScalingState* state;
  DType out_dtype;
  internal::Fp8Activation act;  // applied to x in its quantisation
  Tensor bias_values;           // the biases, concatenated, in out_dtype (no history), or undefined
  std::shared_ptr<const Fp8InputCodes> offered = nullptr;  // x's codes, made ahead by the op that made x, or null
};

constexpr size_t kMaxParts = 3;  // Linears one product computes: BERT's query, key and value

// What one FP8 product's backward needs from its forward.
struct Fp8Saved {
  Tensor scale, scale_inv, amax;  // this call's scales (kept: a later forward updates the state), the amax cells
  Tensor xt, wt;                  // (in, Mp) and (in, out) codes, where a backward product needs them
  std::vector<int64_t> outs;      // each weight's rows
  DType grad_fp8, x_dtype, w_dtype, b_dtype;
};

// Begins an FP8 product's call on `state`: scale (3,) and scale_inv (3,) receive this call's scales, kept for backward
// (a later forward, gradient accumulation, updates the state in place). scale_inv has its elements 16 bytes apart (a
// (3,) view of stride 4 into a (3, 4) block): cuBLASLt's FP8 kernels read a scale only from a 16-byte aligned address,
// and fp8_gemm would otherwise copy each one before every product. Delayed scaling: the scales come from the amaxes of
// the calls before, copied by the update's own kernel. A checkpoint's recomputation in backward repeats a forward: it
// keeps the scales that forward used (and records the same amaxes again, which changes nothing).
void fresh_scales(amp::Fp8ScalingState& state, Device device, Tensor& scale, Tensor& scale_inv) {
  scale = internal::empty({3}, {.dtype = DType::Float32, .device = device});
  scale_inv = internal::empty({3, 4}, {.dtype = DType::Float32, .device = device}).select(1, 0);
  if (!autograd::in_recomputation()) {
    state.update(scale, scale_inv);
  } else {
    scale.copy_(state.scale());
    scale_inv.copy_(state.scale_inv());
  }
}

// Steps that fp8_begin_input began for a product whose call has not come yet: the state's scales of that step. The
// call takes them (its step's one update has run) whether or not it also receives the codes (an input that reached it
// as another tensor, say).
thread_local std::map<const amp::Fp8ScalingState*, std::pair<Tensor, Tensor>> begun_steps;

// This call's scales: those of a step begun ahead (begun_steps), else fresh_scales.
void begin_scales(amp::Fp8ScalingState& state, Device device, Tensor& scale, Tensor& scale_inv) {
  if (auto it = begun_steps.find(&state); it != begun_steps.end()) {
    std::tie(scale, scale_inv) = it->second;
    begun_steps.erase(it);
    return;
  }
  fresh_scales(state, device, scale, scale_inv);
}

// One FP8 product on xp (Mp, in), Mp a multiple of 16: act(xp) (call.act) times the weights ws (out_i, in) stacked,
// plus call.bias_values; (Mp, sum out_i) in call.out_dtype. Fills `saved`; with_xt / with_wt: keep the transposed
// codes the weight gradients / the input gradient will need.
Tensor product_forward(const Tensor& xp, const std::vector<Tensor>& weights, const Fp8Call& call, bool with_xt,
                       bool with_wt, Fp8Saved& saved) {
  amp::Fp8ScalingState* state = call.state;
  const Fp8InputCodes* offered = call.offered.get();
  if (offered != nullptr) {  // the op that made x began this call's step (fp8_begin_input)
    saved.scale = offered->scale;
    saved.scale_inv = offered->scale_inv;
    begun_steps.erase(state);
  } else {
    begin_scales(*state, xp.device(), saved.scale, saved.scale_inv);
  }
  saved.amax = state->amax_history().select(0, 0);  // (3,) view of the current row: the quantisations write it
  const Tensor &scale = saved.scale, &amax = saved.amax;
  // Each weight (out_i, in): the float32 master weight as it is (a float64 one, of a model moved to float64, in
  // float32).
  std::vector<Tensor> ws;
  saved.outs.clear();
  for (const Tensor& w : weights) {
    ws.push_back(contiguous(fp8_gemm_dtype(w.dtype()) ? w : w.to(DType::Float32)));
    saved.outs.push_back(w.size(0));
  }
  // Each operand quantised, with the K-major transposed copy a backward GEMM needs made in the same pass: x's for
  // dW, W's for dX. act (a GELU) is applied to x's values in x's quantisation: act(x) itself is never written.
  // Several weights are quantised as one (out, in) stack without writing the stack first.
  const DType x_fp8 = state->fp8_dtype(kInput), w_fp8 = state->fp8_dtype(kWeight);
  Tensor xq, wq;
  if (offered != nullptr && offered->codes.shape() == xp.shape() && call.act == internal::Fp8Activation::None) {
    // x's codes were written by the op that made x, with this call's scale, and their amax recorded: only the
    // transposed copy is left to make, from the codes.
    xq = offered->codes;
    if (with_xt) saved.xt = internal::fp8_transpose(xq);
  } else if (with_xt) {
    std::tie(xq, saved.xt) =
        internal::fp8_quantize_pair(xp, x_fp8, cell(scale, kInput), cell(amax, kInput), nullptr, call.act);
  } else {
    xq = internal::fp8_quantize(xp, x_fp8, cell(scale, kInput), cell(amax, kInput), false, call.act);
  }
  if (ws.size() > 1) {
    std::tie(wq, saved.wt) = internal::fp8_quantize_pair_of_rows(ws, w_fp8, cell(scale, kWeight), cell(amax, kWeight));
  } else if (with_wt) {
    std::tie(wq, saved.wt) = internal::fp8_quantize_pair(ws[0], w_fp8, cell(scale, kWeight), cell(amax, kWeight));
  } else {
    wq = internal::fp8_quantize(ws[0], w_fp8, cell(scale, kWeight), cell(amax, kWeight));
  }
  saved.grad_fp8 = state->fp8_dtype(kGrad);
  saved.x_dtype = xp.dtype();
  saved.w_dtype = weights[0].dtype();
  // The forward product with fast accumulation (as Transformer Engine's and torchao's recipes do); the backward
  // products, whose output gradients span a wider range, keep the float32 promotion.
  return internal::fp8_gemm(xq, wq, cell(saved.scale_inv, kInput), cell(saved.scale_inv, kWeight), call.out_dtype,
                            call.bias_values, nullptr, /*fast_accumulation=*/true);
}

// What product_backward computes: the input's gradient (Mp rows; before any activation's derivative), each weight's,
// each bias's.
struct ProductGrads {
  Tensor dx;
  std::vector<Tensor> dw, db;
};

// The gradients of one FP8 product from its output gradient's quantisation: gq (Mp, out) for dX, gtq (out, Mp) for
// the weights (undefined where none is wanted), row_sums (out) float32 for the biases (undefined without).
// dx_into (null: none): a float32 (Mp, in) tensor that already holds other gradients of the input: dX is added into it
// by the product itself (and out.dx is that tensor).
ProductGrads product_backward(const Fp8Saved& p, const Tensor& gq, const Tensor& gtq, Tensor row_sums, bool want_dx,
                              const std::vector<bool>& want_dw, const std::vector<bool>& want_db,
                              Tensor* dx_into = nullptr) {
  ProductGrads out{{}, std::vector<Tensor>(p.outs.size()), std::vector<Tensor>(p.outs.size())};
  if (want_dx && dx_into != nullptr) {
    out.dx =
        internal::fp8_gemm(gq, p.wt, cell(p.scale_inv, kGrad), cell(p.scale_inv, kWeight), DType::Float32, {}, dx_into);
  } else if (want_dx) {
    out.dx = internal::fp8_gemm(gq, p.wt, cell(p.scale_inv, kGrad), cell(p.scale_inv, kWeight), p.x_dtype);
  }
  // Each Linear's gradients, from its rows of dY's transpose and its columns of the row sums: dW_i (out_i, in) in
  // float32 for the master weight. Where every weight's gradient is wanted, one product of the stacked rows gives them
  // all (its rows are dW_i, split into tensors that own their rows, which .grad keeps without a copy): on a BERT
  // layer's (3 x 768, 768) that is faster than three (768, 768) products over K = 16384 rows, each too small to fill
  // the GPU without a split-K pass. The biases' gradients, where all are wanted, are the row sums split likewise.
  const bool stacked = p.outs.size() > 1 && std::find(want_dw.begin(), want_dw.end(), false) == want_dw.end();
  const std::vector<Tensor> all_dw =
      stacked ? internal::split_owned(
                    internal::fp8_gemm(gtq, p.xt, cell(p.scale_inv, kGrad), cell(p.scale_inv, kInput), DType::Float32),
                    p.outs)
              : std::vector<Tensor>{};
  const bool all_db = p.outs.size() > 1 && std::find(want_db.begin(), want_db.end(), false) == want_db.end();
  const std::vector<Tensor> sums = all_db ? internal::split_owned(std::move(row_sums), p.outs) : std::vector<Tensor>{};
  int64_t at = 0;
  for (size_t i = 0; i < p.outs.size(); ++i) {
    if (stacked) {
      out.dw[i] = all_dw[i].to(p.w_dtype);
    } else if (want_dw[i]) {
      const Tensor rows_i = p.outs.size() == 1 ? gtq : gtq.narrow(0, at, p.outs[i]);
      out.dw[i] = internal::fp8_gemm(rows_i, p.xt, cell(p.scale_inv, kGrad), cell(p.scale_inv, kInput), DType::Float32)
                      .to(p.w_dtype);
    }
    if (want_db[i]) {
      const Tensor sums_i = all_db ? sums[i] : p.outs.size() == 1 ? row_sums : row_sums.narrow(0, at, p.outs[i]);
      out.db[i] = sums_i.to(p.b_dtype);  // (out_i)
    }
    at += p.outs[i];
  }
  return out;
}

// dY (M, out) padded and quantised for a product's backward: gq always, gtq where a weight's gradient is wanted, the
// row sums where a bias's is.
std::tuple<Tensor, Tensor, Tensor> quantise_output_gradient(const Tensor& g, const Fp8Saved& p, bool want_dw,
                                                            bool want_db) {
  Tensor gq, gtq, row_sums;
  if (want_dw) {
    std::tie(gq, gtq) = internal::fp8_quantize_pair(g, p.grad_fp8, cell(p.scale, kGrad), cell(p.amax, kGrad),
                                                    want_db ? &row_sums : nullptr);
  } else {
    gq = internal::fp8_quantize(g, p.grad_fp8, cell(p.scale, kGrad), cell(p.amax, kGrad));
    if (want_db) row_sums = sum(g, {0}, false, DType::Float32);
  }
  return {gq, gtq, row_sums};
}

// x (..., in) contiguous as the (M, in) matrix the products take.
Tensor as_rows(const Tensor& x) { return reshape(x, {x.numel() / x.size(-1), x.size(-1)}); }

// The gradient sum the engine offers for x (ctx.gradient_sum(0)) as the float32 (M, in) matrix an FP8 product can add
// its dX into, where it is one: float32, contiguous, of x's shape, M a multiple of 16 (no padding rows); else
// undefined.
Tensor sum_to_add_into(const autograd::Context& ctx, const Shape& x_shape) {
  const Tensor& sum = ctx.gradient_sum(0);
  if (!sum.defined() || sum.dtype() != DType::Float32 || sum.shape() != x_shape || !sum.is_contiguous() ||
      sum.numel() == 0)
    return {};
  const Tensor rows = as_rows(sum);
  return rows.size(0) % 16 == 0 ? rows : Tensor();
}

struct Fp8LinearFunction : autograd::Function<Fp8LinearFunction> {
  // Backward adds x's gradient into the sum its other uses began (a residual stream's), where it is float32 and the
  // graph offers it (act None).
  static constexpr bool kAddsIntoGradientSums = true;

  // x (..., in) contiguous, M rows of in; w0 .. w2 (out_i, in): the weights of the Linears whose outputs this one
  // product computes side by side (w1, w2 undefined for one Linear); b0 .. b2 their biases (undefined without), whose
  // values come in call.bias_values. Returns (M, sum out_i) in call.out_dtype: act(x) (call.act, applied in x's
  // quantisation) times the stacked weights, plus the biases.
  static Tensor forward(autograd::Context& ctx, const Tensor& x_in, const Tensor& w0, const Tensor& w1,
                        const Tensor& w2, const Tensor& b0, const Tensor& b1, const Tensor& b2, const Fp8Call& call) {
    const Tensor x = as_rows(x_in);
    const int64_t m = x.size(0);
    ctx.set("x_shape", x_in.shape());
    std::vector<Tensor> ws;
    for (const Tensor* w : {&w0, &w1, &w2}) {
      if (w->defined()) ws.push_back(*w);
    }
    Fp8Saved saved;
    const bool needs_dw = ctx.needs_input_grad(1) || ctx.needs_input_grad(2) || ctx.needs_input_grad(3);
    const Tensor y = product_forward(pad_rows(x, round_up16(m)), ws, call, needs_dw, ctx.needs_input_grad(0), saved);
    saved.x_dtype = x.dtype();
    saved.b_dtype = b0.defined() ? b0.dtype() : DType::Float32;
    // The activation's gradient needs its input: x itself (not act(x)).
    if (call.act != internal::Fp8Activation::None && ctx.needs_input_grad(0)) ctx.save_for_backward({x_in});
    ctx.set("act", call.act);
    ctx.set("saved", saved);
    return first_rows(y, m);  // (M, out)
  }

  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const Tensor dy = contiguous(grads[0]);  // (M, out)
    const int64_t m = dy.size(0);
    const auto saved = ctx.get<Fp8Saved>("saved");
    std::vector<bool> want_dw, want_db;
    for (size_t i = 0; i < saved.outs.size(); ++i) {
      want_dw.push_back(ctx.needs_input_grad(1 + i));
      want_db.push_back(ctx.needs_input_grad(4 + i));
    }
    const bool any_dw = std::find(want_dw.begin(), want_dw.end(), true) != want_dw.end();
    const bool any_db = std::find(want_db.begin(), want_db.end(), true) != want_db.end();
    // dY quantised: (Mp, out) for dX, its transpose (out, Mp) for dW, and with the transpose the bias gradient
    // (dY's rows summed in float32; the padding rows are zero) from the same pass.
    auto [gq, gtq, row_sums] = quantise_output_gradient(pad_rows(dy, round_up16(m)), saved, any_dw, any_db);
    const auto act = ctx.get<internal::Fp8Activation>("act");
    const auto x_shape = ctx.get<Shape>("x_shape");
    Tensor into =
        act == internal::Fp8Activation::None && ctx.needs_input_grad(0) ? sum_to_add_into(ctx, x_shape) : Tensor();
    ProductGrads g = product_backward(saved, gq, gtq, std::move(row_sums), ctx.needs_input_grad(0), want_dw, want_db,
                                      into.defined() ? &into : nullptr);
    autograd::TensorList out(7);
    if (into.defined()) {
      out[0] = ctx.gradient_sum(0);  // dX added into it: the engine adds nothing
    } else if (g.dx.defined()) {
      out[0] = first_rows(g.dx, m);
      // That is the gradient of act(x); through the activation to x's.
      if (act != internal::Fp8Activation::None) {
        out[0] = internal::gelu_backward(out[0], as_rows(ctx.saved()[0]), act == internal::Fp8Activation::GeluTanh);
      }
      out[0] = reshape(out[0], x_shape);
    }
    for (size_t i = 0; i < saved.outs.size(); ++i) {
      out[1 + i] = g.dw[i];
      out[4 + i] = g.db[i];
    }
    return out;
  }
};

// What fp8_mlp's product pair takes besides its differentiable tensors.
struct Fp8MlpCall {
  amp::Fp8ScalingState *state1, *state2;
  DType out_dtype;
  bool tanh_approximation;
  Tensor bias_values1, bias_values2;                       // in out_dtype, no history; undefined without
  std::shared_ptr<const Fp8InputCodes> offered = nullptr;  // x's codes for the first product (see Fp8Call)
};

// fc2(gelu(fc1(x))) as two FP8 products whose GELU is never written: forward applies it in the quantisation of fc2's
// input, backward takes fc2's input gradient through it in the quantisation of fc1's output gradient.
struct Fp8MlpFunction : autograd::Function<Fp8MlpFunction> {
  // Backward adds x's gradient into the sum its other uses began, where it is float32 and the graph offers it.
  static constexpr bool kAddsIntoGradientSums = true;

  // x (..., in) contiguous, M rows of in; w1 (hidden, in), b1; w2 (out, hidden), b2 (biases undefined without).
  // Returns (M, out).
  static Tensor forward(autograd::Context& ctx, const Tensor& x_in, const Tensor& w1, const Tensor& b1,
                        const Tensor& w2, const Tensor& b2, const Fp8MlpCall& call) {
    const Tensor x = as_rows(x_in);
    const int64_t m = x.size(0), mp = round_up16(m);
    ctx.set("x_shape", x_in.shape());
    const bool below_fc2 = ctx.needs_input_grad(0) || ctx.needs_input_grad(1) || ctx.needs_input_grad(2);
    Fp8Saved fc1, fc2;
    // fc1, and its output's rows without the padding's (which hold the bias): fc2 pads them with zeros, as it would
    // pad its own input.
    const Tensor h = first_rows(
        product_forward(pad_rows(x, mp), {w1},
                        {call.state1, call.out_dtype, internal::Fp8Activation::None, call.bias_values1, call.offered},
                        ctx.needs_input_grad(1), ctx.needs_input_grad(0), fc1),
        m);
    const internal::Fp8Activation act =
        call.tanh_approximation ? internal::Fp8Activation::GeluTanh : internal::Fp8Activation::Gelu;
    const Tensor y = product_forward(pad_rows(h, mp), {w2}, {call.state2, call.out_dtype, act, call.bias_values2},
                                     ctx.needs_input_grad(3), below_fc2, fc2);
    fc1.x_dtype = x.dtype();
    fc1.b_dtype = b1.defined() ? b1.dtype() : DType::Float32;
    fc2.b_dtype = b2.defined() ? b2.dtype() : DType::Float32;
    if (below_fc2) ctx.save_for_backward({h});  // the GELU's input, for its derivative
    ctx.set("fc1", fc1);
    ctx.set("fc2", fc2);
    ctx.set("tanh", call.tanh_approximation);
    return first_rows(y, m);
  }

  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const Tensor dy = contiguous(grads[0]);  // (M, out)
    const int64_t m = dy.size(0), mp = round_up16(m);
    const auto fc1 = ctx.get<Fp8Saved>("fc1"), fc2 = ctx.get<Fp8Saved>("fc2");
    const bool below_fc2 = ctx.needs_input_grad(0) || ctx.needs_input_grad(1) || ctx.needs_input_grad(2);
    autograd::TensorList out(5);
    const auto [gq2, gtq2, sums2] =
        quantise_output_gradient(pad_rows(dy, mp), fc2, ctx.needs_input_grad(3), ctx.needs_input_grad(4));
    ProductGrads g2 =
        product_backward(fc2, gq2, gtq2, sums2, below_fc2, {ctx.needs_input_grad(3)}, {ctx.needs_input_grad(4)});
    out[3] = g2.dw[0];
    out[4] = g2.db[0];
    if (!below_fc2) return out;
    // g2.dx is the gradient of gelu(h) (its padding rows zero); through the GELU to h's in fc1's output-gradient
    // quantisation (the padding rows stay zero: zero times gelu'(h)).
    const Tensor h = pad_rows(ctx.saved()[0], mp);
    Tensor gq1, gtq1, sums1;
    std::tie(gq1, gtq1) =
        internal::fp8_quantize_pair_through_gelu(g2.dx, h, ctx.get<bool>("tanh"), fc1.grad_fp8, cell(fc1.scale, kGrad),
                                                 cell(fc1.amax, kGrad), ctx.needs_input_grad(2) ? &sums1 : nullptr);
    const auto x_shape = ctx.get<Shape>("x_shape");
    Tensor into = ctx.needs_input_grad(0) ? sum_to_add_into(ctx, x_shape) : Tensor();
    ProductGrads g1 = product_backward(fc1, gq1, gtq1, sums1, ctx.needs_input_grad(0), {ctx.needs_input_grad(1)},
                                       {ctx.needs_input_grad(2)}, into.defined() ? &into : nullptr);
    if (into.defined()) {
      out[0] = ctx.gradient_sum(0);  // dX added into it: the engine adds nothing
    } else if (g1.dx.defined()) {
      out[0] = reshape(first_rows(g1.dx, m), x_shape);
    }
    out[1] = g1.dw[0];
    out[2] = g1.db[0];
    return out;
  }
};

// The codes the op that made x wrote for the product with `state` (fp8_offer_input), or null.
std::shared_ptr<const Fp8InputCodes> taken_offer(const Tensor& x, const amp::Fp8ScalingState& state) {
  return std::static_pointer_cast<const Fp8InputCodes>(autocast::take_fp8_offer(x, &state));
}

// t's values in `dtype` without history: a parameter's cast of the autocast region where there is one (cached, or
// the 16-bit shadow the fused optimizer wrote: no kernel then), else a cast.
Tensor values_in(const Tensor& t, DType dtype) {
  if (!t.defined()) return t;
  return (t.dtype() == dtype ? t : autocast::cast_to(t, dtype)).detach();
}

// A weight an FP8 product takes: 2-D, floating, not FP8 itself (`op` names the caller in the error).
void check_fp8_weight(const char* op, const Tensor& w) {
  KILN_CHECK(w.defined() && w.dim() == 2 && w.is_floating_point() && !is_float8(w.dtype()), op,
             ": weight must be a 2-D floating tensor (out_features, in_features), got ",
             w.defined() ? detail::str_cat(w.dtype(), " of shape ", w.shape()) : std::string("none"));
}

// An input an FP8 product takes: floating (not FP8), of shape (..., in) for `weight`.
void check_fp8_input(const char* op, const Tensor& x, int64_t in, const Tensor& weight) {
  KILN_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in && x.is_floating_point() && !is_float8(x.dtype()), op,
             ": expected a floating input of shape (..., ", in, ") for weight ", weight.shape(), ", got ",
             x.defined() ? detail::str_cat(x.dtype(), " of shape ", x.shape()) : std::string("none"));
}

// The checks every FP8 product makes of its arguments (fp8_linear and fp8_linear_stacked).
void check_fp8_call(const Tensor& x, const Tensor& weight, const Tensor& bias, const amp::Fp8ScalingState& state,
                    DType out_dtype, int64_t in) {
  const int64_t out = weight.size(0);
  KILN_CHECK(in % 16 == 0 && out % 16 == 0, "fp8_linear: FP8 matrix products need in_features and out_features ",
             "that are multiples of 16, but the weight has shape ", weight.shape(),
             "; leave this layer out of FP8 (the recipe's module_filter) or pad its features");
  KILN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out), "fp8_linear: bias must have shape (", out,
             "), got ", bias.defined() ? bias.shape() : Shape{});
  KILN_CHECK(fp8_gemm_dtype(out_dtype), "fp8_linear: out_dtype must be BFloat16, Float16 or Float32, got ", out_dtype);
  KILN_CHECK(state.size() == 3, "fp8_linear: the scaling state tracks ", state.size(),
             " tensors; a Linear's has 3 (Fp8ScalingState::for_linear)");
  KILN_CHECK(
      x.device() == weight.device() && state.device() == x.device() && (!bias.defined() || bias.device() == x.device()),
      "fp8_linear: the input is on ", x.device(), ", the weight on ", weight.device(), " and the FP8 state on ",
      state.device(), "; put them on one device (move the model with to() before its first FP8 forward, or ",
      "call amp::prepare_fp8 with the model's device)");
}

// fp8_linear and fp8_linear_stacked: the product of x with the weights stacked along the output, as one FP8 product.
Tensor fp8_product(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases,
                   amp::Fp8ScalingState& state, DType out_dtype, internal::Fp8Activation act) {
  KILN_CHECK(!weights.empty() && weights.size() <= kMaxParts, "fp8_linear_stacked: give 1 to ", kMaxParts,
             " weights, got ", weights.size());
  KILN_CHECK(biases.empty() || biases.size() == weights.size(), "fp8_linear_stacked: give one bias per weight (",
             weights.size(), ") or none, got ", biases.size());
  int64_t in = 0, out = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const Tensor& weight = weights[i];
    check_fp8_weight("fp8_linear", weight);
    if (i == 0) in = weight.size(1);
    KILN_CHECK(weight.size(1) == in && weight.dtype() == weights[0].dtype(), "fp8_linear_stacked: weight ", i, " (",
               weight.dtype(), " of shape ", weight.shape(), ") does not take the input weight 0 takes (",
               weights[0].dtype(), " of shape ", weights[0].shape(), ")");
    check_fp8_call(x, weight, biases.empty() ? Tensor() : biases[i], state, out_dtype, in);
    out += weight.size(0);
  }
  for (const Tensor& b : biases) {
    KILN_CHECK(b.defined() && b.dtype() == biases[0].dtype(), "fp8_linear_stacked: the biases must all be defined, ",
               "of one dtype (or give none)");
  }
  check_fp8_input("fp8_linear", x, in, weights[0]);
  const int64_t rows = in == 0 ? 0 : x.numel() / in;
  // The biases' values in out_dtype, concatenated: a parameter's cast from the autocast region (the optimizer's
  // 16-bit shadow where it wrote one).
  // Several float32 biases: their shadows as one stack, once the optimizer has written them (nothing to copy).
  Tensor bias_values;
  if (biases.size() > 1) bias_values = autocast::detail::stacked_shadow(biases, out_dtype);
  if (!biases.empty() && !bias_values.defined()) {
    std::vector<Tensor> parts;
    for (const Tensor& b : biases) parts.push_back(values_in(b, out_dtype));
    bias_values = parts.size() == 1 ? parts[0] : internal::cat(parts, 0);
  }
  autocast::DisableGuard as_one_op;
  if (rows == 0) {  // nothing to compute: the plain product's empty result, and no state update
    const Tensor xa = act == internal::Fp8Activation::None ? x : gelu(x, act == internal::Fp8Activation::GeluTanh);
    const Tensor w = weights.size() == 1 ? weights[0] : cat(weights, 0);
    const Tensor b = biases.empty() ? Tensor() : biases.size() == 1 ? biases[0] : cat(biases, 0);
    return linear(xa.to(out_dtype), w.to(out_dtype), b.defined() ? b.to(out_dtype) : b);
  }
  Shape shape = x.shape();
  shape.back() = out;
  const auto offered = taken_offer(x, state);
  const Tensor xin = fp8_gemm_dtype(x.dtype()) ? x : x.to(out_dtype);
  auto part = [](const std::vector<Tensor>& v, size_t i) { return i < v.size() ? v[i] : Tensor(); };
  const Tensor y =
      Fp8LinearFunction::apply(contiguous(xin), part(weights, 0), part(weights, 1), part(weights, 2), part(biases, 0),
                               part(biases, 1), part(biases, 2), Fp8Call{&state, out_dtype, act, bias_values, offered});
  return reshape(y, shape);
}

}  // namespace

std::optional<Fp8InputCodes> fp8_begin_input(amp::Fp8ScalingState& state, const Shape& shape, Device device) {
  const int64_t in = shape.empty() ? 0 : shape.back();
  const int64_t rows = in == 0 ? 0 : numel(shape) / in;
  if (autocast::fp8_recipe(device.type()) == nullptr || autograd::in_recomputation() || state.device() != device ||
      state.size() != 3 || rows == 0 || rows % 16 != 0 || in % 16 != 0) {
    return std::nullopt;
  }
  Fp8InputCodes codes;
  fresh_scales(state, device, codes.scale, codes.scale_inv);
  begun_steps[&state] = {codes.scale, codes.scale_inv};
  codes.codes = internal::empty({rows, in}, {.dtype = state.fp8_dtype(kInput), .device = device});
  codes.input_scale = cell(codes.scale, kInput);
  codes.input_amax = state.amax_history().select(0, 0).narrow(0, kInput, 1);
  return codes;
}

void fp8_offer_input(const Tensor& y, const amp::Fp8ScalingState& state, Fp8InputCodes codes) {
  autocast::offer_fp8(y, &state, std::make_shared<const Fp8InputCodes>(std::move(codes)));
}

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, amp::Fp8ScalingState& state,
                  DType out_dtype, internal::Fp8Activation act) {
  return fp8_product(x, {weight}, bias.defined() ? std::vector<Tensor>{bias} : std::vector<Tensor>{}, state, out_dtype,
                     act);
}

Tensor fp8_linear_stacked(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases,
                          amp::Fp8ScalingState& state, DType out_dtype) {
  return fp8_product(x, weights, biases, state, out_dtype, internal::Fp8Activation::None);
}

Tensor fp8_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, amp::Fp8ScalingState& state1, const Tensor& w2,
               const Tensor& b2, amp::Fp8ScalingState& state2, DType out_dtype, bool tanh_approximation) {
  check_fp8_weight("fp8_mlp", w1);
  check_fp8_weight("fp8_mlp", w2);
  const int64_t in = w1.size(1), hidden = w1.size(0), out = w2.size(0);
  KILN_CHECK(w2.size(1) == hidden, "fp8_mlp: the second weight ", w2.shape(), " does not take the first's ", hidden,
             " outputs (first weight ", w1.shape(), ")");
  check_fp8_call(x, w1, b1, state1, out_dtype, in);
  check_fp8_call(x, w2, b2, state2, out_dtype, hidden);
  KILN_CHECK(&state1 != &state2, "fp8_mlp: the two products need scaling states of their own");
  check_fp8_input("fp8_mlp", x, in, w1);
  const int64_t rows = in == 0 ? 0 : x.numel() / in;
  const Tensor bias1 = values_in(b1, out_dtype), bias2 = values_in(b2, out_dtype);
  autocast::DisableGuard as_one_op;
  if (rows == 0) {  // nothing to compute: the plain products' empty result, and no state update
    const Tensor h = linear(x.to(out_dtype), w1.to(out_dtype), b1.defined() ? b1.to(out_dtype) : b1);
    return linear(gelu(h, tanh_approximation), w2.to(out_dtype), b2.defined() ? b2.to(out_dtype) : b2);
  }
  Shape shape = x.shape();
  shape.back() = out;
  const auto offered = taken_offer(x, state1);
  const Tensor xin = fp8_gemm_dtype(x.dtype()) ? x : x.to(out_dtype);
  const Tensor y =
      Fp8MlpFunction::apply(contiguous(xin), w1, b1, w2, b2,
                            Fp8MlpCall{&state1, &state2, out_dtype, tanh_approximation, bias1, bias2, offered});
  return reshape(y, shape);
}

Tensor linear_gelu_linear(Linear& fc1, Linear& fc2, const Tensor& x, bool tanh_approximation) {
  const DeviceType type = x.device().type();
  if (const amp::Fp8Recipe* recipe = autocast::fp8_recipe(type); recipe != nullptr && x.is_floating_point()) {
    amp::Fp8ScalingState* state1 = fc1.fp8_state_for(*recipe, x.device());
    amp::Fp8ScalingState* state2 = fc2.fp8_state_for(*recipe, x.device());
    if (state1 != nullptr && state2 != nullptr && state1 != state2) {
      return fp8_mlp(x, fc1.weight, fc1.bias, *state1, fc2.weight, fc2.bias, *state2, autocast::get_dtype(type),
                     tanh_approximation);
    }
    return fc2.forward_gelu(fc1(x), tanh_approximation);  // one of them, or neither, in FP8
  }
  KILN_CHECK(x.dim() >= 1 && x.size(-1) == fc1.in_features, "Linear: expected input of shape (..., ", fc1.in_features,
             ") (in_features = ", fc1.in_features, "), got shape ", x.shape());
  return linear_gelu_linear(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, tanh_approximation);
}

// ---------------------------------------------------------------- nn::Linear's FP8 state

void Linear::enable_fp8(const amp::Fp8Recipe& recipe, Device device) {
  fp8_excluded_ = false;
  if (fp8_state_) return;
  KILN_CHECK(in_features % 16 == 0 && out_features % 16 == 0, "Linear(", in_features, ", ", out_features,
             "): FP8 needs in_features and out_features that are multiples of 16; leave this Linear out of FP8 (the ",
             "recipe's module_filter: the default one does)");
  fp8_state_ = std::make_shared<amp::Fp8ScalingState>(amp::Fp8ScalingState::for_linear(recipe, device));
  // The buffers are handles to the state's own tensors, which it updates in place: state_dict() reads them and
  // load_state_dict() writes into them.
  fp8_buffers_[0] = register_buffer("fp8_amax_history", fp8_state_->amax_history());
  fp8_buffers_[1] = register_buffer("fp8_scale", fp8_state_->scale());
  fp8_buffers_[2] = register_buffer("fp8_scale_inv", fp8_state_->scale_inv());
}

amp::Fp8ScalingState* Linear::fp8_state_for(const amp::Fp8Recipe& recipe, Device device) {
  if (fp8_excluded_) return nullptr;
  if (!fp8_state_) {
    if (!recipe.module_filter(amp::Fp8ModuleInfo{"", type_name(), in_features, out_features})) return nullptr;
    enable_fp8(recipe, device);
  }
  // The buffers share the state's memory (first as the same tensors, after a move as tensors on the same memory).
  // Module::to() moves (or converts) the buffers in place: they then sit on another device or in another dtype than
  // the state's, or on other memory. The state is then remade on the buffers' device from their values, and the
  // buffers take its tensors' memory.
  auto shares = [this](const Tensor& buffer, const Tensor& own) {
    return buffer.device() == fp8_state_->device() && buffer.dtype() == DType::Float32 &&
           buffer.impl().storage() == own.impl().storage() && buffer.offset() == own.offset();
  };
  if (!shares(fp8_buffers_[0], fp8_state_->amax_history()) || !shares(fp8_buffers_[1], fp8_state_->scale()) ||
      !shares(fp8_buffers_[2], fp8_state_->scale_inv())) {
    amp::Fp8StateDict saved = fp8_state_->state_dict();
    saved.tensors["amax_history"] = fp8_buffers_[0].to(DType::Float32);
    saved.tensors["scale"] = fp8_buffers_[1].to(DType::Float32);
    saved.tensors["scale_inv"] = fp8_buffers_[2].to(DType::Float32);
    auto moved = std::make_shared<amp::Fp8ScalingState>(
        amp::Fp8ScalingState::for_linear(fp8_state_->recipe(), fp8_buffers_[0].device()));
    moved->load_state_dict(saved);
    fp8_buffers_[0].impl().set_data(moved->amax_history().impl());
    fp8_buffers_[1].impl().set_data(moved->scale().impl());
    fp8_buffers_[2].impl().set_data(moved->scale_inv().impl());
    fp8_state_ = std::move(moved);
  }
  return fp8_state_.get();
}

void Linear::share_fp8_state(const Linear& owner) {
  KILN_CHECK(fp8_state_ && owner.fp8_state_, "Linear::share_fp8_state: both Linears need an FP8 state first ",
             "(amp::prepare_fp8, or fp8_state_for)");
  KILN_CHECK(fp8_state_->device() == owner.fp8_state_->device(), "Linear::share_fp8_state: this Linear's FP8 state is ",
             "on ", fp8_state_->device(), ", the owner's on ", owner.fp8_state_->device(), "; move both to one device");
  if (fp8_state_ == owner.fp8_state_) return;
  fp8_state_ = owner.fp8_state_;
  fp8_excluded_ = false;
  fp8_buffers_[0].impl().set_data(fp8_state_->amax_history().impl());
  fp8_buffers_[1].impl().set_data(fp8_state_->scale().impl());
  fp8_buffers_[2].impl().set_data(fp8_state_->scale_inv().impl());
}

}  // namespace kiln::nn

namespace kiln::amp {

int64_t prepare_fp8(nn::Module& model, const Fp8Recipe& recipe, Device device) {
  recipe.validate();
  int64_t chosen = 0;
  for (const auto& [name, module] : model.named_modules()) {
    auto* linear = dynamic_cast<nn::Linear*>(module.get());
    if (linear == nullptr) continue;
    if (recipe.module_filter(Fp8ModuleInfo{name, linear->type_name(), linear->in_features, linear->out_features})) {
      linear->enable_fp8(recipe, device);
      ++chosen;
    } else {
      linear->disable_fp8();
    }
  }
  return chosen;
}

}  // namespace kiln::amp
