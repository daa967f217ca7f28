// kiln/layers/functional.h — the layers as functions: nn::linear, nn::dropout, the normalisations, nn::embedding.
//
//   using namespace kiln;
//   Tensor h = nn::linear(x, w, b);                             // x (N, 784), w (256, 784), b (256) -> (N, 256)
//   h = nn::dropout(relu(h), 0.1, /*training=*/true);
//   Tensor y = nn::layer_norm(h, {256}, gamma, beta);
//   Tensor e = nn::embedding(tokens, table, /*padding_idx=*/0);  // tokens (B, T) Int64, table (V, D) -> (B, T, D)
//
// Each is composed of the differentiable ops of kiln/autograd/functions.h, so gradients come from autograd.
// Activations as functions are kiln::relu, kiln::gelu, kiln::silu, kiln::tanh, kiln::sigmoid, kiln::softmax.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>  // std::pair

#include "kiln/autograd/functions.h"  // the differentiable ops these compose
#include "kiln/tensor/generator.h"    // Generator
#include "kiln/tensor/tensor.h"       // Tensor, Shape

namespace kiln::amp {
class Fp8ScalingState;
}  // namespace kiln::amp

namespace kiln::nn {

// y = x @ weight^T + bias, weight (out, in) as PyTorch: x (..., in) -> (..., out). bias (out) may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

// linear(gelu(linear(x, w1, b1), tanh_approximation), w2, b2): a transformer's MLP, w1 (hidden, in), w2 (out, hidden),
// b1 (hidden) and b2 (out) undefined or not. Where it trains (grad mode on, a gradient wanted), not under export's
// capture, it runs as one autograd node, either under autocast in its 16-bit dtype (x float32 or that dtype, the
// parameters cast as linear casts them) or with x and every parameter of one dtype: backward then computes the
// GELU's gradient and the first bias's gradient (its column sums) in one pass (gelu_backward_with_column_sums)
// instead of summing them in a pass of their own. Its values are the composed ops': the output bit for bit, the
// gradients but for the order in which b1's gradient is summed. Elsewhere it is the composition itself.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                          bool tanh_approximation = false);

// The gradient through a GELU and the column sums of that gradient: dh = g * gelu'(h) (internal::gelu_backward's
// values: the erf form, or the tanh form) and sums (C) = the sums over every row of dh (..., C) as stored, in float32
// (float64 for float64 g). g and h: one shape and one floating dtype, on one device. On CUDA, for float32, bfloat16
// and float16 rows that are contiguous, 16-byte aligned and a multiple of 16 bytes long, one kernel writes dh and a
// partial sum per 64 rows in a fixed order (the sums do not vary between runs); elsewhere gelu_backward and a sum.
// Not differentiable (a step of a backward pass).
std::pair<Tensor, Tensor> gelu_backward_with_column_sums(const Tensor& g, const Tensor& h,
                                                         bool tanh_approximation = false);

// Inverted dropout: zeroes each element with probability p and scales the rest by 1 / (1 - p), with the mask
// of bernoulli(x.shape(), 1 - p) drawn from `gen` (the default generator of x's device when null), in one
// kernel (internal::dropout) that also keeps the mask for backward. Identity when not training or p == 0. p must
// lie in [0, 1).
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

// Normalises over the last normalized_shape.size() dims (which must equal normalized_shape), with the
// biased variance; weight and bias (of normalized_shape) may be undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5);

// layer_norm(x + residual, ...), a transformer's residual connection, as one op. On the GPU it is one kernel
// forward and one backward for rows of up to 1024 elements, also where x is 16-bit (a sublayer's output under
// autocast) and residual Float32: the sum is then formed in Float32, exactly as the add would form it.
Tensor add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape, const Tensor& weight = {},
                      const Tensor& bias = {}, double eps = 1e-5);

// add_layer_norm(dropout(x, p, training, gen), residual, ...): a transformer's "dropout, residual add, LayerNorm"
// (BERT's output blocks). The mask is exactly nn::dropout's from the same generator state, which it leaves where
// nn::dropout leaves it. On the GPU, training with p > 0 and rows add_layer_norm fuses (not Float64), it is one
// kernel forward, which draws the mask, keeps it as one bit per element and adds the dropped x to the residual, and
// one backward, which masks x's gradient as it writes it; a CUDA graph replay draws a new mask, as internal::dropout's.
// Elsewhere it runs the two ops. Eval or p == 0: add_layer_norm. p must lie in [0, 1).
// fp8_next (null: none): the FP8 scaling state of the Linear that takes the output next (BERT's next layer's query, or
// its MLP's first Linear). In training, in an FP8 region on the output's device, with rows and features multiples of
// 16, the output's FP8 codes for that product are made here (nn::fp8_begin_input: on the GPU in the kernel's own pass,
// elsewhere by quantising the output) and offered to it (nn::fp8_offer_input), so that the product does not read the
// output again to quantise it. The product's values are the same either way.
Tensor dropout_add_layer_norm(const Tensor& x, const Tensor& residual, double p, bool training,
                              const Shape& normalized_shape, const Tensor& weight = {}, const Tensor& bias = {},
                              double eps = 1e-5, Generator* gen = nullptr, amp::Fp8ScalingState* fp8_next = nullptr);

// x (N, C, *): normalises each of num_groups groups of C / num_groups channels (and all of *) per sample;
// weight and bias (C) may be undefined.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5);

// x (N, C) or (N, C, *), statistics per channel over every other dim. Training: normalises with the batch
// mean and biased variance, and (when defined) updates running_mean and running_var in place, under
// NoGradGuard: running = (1 - momentum) * running + momentum * batch, with the unbiased variance.
// Eval: normalises with the running statistics, which must then be defined. weight, bias (C) may be undefined.
// num_batches_tracked (a 1-element Int64 tensor, BatchNorm's buffer), where defined, gets 1 added in training (on
// CUDA by the statistics kernel, with no launch of its own).
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight = {},
                  const Tensor& bias = {}, bool training = false, double momentum = 0.1, double eps = 1e-5,
                  const Tensor& num_batches_tracked = {});

// relu(batch_norm(...)) with the same arguments; one fused kernel (and a masked backward) on CUDA.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight = {}, const Tensor& bias = {}, bool training = false, double momentum = 0.1,
                       double eps = 1e-5, const Tensor& num_batches_tracked = {});

// relu(batch_norm(x, ...) + residual): the tail of a ResNet block, with batch_norm's arguments; residual has x's
// shape (any layout) and device. The result has the dtype of batch_norm(x) + residual, as that composition gives
// it (promoted, like PyTorch's add, when the residual's dtype differs; autocast casts x, weight and bias as for
// batch_norm and leaves the residual alone). On CUDA, when the residual has x's dtype (after autocast), it is
// one fused kernel forward and one reduction + one pass backward that writes the gradients of x and of the
// residual; otherwise, and on the CPU, it is the composition itself.
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight = {}, const Tensor& bias = {},
                           bool training = false, double momentum = 0.1, double eps = 1e-5,
                           const Tensor& num_batches_tracked = {});

// Rows of weight (V, D) picked by integer index (...) -> (..., D). The padding row's lookups pass no
// gradient to it (a negative padding_idx counts from V). sparse: backward adds the looked-up rows' gradients to
// weight's row-sparse gradient (kiln/autograd/sparse_grad.h) rather than a dense (V, D) one; weight must then be a
// leaf (a parameter).
Tensor embedding(const Tensor& index, const Tensor& weight, std::optional<int64_t> padding_idx = {},
                 bool sparse = false);

}  // namespace kiln::nn
