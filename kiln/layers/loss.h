// kiln/layers/loss.h — loss functions with PyTorch's semantics: nn::cross_entropy, nn::nll_loss, nn::mse_loss, ...
//
//   using namespace kiln;
//   Tensor loss = nn::cross_entropy(logits, labels);                      // logits (N, C), labels (N) Int64
//   loss = nn::cross_entropy(logits, labels, {.ignore_index = 0, .label_smoothing = 0.1});
//   loss = nn::mse_loss(pred, target, {.reduction = nn::Reduction::Sum});
//   loss = nn::binary_cross_entropy_with_logits(scores, targets, {.pos_weight = pw});
//
// Every loss is composed of differentiable ops, so its gradient comes from autograd; on CUDA, cross_entropy with
// class-index targets is one fused softmax + loss kernel and one gradient kernel instead. There a target outside
// [0, C) (and not ignore_index) gives a NaN loss rather than an error, so that no step waits for the GPU; and
// when every target is ignored the mean loss is NaN with zero gradients, on every device (as PyTorch).
#pragma once

#include <cstdint>

#include "kiln/autograd/functions.h"  // the differentiable ops these compose
#include "kiln/tensor/tensor.h"       // Tensor

namespace kiln::nn {

// None: one loss per element (or per sample); Mean and Sum: a 0-d tensor.
enum class Reduction { None, Mean, Sum };

// Options of cross_entropy, as torch.nn.functional.cross_entropy's arguments.
struct CrossEntropyOptions {
  Tensor weight{};              // (C) per-class weights, or undefined for all ones
  int64_t ignore_index = -100;  // class-index targets equal to it add nothing (not to the mean's denominator either)
  Reduction reduction = Reduction::Mean;  // None (per sample), Mean (see cross_entropy) or Sum
  double label_smoothing = 0;             // in [0, 1]: the target becomes (1 - s) * target + s / C
};

// logits (N, C) or (N, C, d1, ...) (or unbatched (C)); target either class indices (N) / (N, d1, ...) of an
// integer dtype, or class probabilities of the logits' shape and a floating dtype. With indices and Mean,
// the sum is divided by the sum of the targets' class weights (the count of non-ignored targets without
// weights), as PyTorch. Computed through log_softmax, so large logits do not overflow.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

// Options of nll_loss, as torch.nn.functional.nll_loss's arguments.
struct NllLossOptions {
  Tensor weight{};                        // (C) per-class weights
  int64_t ignore_index = -100;            // targets equal to it add nothing (not to the mean's denominator either)
  Reduction reduction = Reduction::Mean;  // None (per target), Mean (weighted) or Sum
};

// log_probs (N, C) or (N, C, d1, ...) (or (C)), target class indices (N) / (N, d1, ...):
// loss_i = -weight[t_i] * log_probs[i, t_i]; Mean divides by the sum of weight[t_i] over non-ignored targets.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options = {});

// Options of mse_loss and l1_loss: the reduction only.
struct LossOptions {
  Reduction reduction = Reduction::Mean;  // None (per element), Mean or Sum
};

// (input - target)^2, elementwise; input and target of one shape.
Tensor mse_loss(const Tensor& input, const Tensor& target, const LossOptions& options = {});
// |input - target|, elementwise.
Tensor l1_loss(const Tensor& input, const Tensor& target, const LossOptions& options = {});

// Options of smooth_l1_loss, as torch.nn.functional.smooth_l1_loss's arguments.
struct SmoothL1LossOptions {
  Reduction reduction = Reduction::Mean;  // None (per element), Mean or Sum
  double beta = 1.0;                      // >= 0; 0 makes it l1_loss
};

// 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, with d = input - target.
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, const SmoothL1LossOptions& options = {});

// Options of binary_cross_entropy_with_logits, as torch.nn.functional.binary_cross_entropy_with_logits's arguments.
struct BceWithLogitsOptions {
  Tensor weight{};                        // broadcasts to the input's shape: rescales each element's loss
  Tensor pos_weight{};                    // broadcasts to the input's shape (usually (C)): weight of the positive term
  Reduction reduction = Reduction::Mean;  // None (per element), Mean or Sum
};

// -[pos_weight * t * log sigmoid(x) + (1 - t) * log(1 - sigmoid(x))] in the stable form
// (1 - t) * x + (1 + (pos_weight - 1) * t) * (log1p(exp(-|x|)) + relu(-x)); target in [0, 1], input's shape.
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BceWithLogitsOptions& options = {});

}  // namespace kiln::nn
