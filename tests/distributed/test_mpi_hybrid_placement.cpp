// nn::HybridEmbedding replicated over 2 processes (mpirun -np 2) with dist::share_placement: each rank looks up its
// own ids, and a rebalance places rows by the sum of both ranks' counts, the same slot on both ranks, counting each
// lookup once however often the ranks agree; the ranks decide together when to rebalance by themselves and refuse
// a rebalance together; dist::all_gather_sparse_grads averages both tiers' gradients, so SGD keeps the replicas
// equal and trains them as a plain table. On the CPU (both tiers through the MPI group) and, where each rank has a
// GPU, with the hot tier on it (NCCL) and the cold tier in host memory (MPI).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "distributed/mpi_test_util.h"  // mpi_devices, the_other_ranks
#include "kiln/autograd/sparse_grad.h"  // sparse_grad: the hand-written SGD step
#include "kiln/kiln.h"
#include "support/test_support.h"  // expect_error, values

using namespace kiln;

namespace {

class MpiHybridPlacement : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (dist::world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2";
    manual_seed(11);  // the same tables on both ranks
  }
  Device dev() const { return GetParam(); }
  int rank() const { return dist::rank(); }
  // A table of `v` rows with `h` hot on dev(), whose ranks share the placement. On a GPU its cold rows are copied
  // (ColdReads::Copy), so that their gradients are on the host and go through MPI.
  std::shared_ptr<nn::HybridEmbedding> shared_table(int64_t v, int64_t h, int64_t count_batches = 0) const {
    auto emb = std::make_shared<nn::HybridEmbedding>(
        v, 2,
        nn::HybridEmbeddingOptions{
            .device = dev(), .hot_rows = h, .count_batches = count_batches, .cold_reads = nn::ColdReads::Copy});
    EXPECT_EQ(dist::share_placement(*emb), 1);
    return emb;
  }
  // This rank's ids: `mine0` on rank 0, `mine1` on rank 1.
  Tensor ids(const std::vector<int64_t>& mine0, const std::vector<int64_t>& mine1) const {
    const std::vector<int64_t>& v = rank() == 0 ? mine0 : mine1;
    return from_vector(v, {static_cast<int64_t>(v.size())}).to(dev());
  }
};

std::vector<double> slots_of(const nn::HybridEmbedding& emb) {
  std::vector<double> out;
  for (int64_t r = 0; r < emb.num_embeddings; ++r) out.push_back(static_cast<double>(emb.slot_of(r)));
  return out;
}

// Rank 0 looks up rows 5, 5, 6; rank 1 rows 6, 6, 7, 3. Counts wait for the agreement; the rebalance then sees
// 6: 3, 5: 2, 3: 1, 7: 1 on both ranks and makes 6 and 5 hot on both. Later lookups are added once, however many
// agreements follow.
TEST_P(MpiHybridPlacement, ARebalancePlacesRowsByTheSumOfTheRanksCounts) {
  auto emb = shared_table(8, 2);
  (void)(*emb)(ids({5, 5, 6}, {6, 6, 7, 3}));
  EXPECT_EQ(kiln::testing::values(emb->counts), std::vector<double>(8, 0.0)) << "counted before an agreement";
  const nn::RowSwaps swaps = emb->rebalance();
  EXPECT_EQ(swaps.size(), 2);
  EXPECT_EQ(kiln::testing::values(emb->counts), (std::vector<double>{0, 0, 0, 1, 0, 2, 3, 1}));
  EXPECT_GE(emb->slot_of(5), 0);
  EXPECT_GE(emb->slot_of(6), 0);
  EXPECT_EQ(kiln::testing::values(kiln::testing::the_other_ranks(emb->slot)), slots_of(*emb)) << "slots differ";
  EXPECT_EQ(kiln::testing::values(kiln::testing::the_other_ranks(emb->table())), kiln::testing::values(emb->table()));

  (void)(*emb)(ids({3}, {}));  // one more lookup, on rank 0 only (3 then ties with 5, and takes its place)
  emb->agree_counts();
  emb->agree_counts();  // nothing new: nothing added
  (void)emb->rebalance();
  EXPECT_EQ(kiln::testing::values(emb->counts), (std::vector<double>{0, 0, 0, 2, 0, 2, 3, 1}));
  EXPECT_EQ(kiln::testing::values(kiln::testing::the_other_ranks(emb->counts)), kiln::testing::values(emb->counts));
}

