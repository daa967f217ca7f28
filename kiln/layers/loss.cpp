// Loss functions (loss.h), composed of kiln's differentiable ops with PyTorch's semantics.
#include "kiln/layers/autocast_ops.h"
#include "kiln/layers/loss.h"

#include <limits>
#include <string>

#include "kiln/autograd/autocast.h"  // autocast::inputs, DisableGuard: each loss is one op of the table
#include "kiln/tensor/error.h"       // KILN_CHECK

#if KILN_WITH_CUDA
#include "kiln/layers/cuda/cross_entropy.h"  // the fused CUDA path for class-index targets
#endif

namespace kiln::nn {
namespace {

// The weighted mean sum(loss) / total_weight of nll-style losses. When every target is ignored (total_weight 0)
// the value is NaN and every gradient 0, as PyTorch's nll_loss: the division uses 1 in place of 0 (so no 0 * inf
// reaches a gradient) and a NaN that carries no gradient is added.
Tensor weighted_mean(const Tensor& total, const Tensor& total_weight) {
  const Tensor none = total_weight == Scalar(0);
  const Tensor safe = where(none, ones_like(total_weight), total_weight);
  return total / safe + where(none, full_like(total, std::numeric_limits<double>::quiet_NaN()), zeros_like(total));
}

Tensor reduce(const Tensor& loss, Reduction reduction) {
  switch (reduction) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: return mean(loss);
  }
  return loss;
}

void check_same_shape(const char* op, const Tensor& input, const Tensor& target) {
  KILN_CHECK(input.shape() == target.shape(), op, ": input and target must have one shape, got input ", input.shape(),
             " and target ", target.shape(), "; reshape the target to the input's shape");
  KILN_CHECK(input.is_floating_point(), op, ": the input must be floating point, got ", input.dtype());
}

// (C) -> (1, C, 1, ...) with `rank` dims, so a class weight broadcasts along the class dim 1.
Tensor class_dim_view(const Tensor& weight, int64_t rank, int64_t class_dim) {
  Shape shape(static_cast<size_t>(rank), 1);
  shape[static_cast<size_t>(class_dim)] = weight.numel();
  return reshape(weight, shape);
}

void check_weight(const char* op, const Tensor& weight, int64_t num_classes) {
  if (!weight.defined()) return;
  KILN_CHECK(weight.dim() == 1 && weight.size(0) == num_classes, op, ": weight must have shape [", num_classes,
             "] (one per class), got ", weight.shape());
}

// The per-target parts of nll_loss with class-index targets: the losses -w[t] * log_probs[t] (0 where
// ignored) and the weights w[t] (0 where ignored) that Mean divides by. log_probs (N, C, *) with class dim 1;
// target (N, *).
struct NllParts {
  Tensor loss;     // (N, *)
  Tensor weights;  // (N, *)
  Tensor valid;    // (N, *), 1 where not ignored, in log_probs' dtype
};

// Class-index targets (N, *) for an input (N, C, *): dtype, shape and the class weight.
void check_class_target(const char* op, const Tensor& input, const Tensor& target, const Tensor& weight) {
  KILN_CHECK(is_integral(target.dtype()), op, ": class-index targets must be Int64 (or Int32), got ", target.dtype());
  bool shape_ok = target.dim() == input.dim() - 1 && target.size(0) == input.size(0);
  for (int64_t d = 1; shape_ok && d < target.dim(); ++d) shape_ok = target.size(d) == input.size(d + 1);
  KILN_CHECK(shape_ok, op, ": for input of shape ", input.shape(), " (N, C, d1, ...) the target must be (N, d1, ...)",
             ", got target shape ", target.shape());
  check_weight(op, weight, input.size(1));
}

NllParts nll_parts(const char* op, const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                   int64_t ignore_index) {
  check_class_target(op, log_probs, target, weight);
  const int64_t c = log_probs.size(1);
  Tensor t = target.dtype() == DType::Int64 ? target : target.to(DType::Int64);
  Tensor ignored = t == Scalar(ignore_index);
  if (t.is_cpu()) {
    // On a GPU this check would stall the host; there, out-of-range targets fail inside gather.
    Tensor in_range = logical_and(t >= Scalar(0), t < Scalar(c));
    KILN_CHECK(all(logical_or(in_range, ignored)).item<bool>(), op, ": every target must be a class index in [0, ", c,
               ") or ignore_index = ", ignore_index, "; got values from ", min(t).item<int64_t>(), " to ",
               max(t).item<int64_t>());
  }
  Tensor safe = masked_fill(t, ignored, 0);                              // (N, *)
  Tensor picked = squeeze(gather(log_probs, 1, unsqueeze(safe, 1)), 1);  // (N, *)
  Tensor valid = logical_not(ignored).to(log_probs.dtype());
  Tensor w = valid;
  if (weight.defined()) {
    Tensor w_t = reshape(index_select(weight.to(log_probs.dtype()), 0, flatten(safe)), t.shape());
    w = w_t * valid;
  }
  return {neg(picked) * w, w, valid};
}

// Unbatched (C) inputs with 0-d targets become a batch of one; `squeeze_back` undoes it for Reduction::None.
struct Batched {
  Tensor input, target;
  bool unbatched;
};

Batched batch_of_one(const char* op, const Tensor& input, const Tensor& target, bool prob_target) {
  KILN_CHECK(input.dim() >= 1, op, ": the input must be (C), (N, C) or (N, C, d1, ...), got a 0-d tensor");
  if (input.dim() == 1) {
    if (prob_target) return {unsqueeze(input, 0), unsqueeze(target, 0), true};
    KILN_CHECK(target.dim() == 0, op, ": for an unbatched input of shape ", input.shape(),
               " the target must be 0-d, got shape ", target.shape());
    return {unsqueeze(input, 0), unsqueeze(target, 0), true};
  }
  return {input, target, false};
}

}  // namespace

