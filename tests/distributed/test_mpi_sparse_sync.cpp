// dist::all_gather_sparse_grads over 2 processes (mpirun -np 2): each rank's row-sparse gradient becomes the mean
// over the ranks (every rank's rows, divided by 2), the same on both ranks, and equal to the dense gradients'
// mean; a table with a sparse gradient on one rank only is refused. On the CPU (the MPI group) and, where each rank
// has a GPU, on it (NCCL).
#include <gtest/gtest.h>

#include <vector>

#include "distributed/mpi_test_util.h"
#include "kiln/autograd/sparse_grad.h"
#include "kiln/kiln.h"
#include "support/test_support.h"

using namespace kiln;

namespace {

class MpiSparseSync : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (dist::world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2";
  }
  Device dev() const { return GetParam(); }
};

// Rank 0 looks up rows {1, 3, 1}, rank 1 rows {3, 4} (different counts): afterwards both hold all five lookups,
// halved, and their dense form equals the mean of the two ranks' dense gradients computed here.
TEST_P(MpiSparseSync, EveryRankEndsWithTheMeanOfAllRanksRows) {
  const int rank = dist::rank();
  auto emb = nn::make<nn::Embedding>(6, 2, nn::EmbeddingOptions{.sparse = true});
  emb->to(dev());
  const std::vector<int64_t> ids = rank == 0 ? std::vector<int64_t>{1, 3, 1} : std::vector<int64_t>{3, 4};
  const double scale = rank == 0 ? 1.0 : 10.0;
  sum(emb(from_vector(ids, {static_cast<int64_t>(ids.size())}).to(dev())) * scale).backward();
  dist::all_gather_sparse_grads(emb->parameters());
  const SparseRowGrad* g = autograd::sparse_grad(emb->weight);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->nnz(), 5);
  EXPECT_EQ(kiln::testing::values(g->indices), (std::vector<double>{1, 3, 1, 3, 4}));  // rank order
  // Mean of the dense gradients: row 1 gets 2 * 1 / 2, row 3 (1 + 10) / 2, row 4 10 / 2.
  EXPECT_EQ(kiln::testing::values(g->to_dense()), (std::vector<double>{0, 0, 1, 1, 0, 0, 5.5, 5.5, 5, 5, 0, 0}));
}

TEST_P(MpiSparseSync, ATableWithASparseGradientOnOneRankOnlyIsRefused) {
  const int rank = dist::rank();
  auto emb = nn::make<nn::Embedding>(4, 2, nn::EmbeddingOptions{.sparse = true});
  emb->to(dev());
  if (rank == 0) sum(emb(from_vector(std::vector<int64_t>{1}, {1}).to(dev()))).backward();
  try {
    dist::all_gather_sparse_grads(emb->parameters());
    FAIL() << "expected a kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("some ranks and none on others"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, MpiSparseSync, ::testing::ValuesIn(kiln::testing::mpi_devices()),
                         kiln::testing::device_param_name);

}  // namespace