// count_batches = 2: after two counted calls, rank 0 still holds a gradient, so neither rank rebalances at the next
// call; once it is gone, both rebalance at the same call, from both ranks' counts. An evaluation on rank 0 alone
// neither rebalances nor waits for rank 1.
TEST_P(MpiHybridPlacement, TheAutomaticRebalanceHappensAtTheSameCallOnEveryRank) {
  auto emb = shared_table(8, 2, /*count_batches=*/2);
  int rebalances = 0;
  emb->on_rebalance = [&](const nn::RowSwaps&) { ++rebalances; };
  (void)(*emb)(ids({4, 4}, {7}));
  const Tensor out = (*emb)(ids({4}, {7, 7, 3}));
  if (rank() == 0) sum(out).backward();  // a pending gradient on rank 0 only
  if (rank() == 0) {
    emb->eval();
    (void)(*emb)(ids({1}, {}));  // rank 0 alone: no collective, no rebalance
    emb->train();
  }
  (void)(*emb)(ids({0}, {0}));
  EXPECT_EQ(rebalances, 0) << "a rank rebalanced while rank 0 held a gradient";
  emb->zero_grad();
  (void)(*emb)(ids({0}, {0}));
  EXPECT_EQ(rebalances, 1);
  EXPECT_GE(emb->slot_of(4), 0);
  EXPECT_GE(emb->slot_of(7), 0);
  // The two counted calls (4: 3, 7: 3, 3: 1), then the call at which the ranks deferred (0: 2): agreed by the
  // rebalance. The call that rebalanced is pending.
  EXPECT_EQ(kiln::testing::values(emb->counts), (std::vector<double>{2, 0, 0, 1, 3, 0, 0, 3}));
  EXPECT_EQ(kiln::testing::values(kiln::testing::the_other_ranks(emb->slot)), slots_of(*emb));
  emb->agree_counts();
  EXPECT_EQ(kiln::testing::values(emb->counts), (std::vector<double>{4, 0, 0, 1, 3, 0, 0, 3}));
}

// A gradient on rank 1 only: both ranks refuse the manual rebalance (neither waits for the other), rank 0 saying
// that the gradient is on another rank.
TEST_P(MpiHybridPlacement, ARebalanceWhileOneRankHoldsAGradientIsRefusedOnEveryRank) {
  auto emb = shared_table(6, 2);
  const Tensor out = (*emb)(ids({1}, {2}));
  if (rank() == 1) sum(out).backward();
  const std::string where = rank() == 0 ? " on another rank" : "still holds a gradient,";
  kiln::testing::expect_error([&] { (void)emb->rebalance(); },
                              {"HybridEmbedding::rebalance", "still holds a gradient", where, "on every rank"});
  emb->zero_grad();
  EXPECT_NO_THROW((void)emb->rebalance());
}

// SGD on the rows' averaged gradients, p -= lr * g (coalesced), as recsys steps its tables.
void sgd_step(const Tensor& p, double lr) {
  const SparseRowGrad* g = autograd::sparse_grad(p);
  if (g == nullptr || g->nnz() == 0) return;
  const SparseRowGrad c = g->coalesce();
  NoGradGuard no_grad;
  const Tensor rows = c.indices.cpu().contiguous();
  for (int64_t i = 0; i < c.nnz(); ++i) {
    Tensor row = p.select(0, rows.data_ptr<int64_t>()[i]);
    row.copy_(row - c.values.select(0, i) * lr);
  }
}

// Four steps with different ids per rank, a rebalance after the second: all_gather_sparse_grads averages both tiers
// (each through its own device's group), the replicas stay equal, and they hold what a plain sparse Embedding
// trained the same way holds.
TEST_P(MpiHybridPlacement, BothTiersGradientsAreAveragedAndTheReplicasStayEqual) {
  auto emb = shared_table(10, 3, /*count_batches=*/2);
  auto plain = std::make_shared<nn::Embedding>(10, 2, nn::EmbeddingOptions{.sparse = true});
  {
    NoGradGuard no_grad;
    plain->weight.copy_(emb->table());
  }
  plain->to(dev());
  const std::vector<std::vector<int64_t>> rank0 = {{8, 8, 1}, {9, 8}, {2, 8, 0}, {9, 9, 4}};
  const std::vector<std::vector<int64_t>> rank1 = {{9, 9, 5}, {5, 5, 8, 1}, {7}, {0, 3, 5}};
  for (size_t step = 0; step < rank0.size(); ++step) {
    const Tensor x = ids(rank0[step], rank1[step]);
    const Tensor w = from_vector(std::vector<float>{1.0f, -2.0f}, {2}).to(dev());  // distinct per column
    emb->zero_grad();
    plain->zero_grad();
    sum((*emb)(x)*w * (rank() + 1.0)).backward();
    sum((*plain)(x)*w * (rank() + 1.0)).backward();
    dist::all_gather_sparse_grads(emb->parameters());
    dist::all_gather_sparse_grads(plain->parameters());
    for (const Tensor& p : emb->parameters()) sgd_step(p, 0.5);
    sgd_step(plain->weight, 0.5);
  }
  EXPECT_GE(emb->slot_of(8), 0) << "the counted hot set: 8, 5, 9";
  EXPECT_GE(emb->slot_of(5), 0);
  EXPECT_GE(emb->slot_of(9), 0);
  const std::vector<double> mine = kiln::testing::values(emb->table());
  EXPECT_EQ(kiln::testing::values(kiln::testing::the_other_ranks(emb->table())), mine) << "the replicas differ";
  EXPECT_EQ(kiln::testing::values(kiln::testing::the_other_ranks(emb->slot)), slots_of(*emb));
  EXPECT_EQ(kiln::testing::values(plain->weight), mine);
  if (dev().is_cuda()) {  // one group for both tiers cannot carry the cold one's
    emb->zero_grad();
    sum((*emb)(ids({1}, {2}))).backward();
    kiln::testing::expect_error([&] { dist::all_gather_sparse_grads(emb->parameters(), &dist::group(dev())); },
                                {"all_gather_sparse_grads: parameter 1", "is on cpu", "pass no group"});
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, MpiHybridPlacement, ::testing::ValuesIn(kiln::testing::mpi_devices()),
                         kiln::testing::device_param_name);

}  // namespace
