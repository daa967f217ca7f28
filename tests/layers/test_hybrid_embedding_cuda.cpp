// nn::HybridEmbedding on a GPU: the hot tier on the device, the cold one in page-locked host memory, read by either
// cold path (ColdReads::Copy, ColdReads::Mapped). Lookups, and SGD and SparseAdam steps across a rebalance, must equal
// a plain sparse nn::Embedding whose whole table is on the GPU, bit for bit in float32; the kernel that reads host
// rows must move every byte of rows of any width and dtype. (Each row appears at most twice in a batch, so that
// the order in which the plain table's GPU coalescing adds a row's gradients cannot change its sum's bits.)
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kiln/autograd/grad_mode.h"       // NoGradGuard
#include "kiln/autograd/sparse_grad.h"     // sparse_grad
#include "kiln/layers/hybrid_embedding.h"  // nn::HybridEmbedding
#include "kiln/layers/layers.h"            // nn::Embedding: the all-on-GPU reference
#include "kiln/optim/sgd.h"                // optim::SGD
#include "kiln/optim/sparse_adam.h"        // optim::SparseAdam
#include "kiln/tensor/cuda.h"              // cuda::is_available
#include "kiln/tensor/internal_ops.h"      // internal::from_vector
#include "support/test_support.h"          // make, uniform

namespace kiln::testing {
namespace {

Tensor ids_of(const std::vector<int64_t>& v) { return internal::from_vector(v, {static_cast<int64_t>(v.size())}); }

Tensor loss_of(const Tensor& out) {
  const int64_t n = out.numel();
  return sum(out * make(uniform(n, -2, 2, 42), out.shape()).to(out.device()));
}

class HybridEmbeddingCuda : public ::testing::TestWithParam<nn::ColdReads> {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  }
};

// Trains a hybrid table (3 of 12 rows hot, on cuda:0) and a plain sparse Embedding holding the same table on cuda:0
// with the same batches, checking lookups and the whole table after every step.
template <typename Opt, typename Options>
void train_side_by_side(nn::ColdReads reads, Options options) {
  const Device gpu = Device::cuda(0);
  manual_seed(21);
  auto emb = std::make_shared<nn::HybridEmbedding>(
      12, 8, nn::HybridEmbeddingOptions{.device = gpu, .hot_rows = 3, .cold_reads = reads});
  ASSERT_TRUE(emb->hot.is_cuda());
  ASSERT_TRUE(emb->cold.is_cpu() && emb->cold.is_pinned());
  auto plain = std::make_shared<nn::Embedding>(12, 8, nn::EmbeddingOptions{.sparse = true});
  {
    NoGradGuard no_grad;
    plain->weight.copy_(emb->table());
  }
  plain->to(gpu);
  Opt opt(emb->parameters(), options);
  Opt ref(plain->parameters(), options);
  emb->on_rebalance = [&](const nn::RowSwaps& s) {
    emb->swap_state_rows(s, opt.state(emb->hot), opt.state(emb->cold));
  };
  const std::vector<std::vector<int64_t>> batches = {{0, 1, 11, 11, 10}, {11, 10, 10, 7, 2}, {11, 9, 10, 0},
                                                     {1, 10, 11, 5},     {7, 7, 0, 3},       {11, 2, 10, 4, 1}};
  for (size_t step = 0; step < batches.size(); ++step) {
    const Tensor ids = ids_of(batches[step]);
    opt.zero_grad();
    ref.zero_grad();
    const Tensor a = (*emb)(ids), b = (*plain)(ids.to(gpu));
    ASSERT_TRUE(a.is_cuda());
    ASSERT_EQ(bytes_of(a), bytes_of(b)) << "lookup of step " << step;
    loss_of(a).backward();
    loss_of(b).backward();
    opt.step();
    ref.step();
    ASSERT_EQ(bytes_of(emb->table()), bytes_of(plain->weight)) << "after step " << step;
    if (step == 2) {
      opt.zero_grad();
      ASSERT_GT(emb->rebalance().size(), 0);  // 11 and 10 come in
      EXPECT_GE(emb->slot_of(11), 0);
      EXPECT_GE(emb->slot_of(10), 0);
    }
  }
}

TEST_P(HybridEmbeddingCuda, SgdStepsEqualAWholeTableOnTheGpu) {
  train_side_by_side<optim::SGD>(GetParam(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

TEST_P(HybridEmbeddingCuda, SparseAdamStepsEqualAWholeTableOnTheGpu) {
  train_side_by_side<optim::SparseAdam>(GetParam(), optim::SparseAdamOptions{.lr = 0.05});
}

TEST_P(HybridEmbeddingCuda, LookupsOfManyRowsEqualTheLogicalTable) {
  // Enough ids for many blocks of the kernel, with most rows cold.
  manual_seed(22);
  const Device gpu = Device::cuda(0);
  nn::HybridEmbedding emb(5000, 24, {.device = gpu, .hot_rows = 500, .cold_reads = GetParam()});
  std::vector<int64_t> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7919) % 5000);
  const Tensor out = emb(ids_of(ids));
  EXPECT_EQ(bytes_of(out), bytes_of(index_select(emb.table(), 0, ids_of(ids))));
}

INSTANTIATE_TEST_SUITE_P(ColdReads, HybridEmbeddingCuda, ::testing::Values(nn::ColdReads::Copy, nn::ColdReads::Mapped),
                         [](const ::testing::TestParamInfo<nn::ColdReads>& info) {
                           return info.param == nn::ColdReads::Copy ? "copy" : "mapped";
                         });

TEST_P(HybridEmbeddingCuda, LookupsOfRowsOfAnyWidthAndDtypeEqualTheLogicalTable) {
  // Rows of 16-byte words (Float32 x 32, Float64 x 2), 4-byte words (Float32 x 3) and single bytes (Float16 x 5):
  // each of the kernel's word sizes.
  struct Case {
    DType dtype;
    int64_t width;
  };
  for (const Case c :
       {Case{DType::Float32, 32}, Case{DType::Float64, 2}, Case{DType::Float32, 3}, Case{DType::Float16, 5}}) {
    manual_seed(23);
    nn::HybridEmbedding emb(300, c.width, {.device = Device::cuda(0), .hot_rows = 30, .cold_reads = GetParam()});
    emb.to(c.dtype);
    ASSERT_TRUE(emb.cold.is_pinned());
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 1000; ++i) ids.push_back((i * 37 + 11) % 300);
    EXPECT_EQ(bytes_of(emb(ids_of(ids))), bytes_of(index_select(emb.table(), 0, ids_of(ids))))
        << c.dtype << " rows of " << c.width;
  }
}

}  // namespace
}  // namespace kiln::testing
