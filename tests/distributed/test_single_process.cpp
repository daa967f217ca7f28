// kiln/distributed in one process (no launcher): world size 1, collectives that check their arguments and
// change nothing, DataParallel as a plain wrapper.
#include <gtest/gtest.h>

#include "kiln/autograd/sparse_grad.h"  // autograd::sparse_grad
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

using namespace kiln;
using kiln::testing::BackendTest;
using kiln::testing::expect_error;

namespace {

TEST(DistSingleProcess, InitWithoutALauncherIsWorldSizeOne) {
  const dist::Env& e = dist::init();
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.bootstrap, "none");
  EXPECT_TRUE(e.is_main());
  EXPECT_FALSE(e.distributed());
  EXPECT_EQ(e.device().is_cuda(), cuda::device_count() > 0);
  EXPECT_EQ(&dist::init(), &e);
  EXPECT_EQ(dist::world_size(), 1);
  dist::barrier();
}

class DistSingleProcessOn : public BackendTest {};

TEST_P(DistSingleProcessOn, CollectivesAreIdentities) {
  Tensor t = kiln::testing::make({1, 2, 3}, {3}, opts());
  auto& g = dist::group(dev());
  EXPECT_EQ(g.backend(), "single");
  EXPECT_EQ(g.size(), 1);
  EXPECT_EQ(g.device(), dev());
  for (auto op : {dist::ReduceOp::Sum, dist::ReduceOp::Average, dist::ReduceOp::Max, dist::ReduceOp::Min}) {
    dist::all_reduce(t, op);
  }
  dist::broadcast(t, 0);
  kiln::testing::expect_values(t, {3}, {1, 2, 3});
  Tensor out = internal::zeros({1, 3}, opts());
  dist::all_gather(out, t);
  kiln::testing::expect_values(out, {1, 3}, {1, 2, 3});
  Tensor rs = internal::zeros({3}, opts());
  dist::reduce_scatter(rs, t);
  kiln::testing::expect_values(rs, {3}, {1, 2, 3});
  const uint64_t seq = g.sequence_number();
  auto w = g.all_reduce_async(t);
  EXPECT_TRUE(w->is_completed());
  EXPECT_EQ(g.sequence_number(), seq + 1);
}

TEST_P(DistSingleProcessOn, BadArgumentsAreRefused) {
  auto& g = dist::group(dev());
  expect_error([&] { g.all_reduce(Tensor()); }, {"all_reduce", "undefined"});
  Tensor nc = kiln::testing::non_contiguous(internal::ones({4, 4}, opts()));
  expect_error([&] { g.all_reduce(nc); }, {"all_reduce", "not contiguous", "contiguous()"});
  expect_error([&] { g.broadcast(internal::ones({2}, opts()), 1); }, {"root 1", "not a rank"});
  expect_error([&] { g.all_gather(internal::ones({4}, opts()), internal::ones({2}, opts())); },
               {"all_gather", "4", "2"});
  if (dev().is_cuda()) {
    expect_error([&] { g.all_reduce(internal::ones({2})); }, {"all_reduce", "cpu", "cuda:0"});
  }
}

TEST_P(DistSingleProcessOn, DataParallelIsAPlainWrapper) {
  manual_seed(3);
  auto net = std::make_shared<nn::Linear>(4, 2);
  net->to(dev());
  dist::DataParallel ddp(net);
  EXPECT_TRUE(ddp.bucket_layout().empty());  // nothing to reduce
  Tensor x = internal::randn({5, 4}, opts());
  Tensor y = ddp(x);
  kiln::testing::expect_values(y, {5, 2}, kiln::testing::values((*net)(x)));
  y.sum().backward();
  EXPECT_TRUE(net->weight.grad().defined());
  auto guard = ddp.no_sync();
}