static Tensor nll_loss_as_one_op(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options) {
  auto [input, t, unbatched] = batch_of_one("nll_loss", log_probs, target, false);
  NllParts parts = nll_parts("nll_loss", input, t, options.weight, options.ignore_index);
  switch (options.reduction) {
    case Reduction::None: return unbatched ? squeeze(parts.loss, 0) : parts.loss;
    case Reduction::Sum: return sum(parts.loss);
    case Reduction::Mean: return weighted_mean(sum(parts.loss), sum(parts.weights));
  }
  return parts.loss;
}

static Tensor cross_entropy_as_one_op(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  KILN_CHECK(logits.defined() && logits.is_floating_point(), "cross_entropy: logits must be floating point, got ",
             logits.defined() ? dtype_name(logits.dtype()) : "an undefined tensor");
  const double s = options.label_smoothing;
  KILN_CHECK(s >= 0 && s <= 1, "cross_entropy: label_smoothing must lie in [0, 1], got ", s);
  const bool prob_target = target.is_floating_point();
  auto [input, t, unbatched] = batch_of_one("cross_entropy", logits, target, prob_target);
  const int64_t c = input.size(1);
#if KILN_WITH_CUDA
  if (!prob_target && cuda_impl::cross_entropy_fits(input, t, options)) {
    // Fused softmax + cross-entropy: no log_probs tensor; a target out of range gives NaN rather than an error.
    check_class_target("cross_entropy", input, t, options.weight);
    Tensor loss = cuda_impl::cross_entropy(input, t, options);
    return unbatched && options.reduction == Reduction::None ? squeeze(loss, 0) : loss;
  }
#endif
  Tensor log_probs = log_softmax(input, 1);  // (N, C, *)

  if (prob_target) {
    // Class probabilities: -sum_c w_c * q_c * log p_c per sample.
    KILN_CHECK(target.shape() == logits.shape(), "cross_entropy: probability targets must have the logits' shape ",
               logits.shape(), ", got ", target.shape(), "; for class indices pass an Int64 target");
    check_weight("cross_entropy", options.weight, c);
    Tensor q = s > 0 ? t * (1 - s) + s / static_cast<double>(c) : t;
    Tensor terms = log_probs * q;
    if (options.weight.defined()) terms = terms * class_dim_view(options.weight.to(input.dtype()), input.dim(), 1);
    switch (options.reduction) {
      case Reduction::None: {
        Tensor per_sample = neg(sum(terms, {1}));
        return unbatched ? squeeze(per_sample, 0) : per_sample;
      }
      case Reduction::Sum: return neg(sum(terms));
      case Reduction::Mean:
        // PyTorch divides by the number of samples (all positions), whatever the weights.
        return neg(sum(terms)) / static_cast<double>(input.numel() / c);
    }
  }

  NllParts parts = nll_parts("cross_entropy", log_probs, t, options.weight, options.ignore_index);
  Tensor nll, smooth;
  switch (options.reduction) {
    case Reduction::None: nll = parts.loss; break;
    case Reduction::Sum: nll = sum(parts.loss); break;
    case Reduction::Mean: nll = weighted_mean(sum(parts.loss), sum(parts.weights)); break;
  }
  if (s > 0) {
    // The uniform part of the smoothed target: -sum_c w_c * log p_c per position, 0 where ignored; Mean
    // divides by the same denominator as the nll part (PyTorch's cross_entropy_loss_label_smoothing).
    Tensor terms = log_probs;
    if (options.weight.defined()) terms = terms * class_dim_view(options.weight.to(input.dtype()), input.dim(), 1);
    Tensor per_position = neg(sum(terms, {1})) * parts.valid;  // (N, *)
    switch (options.reduction) {
      case Reduction::None: smooth = per_position; break;
      case Reduction::Sum: smooth = sum(per_position); break;
      case Reduction::Mean: smooth = weighted_mean(sum(per_position), sum(parts.weights)); break;
    }
    nll = nll * (1 - s) + smooth * (s / static_cast<double>(c));
  }
  return unbatched && options.reduction == Reduction::None ? squeeze(nll, 0) : nll;
}

