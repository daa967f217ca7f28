// kiln/data/dataloader.h — batches of a dataset, loaded by worker threads ahead of the training loop.
//
//   data::DataLoader loader(train, {.batch_size = 256, .workers = 8, .shuffle = true,
//                                   .device = Device::cuda(local_rank), .prefetch_next_epoch = true});
//   for (int epoch = 0; epoch < 90; ++epoch) {
//     for (data::Batch& batch : loader.epoch(epoch)) {   // already on the GPU, in sampler order
//       auto [x, y] = batch;
//       ...
//     }
//     std::cout << "data-wait share " << loader.stats().wait_fraction << "\n";
//   }
//   auto range = loader.epoch(pos.epoch, pos.batch);      // resume mid-epoch: skips, without loading,
//   for (data::Batch& b : range) { ...; pos = range.position(); }   // the batches already trained on
//
// Each sample is loaded with SampleRng(seed, epoch, index), so the same (seed, epoch) gives the same batches
// for any number of workers. As in PyTorch, an epoch's workers stop at its end and nothing of the next epoch is
// loaded before it is asked for. A training loader can opt in to loading across epoch boundaries
// (.prefetch_next_epoch = true, like persistent workers): while epoch e's last batches are in use the workers
// already load the next epochs' first ones, and loader.epoch(e + 1) takes that pipeline over, so a new epoch starts
// without waiting for its first batch.
// Under a multi-process launcher (distributed_env().world_size > 1) the default sampler is a
// DistributedSampler: each rank loads its own shard.
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/example.h"
#include "kiln/data/sampler.h"
#include "kiln/tensor/device.h"

namespace kiln::data {

// More loading threads than this is a mistake (a worker count meant as something else), not a configuration.
inline constexpr int kMaxLoaderWorkers = 1024;

// How a DataLoader batches, shuffles, shards and prefetches: batch size, worker threads, pinned memory, the device
// batches go to.
struct DataLoaderOptions {
  int64_t batch_size = 1;         // samples per batch, >= 1
  int workers = 0;                // loading threads, at most kMaxLoaderWorkers; 0: loaded on the calling thread
  bool shuffle = false;           // the default sampler: RandomSampler (true) or SequentialSampler
  uint64_t seed = 0;              // of the shuffle and of every sample's SampleRng
  bool drop_last = false;         // drop the last batch when it is short
  bool pin_memory = false;        // collate into page-locked memory, for async copies (no-op without CUDA)
  int64_t prefetch_batches = -1;  // batches loaded ahead of the one in use (-1: 2 per worker)
  double timeout_s = 0;           // with workers: a batch not ready after this long throws (0: wait forever)
  std::shared_ptr<const Sampler> sampler{};  // null: the default above (not together with shuffle)
  bool auto_distributed = true;              // null sampler and world_size > 1: DistributedSampler(shuffle, seed)
  // A CUDA device: batches are collated into pinned memory and copied ahead on a copy stream of the
  // device (batch k+1's copy starts when batch k is handed out). The stream current on the consumer's
  // thread when a batch is handed out (at the loop's ++) waits for its copy on the GPU, not the host.
  // A CPU device, or none: batches stay in host memory.
  std::optional<Device> device{};
  // null: the dataset's collate_fn() (GPU image decoding), else data::collate's stacking, done sample by sample
  // (data::Collator: each sample is copied into the batch as soon as it is loaded, then let go). With a CUDA
  // device, workers run it with that device current.
  CollateFn collate{};
  // false (the default): each epoch's threads stop at its end, as in PyTorch without persistent workers, and
  // nothing of an epoch is loaded before loader.epoch() asks for it; right for an evaluation loader, asked for
  // the same epoch every time. true, for a training loader that goes through epochs 0, 1, 2, ... in order:
  // with workers, while epoch e's last batches are in use, the workers go on to load epoch e+1's first ones,
  // and those of e+2, ... where an epoch is shorter than the window (within the same prefetch window, so at most
  // prefetch_batches are loaded ahead in all; with a device, the next epoch's first batch may already be copied).
  // A range that runs to its end keeps its threads and those batches in the loader, and loader.epoch(e + 1)
  // (from batch 0) takes them over. Any other call (another epoch, a start batch > 0, after a range left early)
  // drops them and starts afresh; so does destroying the loader. The batches, their order and samples, and their
  // errors (thrown when the batch is handed out) are the same either way. Up to prefetch_batches of epochs never
  // asked for are loaded for nothing when it is on and the next epoch is not the one asked for (an evaluation
  // loader's epoch 0 again).
  bool prefetch_next_epoch = false;
};

// Where a run stands in the data: the next batch to train on. Save it in checkpoints; resume with
// loader.epoch(pos.epoch, pos.batch).
struct LoaderPosition {
  uint64_t epoch = 0;  // the epoch, as loader.epoch(e) numbers it
  int64_t batch = 0;   // the next batch's index within the epoch
  // Equal when both the epoch and the batch are.
  friend bool operator==(const LoaderPosition&, const LoaderPosition&) = default;
};

// How long the training loop waited for data in the current (latest) epoch, and where the workers' time went
// since it began (when the loop waits, the worker times say whether loading the samples or collating them is
// slow: divide by batches_loaded for a batch's time on one worker).
struct LoaderStats {
  double last_wait_s = 0;      // the training thread's time in the loader for the batch handed out last
                               // (waiting for the workers; with a device, also the loader's CUDA calls)
  double total_wait_s = 0;     // summed over the epoch's batches so far
  int64_t batches = 0;         // handed out so far in this epoch
  double elapsed_s = 0;        // wall time since the epoch began
  double wait_fraction = 0;    // total_wait_s / elapsed_s: the data-wait share
  int64_t batches_loaded = 0;  // batches the workers finished since the epoch began (of any epoch)
  double samples_s = 0;        // their time in Dataset::get, summed over those batches and the threads
  double collate_s = 0;        // their time collating (the collate function, or the default collate), likewise
};

// Batches of a Dataset made by worker threads ahead of the step, optionally pinned and copied to the GPU
// asynchronously; loader.epoch(e) iterates one epoch.
class DataLoader {
 public:
  // kiln::Error for a null or empty dataset, an option out of range, a sampler together with shuffle, or a CUDA
  // device that is not available. No thread starts before epoch().
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();
  // Takes over the other loader's state; the moved-from loader is left empty.
  DataLoader(DataLoader&&) noexcept;
  // Drops this loader's look-ahead (joining its threads), then takes over the other's.
  DataLoader& operator=(DataLoader&&) noexcept;

