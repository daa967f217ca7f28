// kiln/distributed/sync_batch_norm.h — SyncBatchNorm: batch norm with the statistics of the global batch.
//
//   auto env = dist::init();
//   auto model = models::resnet50({.num_classes = 1000});
//   int64_t n = dist::convert_sync_batchnorm(*model);   // every BatchNorm layer: 53 for ResNet-50
//   model->to(env.device());
//   dist::DataParallel ddp(model);
//   Tensor loss = nn::cross_entropy(ddp(x), y);           // each BatchNorm normalises over all ranks' samples
//
// With small per-GPU batches (detection, segmentation, large models) each rank's batch statistics are noisy;
// SyncBatchNorm computes them over the whole global batch instead, with the right gradients. In training,
// each BatchNorm then runs two all-reduces in forward (per-channel sum and count; sum of squared deviations)
// and two in backward, of C + 1 and C values: small messages, but latency-bound, and the composed ops are
// slower than the fused single-GPU kernel. Eval mode is unchanged (running statistics, no communication).
// The running statistics come from the global batch, so they stay equal on every rank.
//
// Every rank must run the same layers in the same order, forward and backward (each is a collective). Convert
// before DataParallel so that both see the same model; converting changes no parameter or buffer.
#pragma once

#include <cstdint>

#include "kiln/distributed/process_group.h"  // ProcessGroup
#include "kiln/layers/module.h"              // nn::Module

namespace kiln::dist {

// Sets a statistics reducer (nn::BatchNormStatsReducer, layers.h) on every nn::BatchNorm of `model` (the
// model itself and every descendant: BatchNorm1d and BatchNorm2d), summing over `group`; null: the world
// group of the input's device, dist::group(x.device()), looked up at each forward (so the model may be
// moved between devices after converting). Returns the number of layers converted. Converting twice
// replaces the reducers; nn::BatchNorm::set_stats_reducer(nullptr) undoes it for one layer.
//
// With world size 1 the results equal plain batch norm up to float rounding (but on the GPU the fused
// kernel is not used); convert only when env.distributed() to keep single-process runs at full speed.
int64_t convert_sync_batchnorm(nn::Module& model, ProcessGroup* group = nullptr);

}  // namespace kiln::dist
