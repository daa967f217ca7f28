// nn::HybridEmbedding on a GPU: the hot tier on the device, the cold one in page-locked host memory, read by either
// cold path (ColdReads::Copy, ColdReads::Mapped: the cold rows' gradients then stay on the GPU and the optimizers
// update the rows through the mapping). Lookups, and SGD (with and without momentum), SparseAdam (also under a
// GradScaler) and RowWiseAdagrad steps across a rebalance, must equal a plain sparse nn::Embedding whose whole table
// is on the GPU, bit for bit in float32 (the one exception is said where it is), state included; the kernel that reads
// host rows must move every byte of rows of any width and dtype. (Each row appears at most twice in a batch, so that
// the order in which the plain table's GPU coalescing adds a row's gradients cannot change its sum's bits.)
#include <gtest/gtest.h>

#include <algorithm>  // std::count
#include <cmath>      // INFINITY
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/autograd/grad_mode.h"       // NoGradGuard
#include "kiln/autograd/sparse_grad.h"     // sparse_grad
#include "kiln/layers/hybrid_embedding.h"  // nn::HybridEmbedding
#include "kiln/layers/layers.h"            // nn::Embedding: the all-on-GPU reference
#include "kiln/optim/grad_scaler.h"        // amp::GradScaler
#include "kiln/optim/rowwise_adagrad.h"    // optim::RowWiseAdagrad
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

// The logical (12, ...) table of a per-row state kept as a hot (3, ...) and a cold (9, ...) tensor, by emb's slots.
Tensor logical_rows(const nn::HybridEmbedding& emb, const Tensor& hot, const Tensor& cold) {
  const Tensor h = hot.to(Device::cpu()), c = cold.to(Device::cpu());
  std::vector<Tensor> rows;
  for (int64_t r = 0; r < emb.num_embeddings; ++r) {
    const int64_t s = emb.slot_of(r);
    rows.push_back(s >= 0 ? h.narrow(0, s, 1) : c.narrow(0, -s - 1, 1));
  }
  return cat(rows, 0);
}

struct SideBySide {
  bool exact = true;         // bit-equal; else within float32 rounding (rtol 1e-5)
  bool with_scaler = false;  // through an amp::GradScaler (scale 2^10) on both sides
};

// Trains a hybrid table (3 of 12 rows hot, on cuda:0) and a plain sparse Embedding holding the same table on cuda:0
// with the same batches, checking lookups and the whole table after every step, and at the end the optimizer's
// per-row state (as state_dict gives it) row by row. With ColdReads::Mapped the cold rows' gradients stay on the
// GPU and their state is made in page-locked memory; with Copy both are on the host.
template <typename Opt, typename Options>
void train_side_by_side(nn::ColdReads reads, Options options, SideBySide how = {}) {
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
  amp::GradScaler scaler({.init_scale = 1024.0, .enabled = how.with_scaler});
  amp::GradScaler ref_scaler({.init_scale = 1024.0, .enabled = how.with_scaler});
  emb->on_rebalance = [&](const nn::RowSwaps& s) {
    emb->swap_state_rows(s, opt.state(emb->hot), opt.state(emb->cold));
  };
  const auto same = [&](const Tensor& a, const Tensor& b, const std::string& what) {
    if (how.exact) {
      ASSERT_EQ(bytes_of(a), bytes_of(b)) << what;
    } else {
      ASSERT_TRUE(internal::allclose(a.to(Device::cpu()), b.to(Device::cpu()), 1e-5, 1e-7)) << what;
    }
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
    scaler.scale(loss_of(a)).backward();
    ref_scaler.scale(loss_of(b)).backward();
    const SparseRowGrad* cold_grad = autograd::sparse_grad(emb->cold);
    ASSERT_NE(cold_grad, nullptr);
    EXPECT_EQ(cold_grad->values.device(), reads == nn::ColdReads::Mapped ? gpu : Device::cpu())
        << "the cold rows' gradient is device-held exactly when the cold tier is mapped";
    scaler.step(opt);
    ref_scaler.step(ref);
    scaler.update();
    ref_scaler.update();
    same(emb->table(), plain->weight, "the table after step " + std::to_string(step));
    if (step == 2) {
      opt.zero_grad();
      ASSERT_GT(emb->rebalance().size(), 0);  // 11 and 10 come in
      EXPECT_GE(emb->slot_of(11), 0);
      EXPECT_GE(emb->slot_of(10), 0);
    }
  }
  // The per-row state: hot (index 0) and cold (index 1) against the plain table's (index 0), by slot.
  const optim::OptimizerState mine = opt.state_dict(), theirs = ref.state_dict();
  int compared = 0;
  for (const auto& [key, t] : theirs.tensors) {
    const std::string name = key.substr(std::string("state.0.").size());
    if (name == "momentum_rows") {  // SGD's sparse momentum: the rows it covers, as slot lists per tier
      const std::vector<double> hot = values(mine.tensors.at("state.0." + name));
      const std::vector<double> cold = values(mine.tensors.at("state.1." + name));
      std::vector<double> rows;
      for (int64_t r = 0; r < 12; ++r) {
        const int64_t s = emb->slot_of(r);
        const std::vector<double>& list = s >= 0 ? hot : cold;
        if (std::count(list.begin(), list.end(), static_cast<double>(s >= 0 ? s : -s - 1)) != 0) rows.push_back(r);
      }
      EXPECT_EQ(rows, values(t)) << "the rows SGD's momentum covers";
      ++compared;
      continue;
    }
    if (t.dim() < 1 || t.size(0) != 12) continue;  // the step counter
    const Tensor& hot = mine.tensors.at("state.0." + name);
    const Tensor& cold = mine.tensors.at("state.1." + name);
    EXPECT_TRUE(cold.is_cpu());
    if (reads == nn::ColdReads::Mapped) {
      EXPECT_TRUE(cold.is_pinned()) << name << ": beside the cold rows";
    }
    same(logical_rows(*emb, hot, cold), t, "optimizer state " + name);
    ++compared;
  }
  EXPECT_GT(compared + (std::is_same_v<Opt, optim::SGD> ? 1 : 0), 0) << "no per-row state was compared";
}

