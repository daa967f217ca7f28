// The DataLoader under a real 2-process job (mpirun -np 2): without being told, it shards by rank through a
// DistributedSampler; the shards of an epoch are disjoint, cover the dataset, and change with the epoch.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "kiln/kiln.h"
#include "support/test_support.h"

using namespace kiln;

namespace {

class Indices : public data::Dataset {
 public:
  int64_t size() const override { return 21; }  // odd: the sampler pads the last shard by repeating
  data::Example get(int64_t i, data::SampleRng&) const override {
    return {{"i", internal::scalar_tensor(static_cast<double>(i), {.dtype = DType::Int64})}};
  }
};

std::vector<int64_t> epoch_indices(data::DataLoader& loader, uint64_t epoch) {
  std::vector<int64_t> out;
  for (data::Batch& b : loader.epoch(epoch)) {
    for (int64_t v : b["i"].to_vector<int64_t>()) out.push_back(v);
  }
  return out;
}

TEST(MpiDataLoader, ShardsByRankWithoutBeingAsked) {
  if (dist::init().world_size != 2) GTEST_SKIP() << "run under mpirun -np 2";
  data::DataLoader loader(std::make_shared<Indices>(), {.batch_size = 4, .workers = 2, .shuffle = true, .seed = 5});
  std::vector<int64_t> first;
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    const std::vector<int64_t> mine = epoch_indices(loader, epoch);
    ASSERT_EQ(mine.size(), 11u);  // ceil(21 / 2)
    Tensor t = internal::from_vector(mine, {11});
    Tensor both = internal::empty({2, 11}, {.dtype = DType::Int64});
    dist::all_gather(both, t);
    const std::vector<int64_t> all = both.to_vector<int64_t>();
    std::set<int64_t> distinct(all.begin(), all.end());
    EXPECT_EQ(distinct.size(), 21u) << "the two shards cover the dataset (one index repeated as padding)";
    EXPECT_EQ(*distinct.begin(), 0);
    EXPECT_EQ(*distinct.rbegin(), 20);
    if (epoch == 0) first = mine;
    else EXPECT_NE(mine, first) << "the shuffle changes with the epoch";
  }
}

}  // namespace
