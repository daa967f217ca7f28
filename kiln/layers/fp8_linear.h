// kiln/layers/fp8_linear.h — the FP8 Linear: y = x W^T + b with the products in FP8 and delayed scaling, and
// amp::prepare_fp8, which chooses the Linears of a model that compute in FP8.
//
//   amp::Fp8Recipe recipe{.amax_history_len = 16};     // Hybrid: E4M3 forward, E5M2 gradients
//   amp::prepare_fp8(*model, recipe, dev);            // every Linear the filter selects gets its FP8 buffers
//   model->load_state_dict(checkpoint_state);        // a checkpoint of an FP8 run (its fp8_* buffers) loads now
//   {
//     amp::Autocast cast(DType::BFloat16, {.fp8 = recipe});
//     Tensor y = model(x);                             // the selected Linears through nn::fp8_linear
//   }
//
// nn::fp8_linear, for each call (one training micro-batch):
//   state.update()                                    the scales from the amaxes recorded by the previous calls
//   xq = fp8(x * s[0]), wq = fp8(W * s[1])            E4M3; W the float32 master weight itself (no bf16 copy)
//   y  = (xq @ wq^T) / (s[0] s[1]) + b                 one FP8 GEMM (fast accumulation on CUDA), y in the autocast
//   dtype
// backward:
//   gq = fp8(dY * s[2])                               E5M2 under Hybrid, E4M3 under Fp8Format::E4M3
//   dX = (gq @ wq) / (s[2] s[1])                      in x's dtype
//   dW = (gq^T @ xq) / (s[2] s[0])                    float32, for the float32 master weight
//   db = sum of dY's rows                             float32
// The amaxes of x and W are recorded by their quantisation (into row 0 of the amax history), that of dY by its
// quantisation in backward. The scales of a call are those update() set at its start: backward uses the same ones
// (kept with the graph), even when another forward of the same layer (gradient accumulation) updated the state
// since. A forward that a checkpoint recomputes in backward keeps its scales (no second update). A forward without
// gradients (evaluation) in an FP8 region updates and records as a training one does: evaluate outside FP8 regions
// (or in a region without a recipe) to leave the training scales alone. An empty input computes nothing in FP8.
// Everything is device work with no host sync, so a step can be captured into a CUDA graph.
//
// The FP8 GEMMs need every dimension a multiple of 16: in_features and out_features must be (the default module
// filter only selects such Linears); the rows (the number of x's elements / in_features) need not be: they are
// padded with zero rows inside (which change neither the amaxes nor dW) and the padding is cut from y and dX.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/autograd/fp8.h"  // Fp8Recipe, Fp8ScalingState
#include "kiln/layers/module.h"
#include "kiln/tensor/fp8_ops.h"  // internal::Fp8Activation
#include "kiln/tensor/tensor.h"

namespace kiln::amp {

// For every nn::Linear of `model` (named_modules(), so the filter sees qualified names such as "encoder.0.fc1"):
// if recipe.module_filter selects it, its FP8 state is made on `device` with `recipe` (as buffers "fp8_amax_history",
// "fp8_scale", "fp8_scale_inv", so the model's state_dict() and checkpoints carry it); if not, the Linear stays out of
// FP8 regions. Returns how many Linears compute in FP8. Call it before loading a checkpoint of an FP8 run into a new
// model, and whenever the filter looks at names. Without it, a Linear decides on its first forward in an FP8 region:
// the region's filter is asked with the name "" and, if it selects the Linear, the state is made then with the
// region's recipe. A Linear's state keeps the recipe it was made with (formats, history length, margin).
int64_t prepare_fp8(nn::Module& model, const Fp8Recipe& recipe, Device device);

}  // namespace kiln::amp

