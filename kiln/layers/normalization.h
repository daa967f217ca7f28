// kiln/layers/normalization.h — the normalisation layers: nn::LayerNorm, nn::GroupNorm, nn::BatchNorm1d/2d.
//
//   auto ln = std::make_shared<nn::LayerNorm>(Shape{768});
//   auto gn = std::make_shared<nn::GroupNorm>(32, 256);
//   auto bn = std::make_shared<nn::BatchNorm2d>(64, nn::BatchNormOptions{.momentum = 0.01});
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "kiln/layers/module.h"  // nn::Module

namespace kiln::nn {

// Options of nn::LayerNorm, as torch.nn.LayerNorm's arguments.
struct LayerNormOptions {
  double eps = 1e-5;               // added to the variance, for numerical stability
  bool elementwise_affine = true;  // "weight" (ones) and "bias" (zeros) of normalized_shape
  bool bias = true;                // with elementwise_affine: whether there is a bias
};

// Normalises over the last dims, which must equal normalized_shape.
class LayerNorm : public Module {
 public:
  // kiln::Error if normalized_shape is empty.
  explicit LayerNorm(Shape normalized_shape, LayerNormOptions options = {});
  Tensor forward(const Tensor& input) override;

  Shape normalized_shape;    // the trailing dims normalised over
  LayerNormOptions options;  // as constructed
  // (normalized_shape), ones at construction; undefined without elementwise_affine.
  Tensor weight, bias;  // undefined without elementwise_affine
};

// Options of nn::GroupNorm, as torch.nn.GroupNorm's arguments.
struct GroupNormOptions {
  double eps = 1e-5;   // added to the variance, for numerical stability
  bool affine = true;  // "weight" (ones) and "bias" (zeros) of (num_channels)
};

// (N, C, *) with C = num_channels, normalised per sample over groups of C / num_groups channels.
class GroupNorm : public Module {
 public:
  // kiln::Error unless num_groups is positive and divides num_channels.
  GroupNorm(int64_t num_groups, int64_t num_channels, GroupNormOptions options = {});
  Tensor forward(const Tensor& input) override;

  // The number of groups the channels are split into.
  int64_t num_groups, num_channels;  // num_channels: C, the size of the input's dim 1
  GroupNormOptions options;          // as constructed
  // (num_channels), ones at construction; undefined without affine.
  Tensor weight, bias;  // (num_channels), zeros at construction; undefined without affine
};

// Options of nn::BatchNorm1d and nn::BatchNorm2d, as torch.nn.BatchNorm2d's arguments.
struct BatchNormOptions {
  double eps = 1e-5;  // added to the variance, for numerical stability
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
  // Running mean to zeros, running variance to ones, the batch count to 0 (nothing without track_running_stats),
  // as torch.nn.BatchNorm2d.reset_running_stats.
  void reset_running_stats();
  // reset_running_stats(), then weight to ones and bias to zeros (with affine).
  void reset_parameters();
  // Null (the default) turns the global statistics off again.
  void set_stats_reducer(std::shared_ptr<BatchNormStatsReducer> reducer) { stats_reducer_ = std::move(reducer); }
  // The reducer set by set_stats_reducer, or null.
  const std::shared_ptr<BatchNormStatsReducer>& stats_reducer() const { return stats_reducer_; }

  int64_t num_features;      // C, the size of the input's dim 1
  BatchNormOptions options;  // as constructed
  // (num_features), ones at construction; undefined without affine.
  Tensor weight, bias;         // (num_features); undefined without affine
  Tensor running_mean;         // (num_features), zeros at construction; undefined without track_running_stats
  Tensor running_var;          // (num_features), ones at construction; undefined without track_running_stats
  Tensor num_batches_tracked;  // Int64, 0-d: the batches seen in training; undefined without track_running_stats

 protected:
  // kiln::Error unless num_features is positive; type_name: "BatchNorm1d" or "BatchNorm2d".
  BatchNorm(const char* type_name, int64_t num_features, BatchNormOptions options);
  // kiln::Error unless the input has the dims the subclass expects.
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
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {});  // num_features: C

 protected:
  void check_input(const Tensor& input) const override;  // kiln::Error unless 2-D or 3-D
};

// (N, C, H, W).
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {});  // num_features: C

 protected:
  void check_input(const Tensor& input) const override;  // kiln::Error unless 4-D
};

}  // namespace kiln::nn
