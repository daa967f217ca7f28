// kiln/data/sampler.h — which dataset indices an epoch visits, in which order: a pure function of
// (seed, epoch), so a run restarts at the same order and every worker count sees the same batches.
//
//   data::RandomSampler s(50000, {.seed = 7});
//   std::vector<int64_t> order = s.indices(/*epoch=*/3);            // a permutation of 0..49999
//   data::DistributedSampler shard(50000, {.num_replicas = 4, .rank = 1});   // 12500 indices per rank
//   auto batches = data::batch_indices(order, /*batch_size=*/256, /*drop_last=*/true);
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::data {

// The order in which a DataLoader visits a dataset's indices, epoch by epoch, as torch.utils.data.Sampler.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual int64_t size() const = 0;  // how many indices indices() returns
  // The indices of `epoch` (a pure function of the sampler's options and the epoch); called once per epoch,
  // or twice where the loader's look-ahead into the epoch is dropped (DataLoaderOptions::prefetch_next_epoch).
  virtual std::vector<int64_t> indices(uint64_t epoch) const = 0;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);  // kiln::Error if n < 0
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(uint64_t epoch) const override;

 private:
  int64_t n_;
};

// Options of RandomSampler.
struct RandomSamplerOptions {
  bool replacement = false;  // true: num_samples independent uniform draws (an index may repeat)
  int64_t num_samples = -1;  // -1: n. Without replacement and > n: whole permutations, then part of one
  uint64_t seed = 0;         // with the epoch, decides the order
};

// A new permutation of 0..n-1 each epoch (or num_samples uniform draws with replacement), as
// torch.utils.data.RandomSampler (the numbers differ: kiln has its own generator).
class RandomSampler : public Sampler {
 public:
  // kiln::Error if n < 0, num_samples < -1, or samples are asked of an empty dataset.
  explicit RandomSampler(int64_t n, RandomSamplerOptions options = {});
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices(uint64_t epoch) const override;

 private:
  int64_t n_;
  int64_t num_samples_;
  RandomSamplerOptions options_;
};

// Options of WeightedRandomSampler.
struct WeightedRandomSamplerOptions {
  bool replacement = true;  // false: an index comes at most once per epoch
  uint64_t seed = 0;        // with the epoch, decides the draws
};

// num_samples indices drawn with probability weights[i] / sum(weights), as torch's WeightedRandomSampler.
// Without replacement an index comes at most once (successive draws among the rest, like
// torch.multinomial), so num_samples may not exceed the number of non-zero weights.
class WeightedRandomSampler : public Sampler {
 public:
  // kiln::Error for no weights, a negative or non-finite weight, a zero sum, num_samples < 0, or (without
  // replacement) more samples than non-zero weights.
  WeightedRandomSampler(std::vector<double> weights, int64_t num_samples, WeightedRandomSamplerOptions options = {});
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices(uint64_t epoch) const override;

 private:
  std::vector<double> weights_;
  std::vector<double> cumulative_;  // running sums of weights_, for draws with replacement
  int64_t num_samples_;
  WeightedRandomSamplerOptions options_;
};

// Options of DistributedSampler, as torch.utils.data.DistributedSampler's arguments.
struct DistributedSamplerOptions {
  int num_replicas = -1;   // -1: world_size of distributed_env()
  int rank = -1;           // -1: rank of distributed_env()
  bool shuffle = true;     // a new permutation each epoch; false: 0..n-1 in order
  uint64_t seed = 0;       // must be the same on every rank
  bool drop_last = false;  // drop the tail that does not divide evenly, rather than pad by repeating the start
};

// This rank's share of 0..n-1, as torch.utils.data.DistributedSampler: the (shuffled) list is padded by
// repeating its start up to a multiple of num_replicas (or, with drop_last, its tail is dropped), and rank r
// takes elements r, r + num_replicas, ... Every rank gets size() indices, so all step together. The epoch
// passed to indices() plays the role of set_epoch().
class DistributedSampler : public Sampler {
 public:
  // kiln::Error if n < 0, num_replicas < 1 or rank >= num_replicas.
  explicit DistributedSampler(int64_t n, DistributedSamplerOptions options = {});
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices(uint64_t epoch) const override;
  // The number of ranks the indices are shared among (resolved from distributed_env() when -1).
  int num_replicas() const { return options_.num_replicas; }
  // This rank (resolved from distributed_env() when -1).
  int rank() const { return options_.rank; }

 private:
  int64_t n_;
  int64_t num_samples_;
  DistributedSamplerOptions options_;
};

// The indices cut into consecutive batches of batch_size; the last one is shorter, or dropped with drop_last.
std::vector<std::vector<int64_t>> batch_indices(const std::vector<int64_t>& indices, int64_t batch_size,
                                                bool drop_last);
// How many batches batch_indices() makes of n indices.
int64_t num_batches(int64_t n, int64_t batch_size, bool drop_last);

// A uniformly random permutation of 0..n-1, a pure function of (seed, epoch, stream).
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, uint64_t epoch, uint64_t stream = 0);

}  // namespace kiln::data