namespace kiln::nn {

// x (..., in) float32, bfloat16 or float16 (other floating dtypes are cast to out_dtype first); weight (out, in) with
// in and out multiples of 16; bias (out) or undefined; state: a Linear's (Fp8ScalingState::for_linear) on x's
// device; out_dtype BFloat16, Float16 or Float32. Returns (..., out) in out_dtype, differentiable in x, weight, bias.
// nn::Linear calls it inside FP8 regions; it is public for layers of their own and for tests.
// act: fp8_linear(act(x), ...), with the activation (a GELU, internal::Fp8Activation) applied to x's values in x's
// quantisation, so that act(x) is never written; backward takes the gradient through it to x.
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, amp::Fp8ScalingState& state,
                  DType out_dtype, internal::Fp8Activation act = internal::Fp8Activation::None);

// The outputs of up to 3 Linears on one input, side by side, as one FP8 product: fp8_linear(x, cat(weights),
// cat(biases), ...) without stacking the weights (their quantisation writes the stacked codes directly) and with each
// weight's and bias's gradient a tensor of its own. One state scales them all (BERT's query, key and value, whose
// Linears share it: Linear::share_fp8_state). weights: (out_i, in) of one dtype; biases: one per weight, or none.
Tensor fp8_linear_stacked(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases,
                          amp::Fp8ScalingState& state, DType out_dtype);

// fp8_linear(gelu(fp8_linear(x, w1, b1, state1)), w2, b2, state2) (gelu(., tanh_approximation)), a transformer's
// MLP, as one function whose GELU is never written: forward applies it as the second product quantises its input,
// backward takes the second product's input gradient through it as the first product's output gradient is quantised
// (internal::fp8_quantize_pair_through_gelu). w1 (hidden, in), w2 (out, hidden); two states of their own.
Tensor fp8_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, amp::Fp8ScalingState& state1, const Tensor& w2,
               const Tensor& b2, amp::Fp8ScalingState& state2, DType out_dtype, bool tanh_approximation = false);

// x's FP8 codes made ahead, by the op that makes x, for the FP8 product that reads x next (a layer norm whose output
// the next Linear takes: nn::dropout_add_layer_norm's fp8_next), so that x is quantised in the op's own pass instead
// of being read again by the product.
//
//   auto codes = nn::fp8_begin_input(state, y_shape, device);  // the product's step begins: state.update() now
//   ... the op writes y, and y's codes into codes->codes: saturate(y * input_scale), amax into input_amax ...
//   nn::fp8_offer_input(y, state, *codes);                     // the product with `state` that reads y takes them
//
// The product then neither updates the state nor quantises x: it takes the scales and codes as they are (and makes
// only the transposed copy its weight gradient needs). The values are those of the product quantising x itself.
struct Fp8InputCodes {
  Tensor codes;        // (rows, in) in the state's input format: to be written by the op
  Tensor scale;        // (3,) float32: the state's scales of this step (from its update), for the product
  Tensor scale_inv;    // (3,) float32, their inverses (elements 16 bytes apart)
  Tensor input_scale;  // (1,) view: the scale the codes are made with
  Tensor input_amax;   // (1,) view of the state's amax history: takes max |y|
};
// Begins the FP8 step of the product with `state` for an input of `shape` on `device` (the state's update), or
// nullopt where that product would not take codes made ahead: outside an FP8 region on the device, in a
// checkpoint's recomputation, for rows or features that are not multiples of 16, or a state on another device.
std::optional<Fp8InputCodes> fp8_begin_input(amp::Fp8ScalingState& state, const Shape& shape, Device device);
// Offers y's codes, written, to the product with `state` (autocast::offer_fp8): its next fp8_linear or fp8_mlp on y
// takes them; the state's update of that call is the one fp8_begin_input ran.
void fp8_offer_input(const Tensor& y, const amp::Fp8ScalingState& state, Fp8InputCodes codes);

class Linear;
// fc2(gelu(fc1(x))): fp8_mlp in an FP8 region where both Linears compute in FP8 (each with its own state), else in
// an FP8 region fc2.forward_gelu(fc1(x)), and outside FP8 regions nn::linear_gelu_linear with the two Linears'
// parameters (functional.h: one node in training, whose backward sums fc1's bias gradient as it takes the gradient
// through the GELU).
Tensor linear_gelu_linear(Linear& fc1, Linear& fc2, const Tensor& x, bool tanh_approximation = false);

}  // namespace kiln::nn
