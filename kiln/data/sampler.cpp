// kiln/data/sampler.cpp — the samplers, and cutting an epoch's indices into batches.
#include "kiln/data/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "kiln/data/distributed_env.h"
#include "kiln/data/sample_rng.h"
#include "kiln/tensor/error.h"

namespace kiln::data {

namespace {

// The random stream of a sampler's epoch: SampleRng's index -1 is no sample's, so the order is
// independent of the numbers the samples draw.
SampleRng epoch_rng(uint64_t seed, uint64_t epoch, uint64_t stream) { return SampleRng(seed, epoch, -1).fork(stream); }

}  // namespace

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, uint64_t epoch, uint64_t stream) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  SampleRng rng = epoch_rng(seed, epoch, stream);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.randint(i + 1)]);  // Fisher-Yates
  return p;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  KILN_CHECK(n >= 0, "SequentialSampler: the number of samples must be >= 0, got ", n);
}

std::vector<int64_t> SequentialSampler::indices(uint64_t) const {
  std::vector<int64_t> p(static_cast<size_t>(n_));
  std::iota(p.begin(), p.end(), int64_t{0});
  return p;
}

RandomSampler::RandomSampler(int64_t n, RandomSamplerOptions options)
    : n_(n), num_samples_(options.num_samples < 0 ? n : options.num_samples), options_(options) {
  KILN_CHECK(n >= 0, "RandomSampler: the number of samples must be >= 0, got ", n);
  KILN_CHECK(options.num_samples >= -1, "RandomSampler: num_samples must be >= 0 (or -1 for all ", n, "), got ",
             options.num_samples);
  KILN_CHECK(n > 0 || num_samples_ == 0, "RandomSampler: cannot draw ", num_samples_, " samples from an empty dataset");
}

std::vector<int64_t> RandomSampler::indices(uint64_t epoch) const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  if (options_.replacement) {
    SampleRng rng = epoch_rng(options_.seed, epoch, 0);
    for (int64_t i = 0; i < num_samples_; ++i) out.push_back(rng.randint(n_));
    return out;
  }
  // As torch: whole permutations while num_samples allows, then the start of one more.
  for (uint64_t round = 0; static_cast<int64_t>(out.size()) < num_samples_; ++round) {
    const std::vector<int64_t> p = random_permutation(n_, options_.seed, epoch, round);
    const size_t take = std::min(p.size(), static_cast<size_t>(num_samples_) - out.size());
    out.insert(out.end(), p.begin(), p.begin() + static_cast<std::ptrdiff_t>(take));
  }
  return out;
}

WeightedRandomSampler::WeightedRandomSampler(std::vector<double> weights, int64_t num_samples,
                                             WeightedRandomSamplerOptions options)
    : weights_(std::move(weights)), num_samples_(num_samples), options_(options) {
  KILN_CHECK(!weights_.empty(), "WeightedRandomSampler: no weights");
  KILN_CHECK(num_samples >= 0, "WeightedRandomSampler: num_samples must be >= 0, got ", num_samples);
  double total = 0;
  int64_t nonzero = 0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    KILN_CHECK(std::isfinite(weights_[i]) && weights_[i] >= 0, "WeightedRandomSampler: weight ", i, " is ", weights_[i],
               "; weights must be finite and non-negative");
    total += weights_[i];
    nonzero += weights_[i] > 0;
    cumulative_.push_back(total);
  }
  KILN_CHECK(total > 0 && std::isfinite(total), "WeightedRandomSampler: the ", weights_.size(), " weights sum to ",
             total, "; at least one must be positive (and their sum finite)");
  KILN_CHECK(options.replacement || num_samples <= nonzero, "WeightedRandomSampler: cannot draw ", num_samples,
             " samples without replacement: only ", nonzero, " of the ", weights_.size(),
             " weights are non-zero (use replacement = true, or fewer samples)");
}

