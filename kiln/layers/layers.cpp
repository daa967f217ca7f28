// The simple layers as modules (layers.h).
#include "kiln/layers/layers.h"
#include "kiln/layers/autocast_ops.h"

#include <cmath>
#include <string>
#include <utility>

#include "kiln/autograd/autocast.h"    // autocast::inputs: the reducer path runs as one op, as nn::batch_norm
#include "kiln/autograd/checkpoint.h"  // in_recomputation: running statistics once per batch
#include "kiln/autograd/grad_mode.h"   // NoGradGuard for the batch counter
#include "kiln/layers/fp8_linear.h"    // nn::fp8_linear: Linear inside FP8 autocast regions
#include "kiln/layers/functional.h"    // nn::linear, nn::batch_norm, ...
#include "kiln/layers/init.h"          // PyTorch's default initialisation
#include "kiln/tensor/backend.h"       // detail::IndexOpScope: a bad id names the table
#include "kiln/tensor/checked_size.h"  // checked_nbytes: the weight's size
#include "kiln/tensor/error.h"         // KILN_CHECK
#include "kiln/tensor/trace.h"         // trace::Scope: the module ranges of calls that bypass a handle

namespace kiln::nn {

// ---------------------------------------------------------------- Linear

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : Module("Linear"), in_features(in_features), out_features(out_features) {
  KILN_CHECK(in_features > 0 && out_features > 0, "Linear: in_features and out_features must be positive, got ",
             in_features, " and ", out_features);
  weight = register_parameter("weight", empty({out_features, in_features}));
  if (options.bias) bias = register_parameter("bias", empty({out_features}));
  reset_parameters();
}

void Linear::reset_parameters(Generator* gen) {
  // PyTorch: kaiming_uniform_(a = sqrt(5)) gives U(-1/sqrt(in), 1/sqrt(in)); the bias the same bound.
  init::kaiming_uniform_(weight, std::sqrt(5.0), init::FanMode::FanIn, init::Nonlinearity::LeakyReLU, gen);
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    init::uniform_(bias, -bound, bound, gen);
  }
}

amp::Fp8ScalingState* Linear::fp8_state_in_region(const Tensor& input) {
  KILN_CHECK(input.dim() >= 1 && input.size(-1) == in_features, "Linear: expected input of shape (..., ", in_features,
             ") (in_features = ", in_features, "), got shape ", input.shape());
  const amp::Fp8Recipe* recipe = autocast::fp8_recipe(input.device().type());
  return recipe != nullptr && input.is_floating_point() ? fp8_state_for(*recipe, input.device()) : nullptr;
}

Tensor Linear::forward(const Tensor& input) {
  if (amp::Fp8ScalingState* state = fp8_state_in_region(input)) {
    return fp8_linear(input, weight, bias, *state, autocast::get_dtype(input.device().type()));
  }
  return linear(input, weight, bias);
}

Tensor Linear::forward_gelu(const Tensor& pre, bool tanh_approximation) {
  trace::Scope range(trace::Kind::Module, type_name(), pre.device(), {}, this);  // as a call through a handle
  if (amp::Fp8ScalingState* state = fp8_state_in_region(pre)) {
    return fp8_linear(pre, weight, bias, *state, autocast::get_dtype(pre.device().type()),
                      tanh_approximation ? internal::Fp8Activation::GeluTanh : internal::Fp8Activation::Gelu);
  }
  return forward(gelu(pre, tanh_approximation));
}

// ---------------------------------------------------------------- Dropout

Dropout::Dropout(DropoutOptions options) : Module("Dropout"), options(options) {
  KILN_CHECK(options.p >= 0 && options.p < 1, "Dropout: p must lie in [0, 1), got ", options.p);
}

Tensor Dropout::forward(const Tensor& input) { return dropout(input, options.p, is_training()); }