TEST_P(HybridEmbeddingCuda, SgdStepsEqualAWholeTableOnTheGpu) {
  train_side_by_side<optim::SGD>(GetParam(), optim::SGDOptions{.lr = 0.1});
}

TEST_P(HybridEmbeddingCuda, SgdMomentumStepsEqualAWholeTableOnTheGpu) {
  // The momentum covers every row ever touched; its per-row mask follows the rows across the rebalance.
  train_side_by_side<optim::SGD>(GetParam(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1});
}

TEST_P(HybridEmbeddingCuda, SparseAdamStepsEqualAWholeTableOnTheGpu) {
  train_side_by_side<optim::SparseAdam>(GetParam(), optim::SparseAdamOptions{.lr = 0.05});
}

TEST_P(HybridEmbeddingCuda, SparseAdamUnderAGradScalerEqualsAWholeTableOnTheGpu) {
  train_side_by_side<optim::SparseAdam>(GetParam(), optim::SparseAdamOptions{.lr = 0.05}, {.with_scaler = true});
}

TEST_P(HybridEmbeddingCuda, RowWiseAdagradStepsEqualAWholeTableOnTheGpu) {
  // Mapped: both tiers take the fused update, as the whole table does (bit-equal). Copy: the cold rows' update runs
  // through kiln ops on the host, whose row mean may add in another order (float32 rounding).
  train_side_by_side<optim::RowWiseAdagrad>(GetParam(), optim::RowWiseAdagradOptions{.lr = 0.1},
                                            {.exact = GetParam() == nn::ColdReads::Mapped});
}

TEST_P(HybridEmbeddingCuda, AFoundInfSkipsTheColdRowsToo) {
  // An inf in one looked-up cold row's gradient: the GradScaler skips the step on both tiers, on the device.
  const Device gpu = Device::cuda(0);
  manual_seed(24);
  nn::HybridEmbedding emb(12, 8, {.device = gpu, .hot_rows = 3, .cold_reads = GetParam()});
  optim::SparseAdam opt(emb.parameters(), {.lr = 0.05});
  amp::GradScaler scaler({.init_scale = 1024.0});
  const Tensor before = emb.table();
  const Tensor out = emb(ids_of({0, 7, 9}));
  const Tensor weights = make({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, INFINITY, 1, 1, 1, 1, 1, 1, 1}, {3, 8});
  scaler.scale(sum(out * weights.to(gpu))).backward();  // row 9 (cold) gets an inf
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(bytes_of(emb.table()), bytes_of(before)) << "a step with an inf changed the table";
  EXPECT_EQ(scaler.get_scale(), 512.0);
  const optim::OptimizerState st = opt.state_dict();
  for (const auto& [key, t] : st.tensors) {
    if (key.find(".step") != std::string::npos) {
      EXPECT_EQ(values(t), std::vector<double>{0.0}) << key;
    }
  }
}

