// kiln/layers/layers.h — the simple layers as modules: Linear, Dropout, Embedding, the normalisations,
// the activations, Flatten and Identity. PyTorch's parameter names and default initialisation.
//
//   using namespace kiln;
//   auto fc = std::make_shared<nn::Linear>(784, 10);                 // "weight" (10, 784), "bias" (10)
//   auto head = std::make_shared<nn::Linear>(256, 2, nn::LinearOptions{.bias = false});
//   auto bn = std::make_shared<nn::BatchNorm2d>(64, nn::BatchNormOptions{.momentum = 0.01});
//   auto drop = std::make_shared<nn::Dropout>(0.1);
//   Tensor y = (*fc)(x);                                              // x (N, 784) -> (N, 10)
//
// Parameters are created on the CPU in float32; move a model with to(). Each layer checks its input's rank
// and feature size and names itself, the expected and the given shapes in the error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "kiln/layers/module.h"  // nn::Module
#include "kiln/tensor/generator.h"

namespace kiln::nn {

// ---------------------------------------------------------------- Linear
struct LinearOptions {
  bool bias = true;
};

// (..., in_features) -> (..., out_features). weight (out, in) and bias (out) start U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  Tensor forward(const Tensor& input) override;
  void reset_parameters(Generator* gen = nullptr);

  int64_t in_features, out_features;
  Tensor weight;  // (out_features, in_features)
  Tensor bias;    // (out_features); undefined without bias
};

// ---------------------------------------------------------------- Dropout
struct DropoutOptions {
  double p = 0.5;  // probability of zeroing an element, in [0, 1)
};

// Inverted dropout in training mode; the identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(DropoutOptions options = {});
  explicit Dropout(double p) : Dropout(DropoutOptions{.p = p}) {}
  Tensor forward(const Tensor& input) override;

  DropoutOptions options;
};

// ---------------------------------------------------------------- Embedding
struct EmbeddingOptions {
  std::optional<int64_t> padding_idx{};  // that row starts at zero and gets no gradient; negative counts from the end
};

// Integer indices (...) -> (..., embedding_dim). "weight" (num_embeddings, embedding_dim) starts N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options = {});
  Tensor forward(const Tensor& indices) override;
  void reset_parameters(Generator* gen = nullptr);

  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;  // non-negative once constructed
  Tensor weight;
};

// ---------------------------------------------------------------- normalisation
struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;  // "weight" (ones) and "bias" (zeros) of normalized_shape
  bool bias = true;                // with elementwise_affine: whether there is a bias
};

// Normalises over the last dims, which must equal normalized_shape.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, LayerNormOptions options = {});
  Tensor forward(const Tensor& input) override;

  Shape normalized_shape;
  LayerNormOptions options;
  Tensor weight, bias;  // undefined without elementwise_affine
};

struct GroupNormOptions {
  double eps = 1e-5;
  bool affine = true;  // "weight" (ones) and "bias" (zeros) of (num_channels)
};

// (N, C, *) with C = num_channels, normalised per sample over groups of C / num_groups channels.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, GroupNormOptions options = {});
  Tensor forward(const Tensor& input) override;

  int64_t num_groups, num_channels;
  GroupNormOptions options;
  Tensor weight, bias;
};

struct BatchNormOptions {
  double eps = 1e-5;
  // Weight of the new batch in the running statistics; none: the cumulative average over all batches.
  std::optional<double> momentum = 0.1;
  bool affine = true;               // "weight" (ones) and "bias" (zeros) of (num_features)
  bool track_running_stats = true;  // buffers "running_mean", "running_var", "num_batches_tracked" (Int64, 0-d)
};

// Sums BatchNorm's per-channel statistics over the processes of a job, so that training normalises with the
// statistics of the global batch (SyncBatchNorm) rather than of this process's few samples. kiln/distributed
// implements it over a process group (dist::convert_sync_batchnorm); layers know nothing of processes.
class BatchNormStatsReducer {
 public:
  virtual ~BatchNormStatsReducer() = default;
  // The elementwise sum of `t` (1-D, float32 or float64) over every process, as a new tensor of t's shape.
  // Differentiable: its backward sums the incoming gradient over every process the same way, so each process
  // gets the gradient of the sum of all processes' losses with respect to its own statistics. Every process
  // must call it the same number of times in the same order (forward and backward).
  virtual Tensor all_reduce_sum(const Tensor& t) = 0;
  // The number of processes. A set reducer is used at any world size; with 1, BatchNorm refuses (as without a
  // reducer) a batch of one value per channel, which with more processes is fine (the global count decides).
  virtual int world_size() const = 0;
};