// ---------------------------------------------------------------- Embedding

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options)
    : Module("Embedding"), num_embeddings(num_embeddings), embedding_dim(embedding_dim), sparse(options.sparse) {
  KILN_CHECK(num_embeddings > 0 && embedding_dim > 0,
             "Embedding: num_embeddings and embedding_dim must be positive, got ", num_embeddings, " and ",
             embedding_dim);
  if (options.padding_idx) {
    int64_t pad = *options.padding_idx;
    KILN_CHECK(pad >= -num_embeddings && pad < num_embeddings, "Embedding: padding_idx ", pad, " is out of range for ",
               num_embeddings, " embeddings; use a value in [-", num_embeddings, ", ", num_embeddings, ")");
    padding_idx = pad < 0 ? pad + num_embeddings : pad;
  }
  // The weight's element and byte counts must fit in int64 (a wrapped count would allocate too little).
  (void)checked_nbytes({num_embeddings, embedding_dim}, 4, "Embedding (num_embeddings, embedding_dim) weight");
  weight = register_parameter("weight", empty({num_embeddings, embedding_dim}, {.device = options.device}));
  reset_parameters();
}

void Embedding::reset_parameters(Generator* gen) {
  init::normal_(weight, 0, 1, gen);
  if (padding_idx) {
    Tensor row = weight.select(0, *padding_idx);
    init::zeros_(row);
  }
}

Tensor Embedding::forward(const Tensor& indices) {
  KILN_CHECK(is_integral(indices.dtype()), "Embedding: expected integer indices (Int64), got ", indices.dtype(),
             " of shape ", indices.shape());
  // A bad id's error names this table (`Embedding "tables.17" (1000 x 16 table): index 1000 is out of range ...`):
  // thrown by this call on the CPU, by a later call on a GPU (whose kernel records the scope's name at launch). The
  // name is made only then.
  kiln::detail::IndexOpScope scope(
      [](const void* self) {
        const auto& e = *static_cast<const Embedding*>(self);
        return kiln::detail::str_cat(e.display_name(), " (", e.num_embeddings, " x ", e.embedding_dim, " table)");
      },
      this);
  return embedding(indices, weight, padding_idx, sparse);
}

// ---------------------------------------------------------------- LayerNorm, GroupNorm