std::vector<int64_t> WeightedRandomSampler::indices(uint64_t epoch) const {
  SampleRng rng = epoch_rng(options_.seed, epoch, 0);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  if (options_.replacement) {
    const double total = cumulative_.back();
    for (int64_t i = 0; i < num_samples_; ++i) {
      const double x = rng.uniform() * total;
      auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), x);
      size_t k = it == cumulative_.end() ? cumulative_.size() - 1 : static_cast<size_t>(it - cumulative_.begin());
      while (weights_[k] == 0) --k;  // rounding at the very top: the last positive weight
      out.push_back(static_cast<int64_t>(k));
    }
    return out;
  }
  // Efraimidis-Spirakis: the k largest keys log(u) / w are a sample of k successive weighted draws without
  // replacement, and sorting by key gives the order of those draws.
  std::vector<std::pair<double, int64_t>> keys;
  for (size_t i = 0; i < weights_.size(); ++i) {
    const double u = 1.0 - rng.uniform();  // (0, 1]
    if (weights_[i] > 0) keys.emplace_back(std::log(u) / weights_[i], static_cast<int64_t>(i));
  }
  std::partial_sort(keys.begin(), keys.begin() + num_samples_, keys.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  for (int64_t i = 0; i < num_samples_; ++i) out.push_back(keys[static_cast<size_t>(i)].second);
  return out;
}

DistributedSampler::DistributedSampler(int64_t n, DistributedSamplerOptions options) : n_(n), options_(options) {
  KILN_CHECK(n >= 0, "DistributedSampler: the number of samples must be >= 0, got ", n);
  if (options_.num_replicas < 0 || options_.rank < 0) {
    const DistributedEnv env = distributed_env();
    if (options_.num_replicas < 0) options_.num_replicas = env.world_size;
    if (options_.rank < 0) options_.rank = env.rank;
  }
  KILN_CHECK(options_.num_replicas >= 1, "DistributedSampler: num_replicas must be >= 1, got ", options_.num_replicas);
  KILN_CHECK(options_.rank < options_.num_replicas, "DistributedSampler: rank ", options_.rank, " is out of range for ",
             options_.num_replicas, " replicas (ranks 0..", options_.num_replicas - 1, ")");
  const int64_t r = options_.num_replicas;
  // As torch: with drop_last, floor(n / r) each (the tail is dropped); else ceil(n / r) (the list is padded).
  // (drop_last with n < r leaves every rank nothing, as torch.)
  num_samples_ = options_.drop_last ? n / r : (n + r - 1) / r;
}

std::vector<int64_t> DistributedSampler::indices(uint64_t epoch) const {
  std::vector<int64_t> all;
  if (options_.shuffle) {
    all = random_permutation(n_, options_.seed, epoch);
  } else {
    all.resize(static_cast<size_t>(n_));
    std::iota(all.begin(), all.end(), int64_t{0});
  }
  const size_t total = static_cast<size_t>(num_samples_ * options_.num_replicas);
  // Padding repeats the list from its start, as often as needed (torch: (indices * k)[:padding]).
  for (size_t i = 0; all.size() < total; ++i) all.push_back(all[i]);
  all.resize(total);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(options_.rank); i < total; i += static_cast<size_t>(options_.num_replicas)) {
    out.push_back(all[i]);
  }
  return out;
}

std::vector<std::vector<int64_t>> batch_indices(const std::vector<int64_t>& indices, int64_t batch_size,
                                                bool drop_last) {
  KILN_CHECK(batch_size >= 1, "batch_indices: batch_size must be >= 1, got ", batch_size);
  std::vector<std::vector<int64_t>> out;
  const size_t bs = static_cast<size_t>(batch_size);
  for (size_t start = 0; start < indices.size(); start += bs) {
    const size_t end = std::min(indices.size(), start + bs);
    if (drop_last && end - start < bs) break;
    out.emplace_back(indices.begin() + static_cast<std::ptrdiff_t>(start),
                     indices.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return out;
}

int64_t num_batches(int64_t n, int64_t batch_size, bool drop_last) {
  KILN_CHECK(batch_size >= 1, "num_batches: batch_size must be >= 1, got ", batch_size);
  return drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
}

}  // namespace kiln::data