  struct Core;  // what the loader and its epochs share (dataset, sampler, options, copy stream, stats)

  // One pass over the data, for a range-for. Its worker threads start now (or are taken over from the
  // previous epoch's range, see prefetch_next_epoch) and are joined when it is destroyed (also when the loop
  // breaks early or throws), unless it ran to its end with prefetch_next_epoch: then they go on loading the
  // next epoch for the loader, until loader.epoch(e + 1) takes them over, another epoch() call drops them, or
  // the loader is destroyed.
  // A failed batch throws from the loop; the loader can then start another epoch.
  class Epoch {
   public:
    // An input iterator over the epoch's batches: *it is the batch handed out last, replaced by the next ++.
    class iterator {
     public:
      using value_type = Batch;                // what the iterator yields
      using difference_type = std::ptrdiff_t;  // as input iterators require
      // The batch handed out last.
      Batch& operator*() const;
      // The batch handed out last, for it->field.
      Batch* operator->() const { return &**this; }
      // Hands out the next batch, waiting for it; a batch that failed to load throws here.
      iterator& operator++();
      // ++it, returning nothing.
      void operator++(int) { ++*this; }
      // Whether the epoch's batches are all handed out.
      friend bool operator==(const iterator& it, std::default_sentinel_t) { return it.done(); }

     private:
      friend class Epoch;
      explicit iterator(Epoch* epoch) : epoch_(epoch) {}
      bool done() const;
      Epoch* epoch_ = nullptr;
    };

    Epoch(Epoch&&) noexcept;             // the moved-from range cannot be iterated
    Epoch& operator=(Epoch&&) noexcept;  // the moved-from range cannot be iterated
    ~Epoch();

    iterator begin();  // hands out the first batch (once per Epoch)
    // The end of the range: compared with the iterator, true once every batch is handed out.
    std::default_sentinel_t end() const { return {}; }
    int64_t size() const;             // batches this range hands out (from its start batch to the end)
    LoaderPosition position() const;  // the next batch to be handed out
    LoaderStats stats() const;        // as the loader's stats(): of the latest epoch started

   private:
    friend class DataLoader;
    struct Impl;
    explicit Epoch(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
  };

  // The batches of `epoch`, starting at batch `start_batch` (0..size(); earlier ones are skipped unloaded).
  // Takes over the look-ahead of the previous epoch's range where it is (epoch, 0); drops it otherwise.
  Epoch epoch(uint64_t epoch, int64_t start_batch = 0);
  // epoch(position.epoch, position.batch): resumes where a checkpoint's LoaderPosition says.
  Epoch epoch(LoaderPosition position) { return epoch(position.epoch, position.batch); }

  int64_t size() const;                      // batches per epoch
  LoaderStats stats() const;                 // of the latest epoch started
  const Dataset& dataset() const;            // the dataset given at construction
  const Sampler& sampler() const;            // the one given, or the default chosen (see DataLoaderOptions)
  const DataLoaderOptions& options() const;  // as resolved (the sampler and prefetch filled in)

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace kiln::data