LayerNorm::LayerNorm(Shape normalized_shape_in, LayerNormOptions options)
    : Module("LayerNorm"), normalized_shape(std::move(normalized_shape_in)), options(options) {
  KILN_CHECK(!normalized_shape.empty(), "LayerNorm: normalized_shape must name at least one dim");
  if (options.elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    if (options.bias) bias = register_parameter("bias", zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& input) {
  const auto k = static_cast<int64_t>(normalized_shape.size());
  bool match = input.dim() >= k;
  for (int64_t i = 0; match && i < k; ++i) {
    match = input.size(input.dim() - k + i) == normalized_shape[static_cast<size_t>(i)];
  }
  KILN_CHECK(match, "LayerNorm: expected input of shape (..., ", normalized_shape, ") ending in normalized_shape ",
             normalized_shape, ", got shape ", input.shape());
  return layer_norm(input, normalized_shape, weight, bias, options.eps);
}

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, GroupNormOptions options)
    : Module("GroupNorm"), num_groups(num_groups), num_channels(num_channels), options(options) {
  KILN_CHECK(num_groups > 0 && num_channels % num_groups == 0, "GroupNorm: num_channels ", num_channels,
             " must be divisible by num_groups ", num_groups);
  if (options.affine) {
    weight = register_parameter("weight", ones({num_channels}));
    bias = register_parameter("bias", zeros({num_channels}));
  }
}

Tensor GroupNorm::forward(const Tensor& input) {
  KILN_CHECK(input.dim() >= 2 && input.size(1) == num_channels, "GroupNorm: expected input of shape (N, ", num_channels,
             ", *) (num_channels = ", num_channels, "), got shape ", input.shape());
  return group_norm(input, num_groups, weight, bias, options.eps);
}

// ---------------------------------------------------------------- BatchNorm

BatchNorm::BatchNorm(const char* type_name, int64_t num_features, BatchNormOptions options)
    : Module(type_name), num_features(num_features), options(options) {
  KILN_CHECK(num_features > 0, type_name, ": num_features must be positive, got ", num_features);
  if (options.affine) {
    weight = register_parameter("weight", ones({num_features}));
    bias = register_parameter("bias", zeros({num_features}));
  }
  if (options.track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({num_features}));
    running_var = register_buffer("running_var", ones({num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, {.dtype = DType::Int64}));
  }
}

void BatchNorm::reset_running_stats() {
  if (!options.track_running_stats) return;
  NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void BatchNorm::reset_parameters() {
  reset_running_stats();
  if (options.affine) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor BatchNorm::forward(const Tensor& input) { return normalize(input, false); }

Tensor BatchNorm::forward_relu(const Tensor& input) {
  trace::Scope range(trace::Kind::Module, type_name(), input.device(), {}, this);  // as operator() marks forward
  return normalize(input, true);
}

Tensor BatchNorm::forward_add_relu(const Tensor& input, const Tensor& residual) {
  trace::Scope range(trace::Kind::Module, type_name(), input.device(), {}, this);  // as operator() marks forward
  KILN_CHECK(residual.defined(), type_name(), ": forward_add_relu needs a defined residual");
  return normalize(input, true, residual);
}

Tensor BatchNorm::normalize(const Tensor& input, bool relu, const Tensor& residual) {
  check_input(input);
  KILN_CHECK(input.size(1) == num_features, type_name(), ": expected ", num_features,
             " channels (num_features) in dim 1, got input shape ", input.shape());
  if (residual.defined()) {
    KILN_CHECK(residual.shape() == input.shape(), type_name(), ": forward_add_relu needs a residual of the input's ",
               "shape ", input.shape(), ", got ", residual.shape());
    KILN_CHECK(residual.device() == input.device(), type_name(), ": forward_add_relu's residual (", residual.shape(),
               ") is on ", residual.device(), " but the input is on ", input.device(), "; move it with .to(",
               input.device(), ")");
  }
  // Under gradient checkpointing, backward runs this again to recompute the activations: the running
  // statistics and the batch counter were updated by forward already, so the recomputation leaves them.
  const bool track = is_training() && options.track_running_stats && !autograd::in_recomputation();
  double factor = options.momentum.value_or(0.0);
  // The batch counter: counted by the batch-norm op below (on CUDA inside its statistics kernel, no launch of its
  // own), except without a momentum or with a statistics reducer, where it is counted here.
  Tensor counter;
  if (track) {
    if (!options.momentum || stats_reducer_) {
      NoGradGuard no_grad;
      num_batches_tracked.add_(1);
      // Without a momentum: the cumulative average, 1 / (batches so far). Reading the counter syncs with the GPU.
      if (!options.momentum) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
    } else {
      counter = num_batches_tracked;
    }
  }
  if (is_training() && stats_reducer_) {
    if (!residual.defined()) return normalize_global(input, relu, factor, track);
    Tensor y = normalize_global(input, false, factor, track);
    autocast::DisableGuard as_one_op;  // the add promotes, as in batch_norm_add_relu
    return kiln::relu(y + residual);
  }
  // Without running statistics, eval mode normalises with the batch's statistics too.
  const bool use_batch_stats = is_training() || !running_mean.defined();
  const bool update = !is_training() || track;
  const Tensor rm = update ? running_mean : Tensor(), rv = update ? running_var : Tensor();
  if (residual.defined()) {
    return batch_norm_add_relu(input, residual, rm, rv, weight, bias, use_batch_stats, factor, options.eps, counter);
  }
  return (relu ? batch_norm_relu : batch_norm)(input, rm, rv, weight, bias, use_batch_stats, factor, options.eps,
                                               counter);
}

Tensor BatchNorm::normalize_global(const Tensor& input, bool relu_after, double factor, bool track) {
  // Autocast keeps the input's dtype for batch norm (as nn::batch_norm); the ops below run as one op.
  auto [x, w, b] = autocast::inputs(autocast_ops::batch_norm(), input, weight, bias);
  autocast::DisableGuard as_one_op;
  const int64_t c = num_features, rank = x.dim();
  const int64_t local_count = c > 0 ? x.numel() / c : 0;  // values per channel on this process
  const int world = stats_reducer_->world_size();
  // The global count is only known after the reduction; with one process it is the local one. (With several,
  // a process may hold few or no samples: the global count decides, as PyTorch's SyncBatchNorm.)
  KILN_CHECK(world > 1 || local_count > 1, type_name(),
             ": training needs more than 1 value per channel, got input shape ", x.shape(),
             "; use a larger batch or eval()");
  // 16-bit activations: statistics and normalisation in float32 (a sum over millions of values in bfloat16
  // would lose nearly every digit); the output returns to the input's dtype, as the fused kernels do.
  const bool low = x.dtype() == DType::Float16 || x.dtype() == DType::BFloat16;
  const DType dt = low ? DType::Float32 : x.dtype();
  const Tensor xf = low ? cast(x, dt) : x;  // (N, C, *)
  // Every dim but the channel dim 1, and the shape (1, C, 1, ...) that broadcasts a (C) tensor over (N, C, *).
  Dims dims{0};
  for (int64_t d = 2; d < rank; ++d) dims.push_back(d);
  Shape bshape(static_cast<size_t>(rank), 1);
  bshape[1] = c;
  auto reduce = [&](const Tensor& t, const char* what) {
    Tensor r = stats_reducer_->all_reduce_sum(t);
    KILN_CHECK(r.defined() && r.shape() == t.shape() && r.dtype() == t.dtype(), type_name(),
               ": the statistics reducer returned ", r.defined() ? r.shape() : Shape{}, " ",
               r.defined() ? r.dtype() : t.dtype(), " for the ", what, " of shape ", t.shape(), " ", t.dtype(),
               "; all_reduce_sum must return a tensor of its input's shape and dtype");
    return r;
  };

  // Pass 1: (sum per channel, count) -> summed over processes -> global mean. One reduction of (C + 1).
  Tensor count_local = full({1}, static_cast<double>(local_count), {.dtype = dt, .device = x.device()});
  Tensor sums = reduce(cat({sum(xf, dims), count_local}, 0), "per-channel sums and count");  // (C + 1)
  // The count carries no gradient (it depends on shapes only). In float32 it is exact up to 2^24 per process.
  Tensor count = narrow(sums, 0, c, 1).detach();       // (1)
  Tensor global_mean = narrow(sums, 0, 0, c) / count;  // (C)
  // Pass 2: the sum of squared deviations from the global mean, summed over processes -> biased variance.
  Tensor centered = xf - reshape(global_mean, bshape);                                 // (N, C, *)
  Tensor global_var = reduce(sum(square(centered), dims), "sums of squares") / count;  // (C)
  Tensor y = centered * reshape(rsqrt(global_var + options.eps), bshape);
  if (w.defined()) y = y * reshape(w, bshape);
  if (b.defined()) y = y + reshape(b, bshape);
  if (relu_after) y = kiln::relu(y);
  if (low && y.dtype() != x.dtype()) y = cast(y, x.dtype());

  if (track) {
    // running = (1 - factor) * running + factor * batch, with the unbiased variance of the global batch.
    // All on the device: no host sync (the count stays a tensor).
    NoGradGuard no_grad;
    Tensor rm = running_mean, rv = running_var;  // handles share the buffers
    Tensor m = global_mean.detach().to(rm.dtype());
    Tensor v = (global_var.detach() * count / (count - 1)).to(rv.dtype());
    rm.mul_(1 - factor).add_(m, factor);
    rv.mul_(1 - factor).add_(v, factor);
  }
  return y;
}

BatchNorm1d::BatchNorm1d(int64_t num_features, BatchNormOptions options)
    : BatchNorm("BatchNorm1d", num_features, options) {}

void BatchNorm1d::check_input(const Tensor& input) const {
  KILN_CHECK(input.dim() == 2 || input.dim() == 3, "BatchNorm1d: expected a 2-D (N, ", num_features, ") or 3-D (N, ",
             num_features, ", L) input, got shape ", input.shape());
}

BatchNorm2d::BatchNorm2d(int64_t num_features, BatchNormOptions options)
    : BatchNorm("BatchNorm2d", num_features, options) {}

void BatchNorm2d::check_input(const Tensor& input) const {
  KILN_CHECK(input.dim() == 4, "BatchNorm2d: expected a 4-D input (N, ", num_features, ", H, W), got shape ",
             input.shape());
}

// ---------------------------------------------------------------- Flatten

Tensor Flatten::forward(const Tensor& input) { return flatten(input, options.start_dim, options.end_dim); }

}  // namespace kiln::nn