// Batch normalisation over every dim but the channel dim 1. Training uses the batch's statistics and updates
// the running ones; eval uses the running ones (or the batch's, without track_running_stats).
//
// With a statistics reducer set, training uses the statistics of the global batch instead: per channel, the
// local sum and element count are summed over processes (one reduction), then the sum of squared deviations
// from the global mean (a second one: two passes, as accurate as the local path). The normalisation is then
// composed of differentiable ops (not the fused GPU kernel) and 16-bit inputs compute in float32. The
// running statistics are updated with the global mean and the unbiased global variance. Eval mode is
// unchanged. With one process the results equal those without a reducer, up to float rounding.
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  // relu(forward(input)) in one pass on the GPU (nn::batch_norm_relu): what ResNet's blocks use.
  Tensor forward_relu(const Tensor& input);
  // relu(forward(input) + residual) (nn::batch_norm_add_relu), residual of input's shape: the tail of ResNet's
  // blocks, one pass forward and one reduction + one pass backward on the GPU. With a statistics reducer the
  // normalisation is the global one, then the add and the ReLU as separate ops.
  Tensor forward_add_relu(const Tensor& input, const Tensor& residual);
  void reset_running_stats();
  void reset_parameters();
  // Null (the default) turns the global statistics off again.
  void set_stats_reducer(std::shared_ptr<BatchNormStatsReducer> reducer) { stats_reducer_ = std::move(reducer); }
  const std::shared_ptr<BatchNormStatsReducer>& stats_reducer() const { return stats_reducer_; }

  int64_t num_features;
  BatchNormOptions options;
  Tensor weight, bias;                                    // (num_features); undefined without affine
  Tensor running_mean, running_var, num_batches_tracked;  // undefined without track_running_stats

 protected:
  BatchNorm(const char* type_name, int64_t num_features, BatchNormOptions options);
  virtual void check_input(const Tensor& input) const = 0;

 private:
  // residual: undefined, or added before the ReLU (relu is then true).
  Tensor normalize(const Tensor& input, bool relu, const Tensor& residual = {});
  // Training with stats_reducer_: the global batch's statistics. `factor` is the running-statistics momentum.
  // track: update the running statistics (training, tracking them, not a checkpoint's recomputation).
  Tensor normalize_global(const Tensor& input, bool relu_after, double factor, bool track);

  std::shared_ptr<BatchNormStatsReducer> stats_reducer_;
};

// (N, C) or (N, C, L).
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {});

 protected:
  void check_input(const Tensor& input) const override;
};

// (N, C, H, W).
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {});

 protected:
  void check_input(const Tensor& input) const override;
};

// ---------------------------------------------------------------- activations and reshaping
class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& input) override { return relu(input); }
};

struct GELUOptions {
  bool tanh_approximation = false;  // PyTorch's approximate="tanh"
};

class GELU : public Module {
 public:
  explicit GELU(GELUOptions options = {}) : Module("GELU"), options(options) {}
  Tensor forward(const Tensor& input) override { return gelu(input, options.tanh_approximation); }

  GELUOptions options;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& input) override { return silu(input); }
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& input) override { return kiln::tanh(input); }
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& input) override { return sigmoid(input); }
};

// Softmax along `dim` (negative counts from the end).
class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : Module("Softmax"), dim(dim) {}
  Tensor forward(const Tensor& input) override { return softmax(input, dim); }

  int64_t dim;
};

struct FlattenOptions {
  int64_t start_dim = 1;  // keeps the batch dim, as PyTorch's nn.Flatten
  int64_t end_dim = -1;
};

// (N, C, H, W) -> (N, C*H*W) with the defaults.
class Flatten : public Module {
 public:
  explicit Flatten(FlattenOptions options = {}) : Module("Flatten"), options(options) {}
  Tensor forward(const Tensor& input) override;

  FlattenOptions options;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& input) override { return input; }
};

}  // namespace kiln::nn
