// kiln/layers/cuda/attention_probs.h — attention's probabilities in one kernel each way, for the math path of
// scaled_dot_product_attention on the GPU (internal): the masked softmax of the scores, its fully masked rows zeroed,
// and the attention dropout, where the unfused ops make about eight passes over the (..., L, S) scores forward and
// sixteen backward.
//
//   forward:  probs = softmax over the row's allowed keys of scores (0 for the others; a row with no allowed key all
//             0), and with dropout dropped = probs * mask as internal::dropout(probs, p) draws and scales it (the same
//             Philox numbering, so the same mask for the same generator state), keep bits saved for backward.
//   backward: d_scores = probs * (d_probs - sum(d_probs * probs)), d_probs = grad (or grad * mask with dropout, as
//             dropout's backward rounds it), 0 where a key is not allowed and on rows with none.
//
// Rows of S contiguous elements, S % 4 == 0 and S <= 1024, float32 or 16-bit (computed in float), 16-byte aligned
// (8-byte for 16-bit types); `forbidden` is Bool, true where a key may not be seen, expanded (any strides, 0 where it
// broadcasts) to the scores' shape, or undefined (every key allowed).
#pragma once

#include "kiln/tensor/generator.h"  // GeneratorState
#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

// Whether the kernels take these scores (dtype, row length, layout, alignment; at most 6 dims).
bool attention_probs_fusable(const Tensor& scores);

struct AttentionProbs {
  Tensor probs;    // scores' shape and dtype, contiguous
  Tensor dropped;  // probs with the dropout applied (undefined without dropout)
  Tensor keep;     // (rows, 4 ceil(S / 128)) Int32 keep bits (undefined without dropout)
};

// p in [0, 1); `draw` is used when p > 0 (internal::draw_for's, one per call).
AttentionProbs attention_probs_forward(const Tensor& scores, const Tensor& forbidden, double p,
                                       const GeneratorState& draw);

// grad: of `dropped` (with dropout) or of `probs`, any layout; returns the scores' gradient in their dtype.
Tensor attention_probs_backward(const Tensor& grad, const Tensor& probs, const Tensor& keep, const Tensor& forbidden,
                                double p);

}  // namespace kiln::nn::cuda_impl