static Tensor mse_loss_as_one_op(const Tensor& input, const Tensor& target, const LossOptions& options) {
  check_same_shape("mse_loss", input, target);
  return reduce(square(input - target), options.reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, const LossOptions& options) {
  check_same_shape("l1_loss", input, target);
  return reduce(abs(input - target), options.reduction);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, const SmoothL1LossOptions& options) {
  check_same_shape("smooth_l1_loss", input, target);
  const double beta = options.beta;
  KILN_CHECK(beta >= 0, "smooth_l1_loss: beta must be >= 0, got ", beta);
  Tensor d = input - target;
  Tensor ad = abs(d);
  if (beta == 0) return reduce(ad, options.reduction);
  Tensor loss = where(ad < Scalar(beta), square(d) * (0.5 / beta), ad - 0.5 * beta);
  return reduce(loss, options.reduction);
}

static Tensor binary_cross_entropy_with_logits_as_one_op(const Tensor& input, const Tensor& target,
                                                         const BceWithLogitsOptions& options) {
  check_same_shape("binary_cross_entropy_with_logits", input, target);
  // -log sigmoid(x) = log1p(exp(-|x|)) + relu(-x): never exponentiates a large positive number.
  Tensor neg_log_sigmoid = log1p(exp(neg(abs(input)))) + relu(neg(input));
  Tensor loss;
  if (options.pos_weight.defined()) {
    Tensor log_weight = (options.pos_weight - 1) * target + 1;
    loss = (1 - target) * input + log_weight * neg_log_sigmoid;
  } else {
    loss = (1 - target) * input + neg_log_sigmoid;
  }
  if (options.weight.defined()) loss = loss * options.weight;
  KILN_CHECK(loss.shape() == input.shape(), "binary_cross_entropy_with_logits: weight ",
             options.weight.defined() ? options.weight.shape() : Shape{}, " and pos_weight ",
             options.pos_weight.defined() ? options.pos_weight.shape() : Shape{},
             " must broadcast to the input's shape ", input.shape());
  return reduce(loss, options.reduction);
}

// The losses made of several ops run as one op of the autocast table (float32 under autocast): inputs cast by
// the policy, the ops inside with autocast off, as PyTorch runs a composite op below its autocast dispatch.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options) {
  auto [lp, w] = autocast::inputs(autocast_ops::nll_loss(), log_probs, options.weight);
  autocast::DisableGuard as_one_op;
  NllLossOptions o = options;
  o.weight = w;
  return nll_loss_as_one_op(lp, target, o);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
#if KILN_WITH_CUDA
  // Class indices on a GPU: the fused kernel applies the policy itself, reading 16-bit logits in place (float32
  // math) instead of materialising a float32 copy of them.
  if (logits.is_cuda() && !target.is_floating_point()) return cross_entropy_as_one_op(logits, target, options);
#endif
  // Probability targets are cast with the logits; class indices are integers and stay as they are.
  auto [x, t, w] = autocast::inputs(autocast_ops::cross_entropy(), logits, target, options.weight);
  autocast::DisableGuard as_one_op;
  CrossEntropyOptions o = options;
  o.weight = w;
  return cross_entropy_as_one_op(x, t, o);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const LossOptions& options) {
  auto [x, t] = autocast::inputs(autocast_ops::mse_loss(), input, target);
  autocast::DisableGuard as_one_op;
  return mse_loss_as_one_op(x, t, options);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BceWithLogitsOptions& options) {
  auto [x, t, w, pw] = autocast::inputs(autocast_ops::binary_cross_entropy_with_logits(), input, target, options.weight,
                                        options.pos_weight);
  autocast::DisableGuard as_one_op;
  BceWithLogitsOptions o = options;
  o.weight = w;
  o.pos_weight = pw;
  return binary_cross_entropy_with_logits_as_one_op(x, t, o);
}

}  // namespace kiln::nn
