// Samplers, batch cutting and distributed_env.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kiln/data/dataloader.h"
#include "kiln/data/distributed_env.h"
#include "kiln/data/sampler.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using data::DistributedSampler;
using std::vector;

vector<int64_t> sorted(vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}
vector<int64_t> iota(int64_t n) {
  vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(DataSampler, SequentialAndBatchCutting) {
  data::SequentialSampler s(5);
  EXPECT_EQ(s.size(), 5);
  EXPECT_EQ(s.indices(3), (vector<int64_t>{0, 1, 2, 3, 4}));
  using VV = vector<vector<int64_t>>;
  EXPECT_EQ(data::batch_indices(s.indices(0), 2, false), (VV{{0, 1}, {2, 3}, {4}}));
  EXPECT_EQ(data::batch_indices(s.indices(0), 2, true), (VV{{0, 1}, {2, 3}}));
  EXPECT_EQ(data::batch_indices(s.indices(0), 5, true), (VV{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(data::batch_indices(s.indices(0), 6, true), VV{});
  EXPECT_EQ(data::num_batches(5, 2, false), 3);
  EXPECT_EQ(data::num_batches(5, 2, true), 2);
  EXPECT_EQ(data::num_batches(4, 2, false), 2);
  expect_error([] { data::batch_indices({1}, 0, false); }, {"batch_size must be >= 1", "0"});
}

TEST(DataSampler, RandomIsAPermutationPerEpochAndRepeatable) {
  data::RandomSampler s(100, {.seed = 3});
  const auto e0 = s.indices(0), e1 = s.indices(1);
  EXPECT_EQ(sorted(e0), iota(100));
  EXPECT_EQ(sorted(e1), iota(100));
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, iota(100));
  EXPECT_EQ(e0, s.indices(0));
  EXPECT_EQ(e0, data::RandomSampler(100, {.seed = 3}).indices(0));
  EXPECT_NE(e0, data::RandomSampler(100, {.seed = 4}).indices(0));
  // num_samples beyond n without replacement: a whole permutation, then the start of another.
  data::RandomSampler more(10, {.num_samples = 25, .seed = 1});
  const auto m = more.indices(0);
  ASSERT_EQ(m.size(), 25u);
  EXPECT_EQ(sorted(vector<int64_t>(m.begin(), m.begin() + 10)), iota(10));
  EXPECT_EQ(sorted(vector<int64_t>(m.begin() + 10, m.begin() + 20)), iota(10));
  EXPECT_EQ(std::set<int64_t>(m.begin() + 20, m.end()).size(), 5u);
  expect_error([] { data::RandomSampler(0, {.num_samples = 3}); }, {"cannot draw 3", "empty"});
}

TEST(DataSampler, RandomWithReplacementIsUniform) {
  data::RandomSampler s(4, {.replacement = true, .num_samples = 8000, .seed = 5});
  const auto v = s.indices(2);
  ASSERT_EQ(v.size(), 8000u);
  std::map<int64_t, int> counts;
  for (int64_t i : v) ++counts[i];
  ASSERT_EQ(counts.size(), 4u);  // only 0..3
  // Binomial(8000, 1/4): sd ~ 39; 6 sd.
  for (auto [k, c] : counts) EXPECT_NEAR(c, 2000, 240) << "index " << k;
  EXPECT_NE(v, s.indices(3));
  EXPECT_EQ(v, s.indices(2));
}

TEST(DataSampler, WeightedFrequenciesFollowWeights) {
  const vector<double> w = {1, 0, 3, 6};  // probabilities .1, 0, .3, .6
  data::WeightedRandomSampler s(w, 20000, {.seed = 11});
  std::map<int64_t, int> counts;
  for (int64_t i : s.indices(0)) ++counts[i];
  EXPECT_EQ(counts.count(1), 0u);  // zero weight: never drawn
  // Binomial sd at most sqrt(20000 * .25) ~ 71; 6 sd = 430.
  EXPECT_NEAR(counts[0], 2000, 430);
  EXPECT_NEAR(counts[2], 6000, 430);
  EXPECT_NEAR(counts[3], 12000, 430);
  EXPECT_EQ(s.indices(0), s.indices(0));
  EXPECT_NE(s.indices(0), s.indices(1));
}

TEST(DataSampler, WeightedWithoutReplacement) {
  // Every non-zero index exactly once.
  data::WeightedRandomSampler all({1, 0, 2, 5}, 3, {.replacement = false, .seed = 1});
  EXPECT_EQ(sorted(all.indices(0)), (vector<int64_t>{0, 2, 3}));
  // The first draw follows the weights: index 3 first with probability 5/8.
  data::WeightedRandomSampler one({1, 0, 2, 5}, 1, {.replacement = false});
  int first3 = 0;
  for (uint64_t e = 0; e < 4000; ++e) first3 += one.indices(e)[0] == 3;
  EXPECT_NEAR(first3, 2500, 200);  // sd ~ 31
  // The second of two draws, given the first: P(second = 0 | first = 3) = 1/3.
  data::WeightedRandomSampler two({1, 0, 2, 5}, 2, {.replacement = false});
  int after3 = 0, second0 = 0;
  for (uint64_t e = 0; e < 6000; ++e) {
    const auto v = two.indices(e);
    EXPECT_NE(v[0], v[1]);
    if (v[0] == 3) ++after3, second0 += v[1] == 0;
  }
  EXPECT_NEAR(double(second0) / after3, 1.0 / 3, 0.05);
}

TEST(DataSampler, WeightedValidatesWeights) {
  expect_error([] { data::WeightedRandomSampler({1, -1}, 2); }, {"weight 1", "-1", "non-negative"});
  expect_error([] { data::WeightedRandomSampler({1, std::nan("")}, 2); }, {"weight 1", "finite"});
  expect_error([] { data::WeightedRandomSampler({1, kInf}, 2); }, {"weight 1", "finite"});
  expect_error([] { data::WeightedRandomSampler({0, 0}, 2); }, {"sum to 0", "positive"});
  expect_error([] { data::WeightedRandomSampler({}, 2); }, {"no weights"});
  expect_error(
      [] {
        data::WeightedRandomSampler({1, 0, 1}, 3, {.replacement = false});
      },
      {"cannot draw 3", "only 2", "non-zero"});
}

// torch.utils.data.DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False), by hand:
// num_samples = ceil(10 / 4) = 3, total 12, the list padded with its first 2 elements: 0..9, 0, 1;
// rank r takes positions r, r + 4, r + 8.
TEST(DataSampler, DistributedMatchesTorchByHand) {
  const vector<vector<int64_t>> padded = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  // drop_last: num_samples = ceil((10 - 4) / 4) = 2, total 8: 0..7.
  const vector<vector<int64_t>> dropped = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  for (int r = 0; r < 4; ++r) {
    DistributedSampler p(10, {.num_replicas = 4, .rank = r, .shuffle = false});
    EXPECT_EQ(p.size(), 3);
    EXPECT_EQ(p.indices(0), padded[r]) << "rank " << r;
    DistributedSampler d(10, {.num_replicas = 4, .rank = r, .shuffle = false, .drop_last = true});
    EXPECT_EQ(d.size(), 2);
    EXPECT_EQ(d.indices(5), dropped[r]) << "rank " << r;
  }
  // Padding longer than the list (n = 2, 5 replicas): (indices * 2)[:3] -> 0, 1, 0, 1, 0.
  const vector<int64_t> expect5 = {0, 1, 0, 1, 0};
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(DistributedSampler(2, {.num_replicas = 5, .rank = r, .shuffle = false}).indices(0),
              vector<int64_t>{expect5[r]});
  }
  // drop_last with fewer samples than replicas leaves nothing (torch: ceil((2 - 5) / 5) = 0).
  EXPECT_EQ(DistributedSampler(2, {.num_replicas = 5, .rank = 0, .drop_last = true}).size(), 0);
}

TEST(DataSampler, DistributedShardsAreDisjointAndCover) {
  for (int64_t n : {1, 10, 17, 64}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (bool drop : {false, true}) {
        for (uint64_t epoch : {0, 1}) {
          // The shared shuffled order, as every rank computes it.
          const vector<int64_t> perm = data::random_permutation(n, 9, epoch);
          std::map<int64_t, int> seen;
          vector<vector<int64_t>> shards;
          for (int r = 0; r < world; ++r) {
            DistributedSampler s(n, {.num_replicas = world, .rank = r, .seed = 9, .drop_last = drop});
            shards.push_back(s.indices(epoch));
            ASSERT_EQ(int64_t(shards.back().size()), s.size());
            ASSERT_EQ(s.size(), drop ? n / world : (n + world - 1) / world);
            for (int64_t i : shards.back()) ++seen[i];
          }
          // Interleaving the shards gives the (padded or cut) shuffled list.
          for (size_t k = 0; k < shards[0].size(); ++k) {
            for (int r = 0; r < world; ++r) {
              const size_t pos = k * world + r;
              EXPECT_EQ(shards[r][k], perm[pos % n]) << n << " " << world << " " << drop;
            }
          }
          if (drop) {  // disjoint; the tail of the shuffled list is left out
            for (auto [i, c] : seen) EXPECT_EQ(c, 1);
            EXPECT_EQ(int64_t(seen.size()), n / world * world);
          } else {  // every index; only the padding repeats
            EXPECT_EQ(int64_t(seen.size()), n);
            int64_t total = 0;
            for (auto [i, c] : seen) total += c;
            EXPECT_EQ(total, (n + world - 1) / world * world);
          }
        }
      }
    }
  }
  // Epochs reshuffle; the same epoch repeats.
  DistributedSampler s(100, {.num_replicas = 2, .rank = 1, .seed = 1});
  EXPECT_NE(s.indices(0), s.indices(1));
  EXPECT_EQ(s.indices(1), s.indices(1));
  expect_error([] { DistributedSampler(10, {.num_replicas = 2, .rank = 2}); }, {"rank 2", "2 replicas"});
  expect_error([] { DistributedSampler(10, {.num_replicas = 0, .rank = 0}); }, {"num_replicas must be >= 1"});
}

// Sets environment variables for the scope and restores every launcher variable afterwards.
class EnvScope {
 public:
  EnvScope() {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(name);
    }
  }
  ~EnvScope() {
    for (const auto& [name, v] : saved_) {
      if (v) {
        setenv(name.c_str(), v->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }
  void set(const char* name, const char* value) { setenv(name, value, 1); }

  static constexpr const char* kNames[] = {"OMPI_COMM_WORLD_RANK",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "PMI_RANK",
                                           "PMI_SIZE",
                                           "MPI_LOCALRANKID",
                                           "SLURM_PROCID",
                                           "SLURM_NTASKS",
                                           "SLURM_LOCALID",
                                           "RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_RANK"};

 private:
  vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

void expect_env(int rank, int size, int local) {
  const data::DistributedEnv env = data::distributed_env();
  EXPECT_EQ(env.rank, rank);
  EXPECT_EQ(env.world_size, size);
  EXPECT_EQ(env.local_rank, local);
}

TEST(DataDistributedEnv, EachLauncherFamily) {
  {
    EnvScope env;
    expect_env(0, 1, 0);
  }
  {
    EnvScope env;
    env.set("OMPI_COMM_WORLD_RANK", "5");
    env.set("OMPI_COMM_WORLD_SIZE", "8");
    env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
    env.set("SLURM_PROCID", "0");  // inherited from the allocation: Open MPI's own variables win
    env.set("SLURM_NTASKS", "1");
    expect_env(5, 8, 1);
  }
  {
    EnvScope env;
    env.set("PMI_RANK", "2");
    env.set("PMI_SIZE", "3");
    env.set("MPI_LOCALRANKID", "0");
    expect_env(2, 3, 0);
  }
  {
    EnvScope env;
    env.set("SLURM_PROCID", "6");
    env.set("SLURM_NTASKS", "16");
    env.set("SLURM_LOCALID", "2");
    expect_env(6, 16, 2);
  }
  {
    EnvScope env;
    env.set("RANK", "3");
    env.set("WORLD_SIZE", "4");
    env.set("LOCAL_RANK", "3");
    expect_env(3, 4, 3);
    unsetenv("LOCAL_RANK");
    expect_env(3, 4, 3);  // missing local rank: the rank
  }
  {
    // The loader picks a DistributedSampler by itself under a launcher.
    EnvScope env;
    env.set("RANK", "1");
    env.set("WORLD_SIZE", "2");
    DistributedSampler s(10, {.shuffle = false});
    EXPECT_EQ(s.num_replicas(), 2);
    EXPECT_EQ(s.rank(), 1);
    EXPECT_EQ(s.indices(0), (vector<int64_t>{1, 3, 5, 7, 9}));
  }
}

TEST(DataDistributedEnv, MalformedValuesAreClearErrors) {
  EnvScope env;
  env.set("RANK", "4");
  env.set("WORLD_SIZE", "4");
  expect_error([] { data::distributed_env(); }, {"RANK=4", "WORLD_SIZE=4", "not below"});
  env.set("RANK", "one");
  expect_error([] { data::distributed_env(); }, {"RANK='one'", "not a non-negative integer"});
  env.set("RANK", "-1");
  expect_error([] { data::distributed_env(); }, {"RANK='-1'"});
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "0");
  expect_error([] { data::distributed_env(); }, {"WORLD_SIZE=0", "at least 1"});
  unsetenv("WORLD_SIZE");
  expect_error([] { data::distributed_env(); }, {"RANK is set but WORLD_SIZE is not"});
  unsetenv("RANK");
  env.set("SLURM_NTASKS", "2");
  env.set("SLURM_PROCID", "1x");
  expect_error([] { data::distributed_env(); }, {"SLURM_PROCID='1x'"});
  env.set("SLURM_PROCID", "1");
  env.set("SLURM_LOCALID", "9");
  expect_error([] { data::distributed_env(); }, {"SLURM_LOCALID=9", "not below"});
}

class Indices : public data::Dataset {
 public:
  int64_t size() const override { return 10; }
  data::Example get(int64_t i, data::SampleRng&) const override { return {{"i", internal::scalar_tensor(i)}}; }
};

TEST(DataDistributedEnv, LoaderShardsByItselfUnderALauncher) {
  EnvScope env;
  env.set("OMPI_COMM_WORLD_RANK", "1");
  env.set("OMPI_COMM_WORLD_SIZE", "3");
  auto ds = std::make_shared<Indices>();
  data::DataLoader loader(ds, {.batch_size = 2, .workers = 1});
  EXPECT_NE(dynamic_cast<const DistributedSampler*>(&loader.sampler()), nullptr);
  EXPECT_EQ(loader.size(), 2);  // ceil(10 / 3) = 4 samples on this rank
  vector<int64_t> seen;
  for (data::Batch& b : loader.epoch(0)) {
    for (int64_t i : b["i"].to_vector<int64_t>()) seen.push_back(i);
  }
  EXPECT_EQ(seen, (vector<int64_t>{1, 4, 7, 0}));  // rank 1 of 3 over 0..9 padded with 0, 1
  // Shuffled: the same shard as DistributedSampler's with the loader's seed.
  data::DataLoader shuffled(ds, {.batch_size = 4, .shuffle = true, .seed = 8});
  const auto expect = DistributedSampler(10, {.num_replicas = 3, .rank = 1, .seed = 8}).indices(2);
  for (data::Batch& b : shuffled.epoch(2)) EXPECT_EQ(b.indices, expect);
  // Turned off: every sample.
  data::DataLoader whole(ds, {.batch_size = 2, .auto_distributed = false});
  EXPECT_EQ(whole.size(), 5);
}

}  // namespace
}  // namespace kiln::testing
