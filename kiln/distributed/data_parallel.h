// kiln/distributed/data_parallel.h — data-parallel training: every rank holds the whole model, trains on
// its own part of each batch, and the gradients are averaged over the ranks during backward.
//
//   auto env = dist::init();
//   auto model = models::resnet50({.num_classes = 1000});
//   model->to(env.device());
//   dist::DataParallel ddp(model);                 // broadcasts rank 0's parameters and buffers
//   optim::SGD opt(model->parameters(), {.lr = 0.1});
//   for (auto& batch : loader.epoch(epoch)) {      // the loader shards by rank by itself
//     auto [x, y] = batch.to(env.device());
//     opt.zero_grad();
//     nn::cross_entropy(ddp(x), y).backward();     // gradients averaged over ranks when backward returns
//     opt.step();
//   }
//   { auto guard = ddp.no_sync(); loss.backward(); }  // gradient accumulation: this backward stays local
//
// Gradients are grouped into buckets of about bucket_mb megabytes, in the reverse order of the model's
// parameters (roughly the order backward produces them). A bucket's all-reduce (average) starts on the
// group's communication stream as soon as the last of its gradients is accumulated, in bucket order on
// every rank, overlapping with the rest of backward; when backward returns, the averaged gradients are in
// each parameter's grad() (on the GPU: queued on the current stream, no host wait). With world size 1 it
// is a plain wrapper. A parameter that got no gradient in a backward is an error naming it, unless
// find_unused_parameters (its gradient then counts as zero on this rank). With a GradScaler the
// inf/NaN decision is the same on every rank: gradients are averaged before it is taken.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/distributed/process_group.h"
#include "kiln/layers/module.h"

namespace kiln::dist {

// How DataParallel buckets and averages gradients, and over which process group.
struct DataParallelOptions {
  double bucket_mb = 25.0;              // bucket size cap, in MiB of gradients
  bool broadcast_buffers = true;        // also broadcast buffers (batch-norm statistics) at construction
  bool find_unused_parameters = false;  // parameters without a gradient in some backward are expected
  ProcessGroup* group = nullptr;        // nullptr: the world group of the model's device
};

// Data-parallel training of one model replica per process: broadcasts rank 0's parameters, then averages gradients
// over the ranks during backward, as torch DistributedDataParallel.
class DataParallel {
 public:
  // Wraps `module` (every parameter on one device) and broadcasts rank 0's parameters (and buffers, with
  // broadcast_buffers) to every rank. kiln::Error for a null module, one without parameters, or parameters on
  // several devices. With one process it is a plain wrapper.
  explicit DataParallel(nn::ModulePtr module, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // The module's forward. DataParallel does its work in the parameters' gradient hooks, not here: a model whose
  // forward takes other inputs (BERT's input ids, token types, attention mask) is called directly,
  // e.g. bert(ids, types, mask) through its nn::Handle, with the same effect.
  Tensor forward(const Tensor& input) { return (*module_)(input); }
  // forward(input).
  Tensor operator()(const Tensor& input) { return forward(input); }
  // The wrapped module (to save it, or call its own forward).
  nn::Module& module() { return *module_; }
  // The handle to the wrapped module.
  const nn::ModulePtr& module_ptr() const { return module_; }
  // The group gradients are averaged over: options.group, or the world group of the parameters' device.
  ProcessGroup& process_group() { return *group_; }

  // While the returned guard lives, backward accumulates gradients locally without communicating (the
  // next backward outside it averages the accumulated gradients).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DataParallel& ddp);  // turns ddp's gradient averaging off until destroyed
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DataParallel& ddp_;
    bool previous_;
  };
  // A guard that turns gradient averaging off while it lives, as torch DistributedDataParallel.no_sync.
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // The buckets as parameter indices into module().parameters() (for tests and tuning).
  std::vector<std::vector<size_t>> bucket_layout() const;

  // Internal state (defined in data_parallel.cpp).
  struct State;

 private:
  nn::ModulePtr module_;
  DataParallelOptions options_;
  ProcessGroup* group_ = nullptr;
  std::shared_ptr<State> state_;
};

}  // namespace kiln::dist