TEST(HybridEmbeddingCudaGrad, ADeviceHeldGradientNeedsAPageLockedParameter) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  Tensor pageable = zeros({4, 2});
  pageable.requires_grad_();
  const SparseRowGrad g{ids_of({1}).to(gpu), ones({1, 2}).to(gpu), {4, 2}};
  expect_error([&] { autograd::accumulate_sparse_grad(pageable, g); },
               {"on cuda:0 but the parameter is float32 on cpu in pageable memory",
                "only for a parameter in page-locked host memory"});
  Tensor locked = zeros({4, 2}).pin_memory();
  locked.requires_grad_();
  autograd::accumulate_sparse_grad(locked, g);  // device-held
  EXPECT_TRUE(autograd::sparse_grad(locked)->values.is_cuda());
  const SparseRowGrad host{ids_of({2}), ones({1, 2}), {4, 2}};
  expect_error([&] { autograd::accumulate_sparse_grad(locked, host); },
               {"holds a sparse gradient on cuda:0 and is given rows on cpu"});
  // An update without a fused form (a float64 table) brings the gradient to the host.
  Tensor wide = zeros({4, 2}, {.dtype = DType::Float64}).pin_memory();
  wide.requires_grad_();
  autograd::accumulate_sparse_grad(wide,
                                   {ids_of({1}).to(gpu), ones({1, 2}, {.dtype = DType::Float64}).to(gpu), {4, 2}});
  optim::SGD sgd({wide}, {.lr = 1.0, .momentum = 0.5});
  sgd.step();
  EXPECT_EQ(values(wide), (std::vector<double>{0, 0, -1, -1, 0, 0, 0, 0}));
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

// A hybrid table (rows x dim, `hot` rows hot, mapped cold reads) on cuda:0 and a plain sparse Embedding holding its
// logical table there.
std::pair<std::shared_ptr<nn::HybridEmbedding>, std::shared_ptr<nn::Embedding>> mapped_and_whole(int64_t rows,
                                                                                                 int64_t dim,
                                                                                                 int64_t hot) {
  const Device gpu = Device::cuda(0);
  auto emb = std::make_shared<nn::HybridEmbedding>(
      rows, dim, nn::HybridEmbeddingOptions{.device = gpu, .hot_rows = hot, .cold_reads = nn::ColdReads::Mapped});
  auto plain = std::make_shared<nn::Embedding>(rows, dim, nn::EmbeddingOptions{.sparse = true});
  {
    NoGradGuard no_grad;
    plain->weight.copy_(emb->table());
  }
  plain->to(gpu);
  return {emb, plain};
}

// Backward through the lookups a (of emb) and b (of plain), one SGD step at lr 1 on each: the tables stay equal.
void step_both(const Tensor& a, const Tensor& b, nn::HybridEmbedding& emb, nn::Embedding& plain) {
  loss_of(a).backward();
  loss_of(b).backward();
  optim::SGD sgd(emb.parameters(), {.lr = 1.0});
  optim::SGD ref(plain.parameters(), {.lr = 1.0});
  sgd.step();
  ref.step();
  EXPECT_EQ(bytes_of(emb.table()), bytes_of(plain.weight));
}

// With mapped cold reads the placement lives on the GPU as well (the placed lookup): ids given on the GPU are read
// there, counted there, and their rows and gradients are those of the logical table; the counts reach `counts` at
// agree_counts(), state_dict() and rebalance().
TEST(HybridEmbeddingCudaPlaced, IdsOnTheGpuAreLookedUpAndCountedThere) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  manual_seed(23);
  const Device gpu = Device::cuda(0);
  auto [emb, plain] = mapped_and_whole(40, 16, 10);
  std::vector<int64_t> ids;
  std::vector<int64_t> expected_counts(40, 0);
  for (int64_t i = 0; i < 300; ++i) {
    const int64_t id = (i * i * 7 + 3) % 40;
    ids.push_back(id);
    ++expected_counts[static_cast<size_t>(id)];
  }
  const Tensor on_gpu = ids_of(ids).to(gpu);
  const Tensor a = (*emb)(on_gpu), b = (*plain)(on_gpu);
  EXPECT_EQ(bytes_of(a), bytes_of(b));
  EXPECT_EQ(emb->device_placement_bytes(), 40 * 4 * 2) << "an Int32 slot and Int32 counts per row on the GPU";
  step_both(a, b, *emb, *plain);
  // Not yet in counts: the device holds them until they are agreed.
  emb->agree_counts();
  EXPECT_EQ(emb->counts.to_vector<int64_t>(), expected_counts);
  // A second lookup (ids on the host this time) counts on top; state_dict saves every lookup so far.
  (void)(*emb)(ids_of({5, 5, 39}));
  for (int64_t id : {5, 5, 39}) ++expected_counts[static_cast<size_t>(id)];
  const nn::StateDict saved = emb->state_dict();
  ASSERT_EQ(saved[2].first, "counts");
  EXPECT_EQ(saved[2].second.to_vector<int64_t>(), expected_counts);
  // Evaluation mode counts nothing.
  emb->eval();
  (void)(*emb)(ids_of({7}).to(gpu));
  emb->agree_counts();
  EXPECT_EQ(emb->counts.to_vector<int64_t>(), expected_counts);
}