TEST(DistSingleProcess, DataParallelRefusesModelsItCannotReduce) {
  expect_error([] { dist::DataParallel ddp(nullptr); }, {"DataParallel", "null"});
  expect_error([] { dist::DataParallel ddp(std::make_shared<nn::ReLU>()); }, {"DataParallel", "no parameters"});
  expect_error([] { dist::DataParallel ddp(std::make_shared<nn::Linear>(2, 2), {.bucket_mb = 0}); },
               {"bucket_mb", "positive"});
  if (cuda::device_count() > 0) {
    auto seq = std::make_shared<nn::Sequential>(
        std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(2, 2), std::make_shared<nn::Linear>(2, 2)});
    seq->children()[1]->to(Device::cuda(0));
    expect_error([&] { dist::DataParallel ddp(seq); }, {"DataParallel", "1.weight", "cuda:0", "one device"});
  }
}

// dist::share_placement sets count_reduction on every nn::HybridEmbedding of a model (not on other layers); at world
// size 1 the sum changes nothing, so the counts are the lookups. Only CPU groups carry the counts.
TEST_P(DistSingleProcessOn, SharePlacementSetsEveryHybridTable) {
  auto tables = std::make_shared<nn::ModuleList>();
  tables->push_back(std::make_shared<nn::HybridEmbedding>(10, 2, nn::HybridEmbeddingOptions{.hot_rows = 2}));
  tables->push_back(std::make_shared<nn::Embedding>(10, 2));
  tables->push_back(std::make_shared<nn::HybridEmbedding>(6, 2, nn::HybridEmbeddingOptions{.hot_rows = 1}));
  tables->to(dev());
  EXPECT_EQ(dist::share_placement(*tables), 2);
  auto a = tables->at<nn::HybridEmbedding>(0);
  EXPECT_TRUE(static_cast<bool>(a->count_reduction));
  EXPECT_TRUE(static_cast<bool>(tables->at<nn::HybridEmbedding>(2)->count_reduction));
  (void)(*a)(from_vector(std::vector<int64_t>{7, 7, 3}, {3}).to(dev()));
  (void)a->rebalance();
  kiln::testing::expect_values(a->counts, {10}, {0, 0, 0, 1, 0, 0, 0, 2, 0, 0});
  EXPECT_GE(a->slot_of(7), 0);
  EXPECT_GE(a->slot_of(3), 0);
  Tensor floats = internal::zeros({3});
  expect_error([&] { dist::sum_counts()(floats); },
               {"dist::sum_counts: expected a contiguous Int64 tensor on the CPU", "float32 of shape [3]"});
  if (dev().is_cuda()) {
    expect_error([&] { (void)dist::sum_counts(&dist::group(dev())); },
                 {"dist::sum_counts: the given single group works on cuda:0", "give a CPU group"});
  }
}

// With one rank the mean over the ranks is the gradient itself: all_gather_sparse_grads leaves it as it is, the same
// tensors (nothing copied, nothing read back from a GPU), and a table without a gradient stays without one.
TEST_P(DistSingleProcessOn, AllGatherSparseGradsWithOneRankLeavesTheGradientsAsTheyAre) {
  auto looked_up = nn::make<nn::Embedding>(10, 3, nn::EmbeddingOptions{.sparse = true});
  auto unused = nn::make<nn::Embedding>(4, 3, nn::EmbeddingOptions{.sparse = true});
  looked_up->to(dev());
  unused->to(dev());
  sum(looked_up(from_vector(std::vector<int64_t>{4, 1, 4}, {3}).to(dev()))).backward();
  const SparseRowGrad* before = autograd::sparse_grad(looked_up->weight);
  ASSERT_NE(before, nullptr);
  const void* indices = before->indices.data_ptr();
  const void* values = before->values.data_ptr();
  std::vector<Tensor> params = looked_up->parameters();
  for (const Tensor& p : unused->parameters()) params.push_back(p);
  dist::all_gather_sparse_grads(params);
  const SparseRowGrad* after = autograd::sparse_grad(looked_up->weight);
  ASSERT_NE(after, nullptr);
  EXPECT_EQ(after->indices.data_ptr(), indices);
  EXPECT_EQ(after->values.data_ptr(), values);
  kiln::testing::expect_values(after->indices, {3}, {4, 1, 4});
  EXPECT_EQ(autograd::sparse_grad(unused->weight), nullptr);
}

KILN_INSTANTIATE_BACKENDS(DistSingleProcessOn);

}  // namespace