TEST(HybridEmbeddingCudaPlaced, ARebalanceBetweenALookupAndItsBackwardSendsEachGradientToItsRow) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  manual_seed(24);
  const Device gpu = Device::cuda(0);
  auto [emb, plain] = mapped_and_whole(12, 8, 3);
  const Tensor ids = ids_of({11, 0, 10, 11, 4, 10, 1}).to(gpu);
  const Tensor a = (*emb)(ids), b = (*plain)(ids);
  EXPECT_EQ(bytes_of(a), bytes_of(b));
  ASSERT_GT(emb->rebalance().size(), 0);  // 11 and 10, looked up twice each, come in
  EXPECT_GE(emb->slot_of(11), 0);
  step_both(a, b, *emb, *plain);
  // The next lookup reads the new placement on the device.
  EXPECT_EQ(bytes_of((*emb)(ids)), bytes_of((*plain)(ids)));
}

TEST(HybridEmbeddingCudaPlaced, BadIdsOnTheGpuNameTheTableAndTheIdAtTheNextSynchronisation) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  nn::HybridEmbedding emb(6, 4, {.device = gpu, .hot_rows = 2, .cold_reads = nn::ColdReads::Mapped});
  expect_error(
      [&] {
        (void)emb(ids_of({1, 6}).to(gpu)).cpu();
      },
      {"HybridEmbedding (6 x 4 table)", "index 6", "out of range", "size 6"});
  expect_error([&] { (void)emb(ids_of({-2}).to(gpu)).cpu(); }, {"HybridEmbedding (6 x 4 table)", "index -2"});
  // Ids on the host are checked by the call itself.
  expect_error([&] { (void)emb(ids_of({7})); }, {"(6 x 4 table): id 7 at position 0", "out of range [0, 6)"});
  // A good lookup still works.
  EXPECT_EQ(bytes_of(emb(ids_of({5, 0}).to(gpu))), bytes_of(index_select(emb.table(), 0, ids_of({5, 0}))));
}

TEST_P(HybridEmbeddingCuda, ALargeColdTierIsReadAndUpdatedAsTheLogicalTable) {
  // A cold tier of 96 MiB: a huge-page block that the pinned allocator registers (32 MiB and up), which the mapped
  // lookups and the fused updates read and write at its host address.
  manual_seed(25);
  const Device gpu = Device::cuda(0);
  nn::HybridEmbedding emb(393'216 + 1000, 64, {.device = gpu, .hot_rows = 1000, .cold_reads = GetParam()});
  ASSERT_TRUE(emb.cold.is_pinned());
  ASSERT_GE(emb.cold.nbytes(), int64_t{32} << 20);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 30000; ++i) ids.push_back((i * 104'729) % emb.num_embeddings);
  const Tensor before = emb.table();
  EXPECT_EQ(bytes_of(emb(ids_of(ids))), bytes_of(index_select(before, 0, ids_of(ids))));
  // One SGD step at lr 1 on sum(rows): every looked-up row falls by its number of lookups.
  optim::SGD sgd(emb.parameters(), {.lr = 1.0});
  sum(emb(ids_of(ids))).backward();
  sgd.step();
  cuda::synchronize();
  std::vector<double> times(static_cast<size_t>(emb.num_embeddings), 0.0);
  for (const int64_t id : ids) times[static_cast<size_t>(id)] += 1.0;
  const Tensor expected = before - from_vector(times, {emb.num_embeddings}).to(DType::Float32).unsqueeze(1);
  EXPECT_EQ(bytes_of(emb.table()), bytes_of(expected));
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
