// nn::HybridEmbedding on the CPU (both tiers in host memory, which tests the placement logic): lookups and sparse
// gradients bit for bit as a plain sparse nn::Embedding holding the same table, SGD steps across a rebalance, the hot
// set from a frequency table and from counted batches, rebalance moving values and optimizer state exactly, the
// one-table state dict and its round trips (also through io::save_checkpoint), and the errors (a bad id's names the
// table by its place in the model).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>  // std::exchange: the simulated rank's pending counts
#include <vector>

#include "kiln/autograd/grad_mode.h"       // NoGradGuard: the hand-written SGD step
#include "kiln/autograd/sparse_grad.h"     // sparse_grad: the gradients compared
#include "kiln/io/checkpoint.h"            // io::save_checkpoint / load_checkpoint
#include "kiln/layers/containers.h"        // nn::Sequential: a state dict with a prefix
#include "kiln/layers/hybrid_embedding.h"  // nn::HybridEmbedding
#include "kiln/layers/layers.h"            // nn::Embedding, nn::Linear: the reference and a model around it
#include "kiln/tensor/internal_ops.h"      // internal::from_vector
#include "support/temp_folder.h"           // TempFolder: the checkpoint file
#include "support/test_support.h"          // expect_error, make

namespace kiln::testing {
namespace {

Tensor ids_of(const std::vector<int64_t>& v, const Shape& shape) { return internal::from_vector(v, shape); }

// A tier-shaped pair (hot_like (H, ...), cold_like (V - H, ...)) as one (V, ...) tensor in logical row order.
Tensor logical(const nn::HybridEmbedding& emb, const Tensor& hot_like, const Tensor& cold_like) {
  std::vector<int64_t> at;
  for (int64_t r = 0; r < emb.num_embeddings; ++r) {
    const int64_t s = emb.slot_of(r);
    at.push_back(s >= 0 ? s : emb.hot_rows + (-s - 1));
  }
  return internal::index_select(internal::cat({hot_like.cpu(), cold_like.cpu()}, 0), 0,
                                ids_of(at, {emb.num_embeddings}));
}

// The dense (V, D) gradient of a parameter's sparse gradient (zeros when it has none).
Tensor dense_grad(const Tensor& p) {
  const SparseRowGrad* g = autograd::sparse_grad(p);
  return g == nullptr ? zeros(p.shape()) : g->to_dense();
}

// The hybrid's gradient mapped back to logical rows.
Tensor logical_grad(const nn::HybridEmbedding& emb) { return logical(emb, dense_grad(emb.hot), dense_grad(emb.cold)); }

// A fixed loss that weighs each output element differently, so every row's gradient is distinct.
Tensor loss_of(const Tensor& out) {
  const int64_t n = out.numel();
  return sum(out * make(uniform(n, -2, 2, 42), out.shape()));
}

// The hand-written sparse SGD: rows -= lr * coalesced gradient rows (the same expression for every table).
void sgd_step(const Tensor& p, double lr) {
  const SparseRowGrad* g = autograd::sparse_grad(p);
  if (g == nullptr) return;
  const SparseRowGrad c = g->coalesce();
  NoGradGuard no_grad;
  const Tensor indices = c.indices.cpu().contiguous();
  const int64_t* rows = indices.data_ptr<int64_t>();
  for (int64_t i = 0; i < c.nnz(); ++i) {
    Tensor row = p.select(0, rows[i]);
    row.copy_(row - c.values.select(0, i) * lr);
  }
}

// A table whose hot rows (by frequency) are scattered: rows 7, 2, 9, 4 hot of 10.
nn::HybridEmbedding scattered(int64_t d = 3) {
  return nn::HybridEmbedding(
      10, d, {.hot_rows = 4, .frequencies = make({0, 1, 8, 0, 5, 1, 0, 9, 2, 7}, {10}, {.dtype = DType::Int32})});
}

// A plain sparse Embedding holding `emb`'s logical table.
std::shared_ptr<nn::Embedding> plain_copy(const nn::HybridEmbedding& emb) {
  auto plain =
      std::make_shared<nn::Embedding>(emb.num_embeddings, emb.embedding_dim, nn::EmbeddingOptions{.sparse = true});
  NoGradGuard no_grad;
  plain->weight.copy_(emb.table());
  return plain;
}

TEST(HybridEmbedding, LookupsAndSparseGradientsMatchAPlainEmbedding) {
  manual_seed(3);
  auto emb = scattered();
  auto plain = plain_copy(emb);
  // Repeats of hot rows (7) and of cold rows (0), both tiers in one call.
  const Tensor ids = ids_of({7, 0, 3, 7, 9, 0, 0, 5, 2, 8}, {2, 5});
  const Tensor a = emb(ids), b = (*plain)(ids);
  ASSERT_EQ(a.shape(), (Shape{2, 5, 3}));
  EXPECT_EQ(bytes_of(a), bytes_of(b));
  loss_of(a).backward();
  loss_of(b).backward();
  EXPECT_FALSE(emb.hot.grad().defined());  // sparse only
  EXPECT_FALSE(emb.cold.grad().defined());
  ASSERT_TRUE(autograd::has_sparse_grad(emb.hot));
  ASSERT_TRUE(autograd::has_sparse_grad(emb.cold));
  EXPECT_EQ(autograd::sparse_grad(emb.hot)->nnz(), 4);   // 7, 9, 7, 2
  EXPECT_EQ(autograd::sparse_grad(emb.cold)->nnz(), 6);  // 0, 3, 0, 0, 5, 8
  EXPECT_EQ(bytes_of(logical_grad(emb)), bytes_of(dense_grad(plain->weight)));
  // Int32 ids look up the same rows; a second backward appends to both tiers' gradients.
  const Tensor a32 = emb(ids.to(DType::Int32));
  EXPECT_EQ(bytes_of(a32), bytes_of(b));
  loss_of(a32).backward();
  loss_of((*plain)(ids)).backward();
  EXPECT_EQ(bytes_of(logical_grad(emb)), bytes_of(dense_grad(plain->weight)));
}

TEST(HybridEmbedding, AColumnOfABatchsIdsIsLookedUpAtItsStride) {
  // A (B, F) batch's column t is a strided view (stride F): the lookup reads it where it lies, and the rows, the
  // gradients and the counts are those of the same ids made contiguous.
  manual_seed(4);
  auto emb = scattered();
  auto plain = plain_copy(emb);
  const Tensor batch = ids_of({7, 1, 0, 9, 3, 3, 7, 0, 9, 5, 0, 0}, {6, 2});
  const Tensor column = batch.select(1, 0);  // 7, 0, 3, 7, 9, 0
  ASSERT_FALSE(column.is_contiguous());
  const Tensor a = emb(column), b = (*plain)(column.contiguous());
  EXPECT_EQ(bytes_of(a), bytes_of(b));
  loss_of(a).backward();
  loss_of(b).backward();
  EXPECT_EQ(bytes_of(logical_grad(emb)), bytes_of(dense_grad(plain->weight)));
  const std::vector<int64_t> counted = emb.counts.to_vector<int64_t>();
  EXPECT_EQ(counted, (std::vector<int64_t>{2, 0, 0, 1, 0, 0, 0, 2, 0, 1}));
}

TEST(HybridEmbedding, ARebalanceBetweenALookupAndItsBackwardSendsEachGradientToItsRow) {
  // Backward redoes the split by the placement of its own time: rows that changed tier since the lookup take their
  // gradients in their new tier (the lookup's own index lists would send them to the old one).
  manual_seed(5);
  auto emb = scattered();  // 7, 2, 9, 4 hot
  auto plain = plain_copy(emb);
  const Tensor ids = ids_of({7, 0, 3, 7, 9, 0, 2, 8}, {8});
  const Tensor a = emb(ids), b = (*plain)(ids);
  EXPECT_EQ(bytes_of(a), bytes_of(b));
  int64_t* c = emb.counts.data_ptr<int64_t>();
  c[0] = c[3] = c[8] = 100;  // 0, 3 and 8 come in, 7 and 2 stay (frequencies 9, 8), 9 and 4 go out... of 4 slots
  const nn::RowSwaps swaps = emb.rebalance();
  ASSERT_GT(swaps.size(), 0);
  EXPECT_GE(emb.slot_of(0), 0);
  EXPECT_LT(emb.slot_of(9), 0);
  loss_of(a).backward();
  loss_of(b).backward();
  EXPECT_EQ(bytes_of(logical_grad(emb)), bytes_of(dense_grad(plain->weight)));
  // Without a rebalance in between, the lookup's own lists serve its backward: the same gradients.
  emb.zero_grad();
  plain->zero_grad();
  loss_of(emb(ids)).backward();
  loss_of((*plain)(ids)).backward();
  EXPECT_EQ(bytes_of(logical_grad(emb)), bytes_of(dense_grad(plain->weight)));
}

TEST(HybridEmbedding, AllHotAndAllColdTablesWork) {
  for (int64_t h : {int64_t{0}, int64_t{6}}) {
    manual_seed(4);
    nn::HybridEmbedding emb(6, 2, {.hot_rows = h});
    EXPECT_EQ(emb.hot.shape(), (Shape{h, 2}));
    EXPECT_EQ(emb.cold.shape(), (Shape{6 - h, 2}));
    auto plain = plain_copy(emb);
    const Tensor ids = ids_of({5, 0, 5, 3}, {4});
    const Tensor a = emb(ids);
    EXPECT_EQ(bytes_of(a), bytes_of((*plain)(ids))) << "hot_rows " << h;
    loss_of(a).backward();
    loss_of((*plain)(ids)).backward();
    EXPECT_EQ(bytes_of(logical_grad(emb)), bytes_of(dense_grad(plain->weight))) << "hot_rows " << h;
  }
}

TEST(HybridEmbedding, SgdStepsAcrossARebalanceGiveTheSameTableAsAPlainEmbedding) {
  manual_seed(5);
  nn::HybridEmbedding emb(10, 4, {.hot_rows = 4});  // rows 0..3 hot
  auto plain = plain_copy(emb);
  const std::vector<std::vector<int64_t>> batches = {{0, 1, 1, 2, 7}, {3, 3, 3, 9, 9, 0}, {5, 6, 6, 6, 6, 1},
                                                     {8, 8, 2, 4},    {6, 1, 0, 0, 3, 3}, {7, 6, 5, 4}};
  for (size_t step = 0; step < batches.size(); ++step) {
    const Tensor ids = ids_of(batches[step], {static_cast<int64_t>(batches[step].size())});
    loss_of(emb(ids)).backward();
    loss_of((*plain)(ids)).backward();
    sgd_step(emb.hot, 0.1);
    sgd_step(emb.cold, 0.1);
    sgd_step(plain->weight, 0.1);
    emb.zero_grad();
    plain->zero_grad();
    ASSERT_EQ(bytes_of(emb.table()), bytes_of(plain->weight)) << "after step " << step;
    if (step == 2) {  // counts 6: 4, 1: 3, 3: 3, 0: 2, 9: 2 (0 wins the tie): row 6 comes in, row 2 leaves
      const nn::RowSwaps swaps = emb.rebalance();
      EXPECT_EQ(swaps.size(), 1);
      EXPECT_GE(emb.slot_of(6), 0);
      EXPECT_LT(emb.slot_of(2), 0);
      EXPECT_EQ(bytes_of(emb.table()), bytes_of(plain->weight));
    }
  }
}

// Steps a hybrid table and a plain one holding the same table with their optimizers on the same batches; the two
// tables must stay equal bit for bit. After step 2 (and zero_grad), `at_step_2` (a rebalance and its checks).
template <typename Opt>
void train_beside(nn::HybridEmbedding& emb, nn::Embedding& plain, Opt& opt, Opt& ref,
                  const std::vector<std::vector<int64_t>>& batches, const std::function<void()>& at_step_2) {
  for (size_t step = 0; step < batches.size(); ++step) {
    const Tensor ids = ids_of(batches[step], {static_cast<int64_t>(batches[step].size())});
    opt.zero_grad();
    ref.zero_grad();
    loss_of(emb(ids)).backward();
    loss_of(plain(ids)).backward();
    opt.step();
    ref.step();
    ASSERT_EQ(bytes_of(emb.table()), bytes_of(plain.weight)) << "after step " << step;
    if (step == 2) {
      opt.zero_grad();
      at_step_2();
    }
  }
}

// SGD's sparse momentum applies to every row a gradient ever touched (PyTorch's semantics): a row that changes tier
// keeps that membership, so it goes on moving by its momentum in its new tier.
TEST(HybridEmbedding, SgdMomentumAcrossARebalanceMatchesAPlainEmbedding) {
  manual_seed(16);
  auto emb = std::make_shared<nn::HybridEmbedding>(8, 2, nn::HybridEmbeddingOptions{.hot_rows = 3});  // 0, 1, 2 hot
  auto plain = plain_copy(*emb);
  optim::SGD opt(emb->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref(plain->parameters(), {.lr = 0.1, .momentum = 0.9});
  emb->on_rebalance = [&](const nn::RowSwaps& s) {
    emb->swap_state_rows(s, opt.state(emb->hot), opt.state(emb->cold));
  };
  // Rows 5 and 6 (cold, with momentum) trade places with rows 1 and 2 (hot, never touched); then only row 0 is looked
  // up, and 5 and 6 move by their momentum alone.
  train_beside(*emb, *plain, opt, ref, {{0, 5}, {0, 6}, {6, 6, 6}, {0}, {0}, {0, 7}}, [&] {
    ASSERT_EQ(emb->rebalance().size(), 2);
    ASSERT_GE(emb->slot_of(5), 0);
    ASSERT_GE(emb->slot_of(6), 0);
  });
}

TEST(HybridEmbedding, SgdMomentumLoadedBeforeARebalanceMatchesAPlainEmbedding) {
  // A checkpoint saves the momentum's rows as sorted slot lists; loaded, they become the per-row mask again, so a
  // rebalance right after the load (before any step) carries them like the rest of the state.
  manual_seed(17);
  auto emb = std::make_shared<nn::HybridEmbedding>(8, 2, nn::HybridEmbeddingOptions{.hot_rows = 3});  // 0, 1, 2 hot
  auto plain = plain_copy(*emb);
  const optim::SGDOptions o{.lr = 0.1, .momentum = 0.9};
  optim::SGD first(emb->parameters(), o), ref(plain->parameters(), o);
  train_beside(*emb, *plain, first, ref, {{0, 5}, {0, 6}, {6, 6, 6}}, [] {});
  const optim::OptimizerState saved = first.state_dict();
  ASSERT_TRUE(saved.tensors.count("state.1.momentum_rows"));
  optim::SGD resumed(emb->parameters(), o);
  resumed.load_state_dict(saved);
  for (const Tensor& tier : {emb->hot, emb->cold}) {
    EXPECT_TRUE(resumed.state(tier).count("momentum_mask")) << "loaded rows made a mask";
    EXPECT_FALSE(resumed.state(tier).count("momentum_rows"));
  }
  emb->on_rebalance = [&](const nn::RowSwaps& s) {
    emb->swap_state_rows(s, resumed.state(emb->hot), resumed.state(emb->cold));
  };
  ASSERT_EQ(emb->rebalance().size(), 2);  // 6 and 5 come in
  ASSERT_GE(emb->slot_of(5), 0);
  ASSERT_GE(emb->slot_of(6), 0);
  train_beside(*emb, *plain, resumed, ref, {{0}, {0}, {0, 7}}, [] {});
}

// SparseAdam keeps (rows, D) moments per parameter: on_rebalance carries the moved rows' moments between the
// tiers' states, so the steps after a rebalance still equal SparseAdam on one plain table, bit for bit.
TEST(HybridEmbedding, SparseAdamAcrossARebalanceMatchesAPlainEmbedding) {
  manual_seed(15);
  auto emb = std::make_shared<nn::HybridEmbedding>(10, 4, nn::HybridEmbeddingOptions{.hot_rows = 3});
  auto plain = plain_copy(*emb);
  optim::SparseAdam opt(emb->parameters(), {.lr = 0.05});
  optim::SparseAdam ref(plain->parameters(), {.lr = 0.05});
  int rebalances = 0;
  emb->on_rebalance = [&](const nn::RowSwaps& s) {
    ++rebalances;
    emb->swap_state_rows(s, opt.state(emb->hot), opt.state(emb->cold));
  };
  train_beside(*emb, *plain, opt, ref,
               {{0, 1, 9, 9, 8}, {9, 8, 8, 7, 2}, {9, 9, 8, 0}, {1, 8, 9, 5}, {7, 7, 0, 3}, {9, 2, 8, 8, 1}, {4, 6, 9}},
               [&] {
                 ASSERT_EQ(emb->rebalance().size(), 2);  // 9 and 8 come in, 1 and 2 leave (0 stays: ties, lower row)
                 EXPECT_GE(emb->slot_of(9), 0);
                 EXPECT_GE(emb->slot_of(8), 0);
               });
  EXPECT_EQ(rebalances, 1);
  // The moments themselves, mapped back to logical rows, equal the plain table's.
  for (const char* name : {"exp_avg", "exp_avg_sq"})
    EXPECT_EQ(bytes_of(logical(*emb, opt.state(emb->hot).at(name), opt.state(emb->cold).at(name))),
              bytes_of(ref.state(plain->weight).at(name)))
        << name;
}

TEST(HybridEmbedding, HotRowsComeFromAFrequencyTableTiesToTheLowerRow) {
  auto emb = scattered();
  for (int64_t r : {7, 2, 9, 4}) EXPECT_GE(emb.slot_of(r), 0) << r;
  for (int64_t r : {0, 1, 3, 5, 6, 8}) EXPECT_LT(emb.slot_of(r), 0) << r;
  // Hot slots follow row order: 2, 4, 7, 9 -> 0, 1, 2, 3; cold ones too: 0 -> -1, 1 -> -2, ...
  EXPECT_EQ(emb.slot_of(2), 0);
  EXPECT_EQ(emb.slot_of(9), 3);
  EXPECT_EQ(emb.slot_of(0), -1);
  EXPECT_EQ(emb.slot_of(8), -6);
  // Float frequencies with ties: rows 1, 2, 3 tie at 0.25; the lower ids (1, 2) win.
  nn::HybridEmbedding tied(5, 2, {.hot_rows = 2, .frequencies = make({0.1, 0.25, 0.25, 0.25, 0.15}, {5})});
  EXPECT_GE(tied.slot_of(1), 0);
  EXPECT_GE(tied.slot_of(2), 0);
  EXPECT_LT(tied.slot_of(3), 0);
  // hot_fraction: round(0.25 * 10) = 3 rows (the default placement: rows 0..2).
  nn::HybridEmbedding fraction(10, 2, {.hot_fraction = 0.25});
  EXPECT_EQ(fraction.hot_rows, 3);
  EXPECT_EQ(fraction.slot_of(2), 2);
  EXPECT_EQ(fraction.slot_of(3), -1);
}

TEST(HybridEmbedding, HotRowsComeFromCountingTheFirstBatches) {
  manual_seed(6);
  nn::HybridEmbedding emb(8, 2, {.hot_rows = 2, .count_batches = 2});
  EXPECT_GE(emb.slot_of(0), 0);  // rows 0..H-1 are hot while counting
  EXPECT_GE(emb.slot_of(1), 0);
  int rebalances = 0;
  emb.on_rebalance = [&](const nn::RowSwaps& s) {
    ++rebalances;
    EXPECT_EQ(s.size(), 2);
  };
  emb.eval();
  (void)emb(ids_of({3, 3, 3, 3}, {4}));  // not counted: eval mode
  EXPECT_EQ(values(emb.counts), std::vector<double>(8, 0.0));
  emb.train();
  const Tensor before = emb.table();
  (void)emb(ids_of({5, 6, 6, 0}, {4}));
  loss_of(emb(ids_of({5, 6, 5, 1}, {4}))).backward();  // the second counted call, its gradient still pending
  EXPECT_EQ(values(emb.counts), (std::vector<double>{1, 1, 0, 0, 0, 3, 3, 0}));
  (void)emb(ids_of({2}, {1}));  // a gradient is pending: the rebalance waits
  EXPECT_EQ(rebalances, 0);
  EXPECT_GE(emb.slot_of(0), 0);
  emb.zero_grad();
  (void)emb(ids_of({2}, {1}));  // now it runs, before this call's lookup
  EXPECT_EQ(rebalances, 1);
  EXPECT_GE(emb.slot_of(5), 0);
  EXPECT_GE(emb.slot_of(6), 0);
  EXPECT_LT(emb.slot_of(0), 0);
  EXPECT_EQ(bytes_of(emb.table()), bytes_of(before));  // values moved, not changed
  emb.zero_grad();
  for (int i = 0; i < 5; ++i) (void)emb(ids_of({2, 2, 2, 2}, {4}));  // once only: no second automatic rebalance
  EXPECT_EQ(rebalances, 1);
  EXPECT_LT(emb.slot_of(2), 0);
}

TEST(HybridEmbedding, AStateSavedWhileCountingResumesTheCountingPhase) {
  // Saved after 1 of 3 counted calls: the loaded table rebalances after 2 more calls, as the saving one does.
  manual_seed(17);
  nn::HybridEmbedding a(8, 2, {.hot_rows = 2, .count_batches = 3});
  (void)a(ids_of({5, 5, 6}, {3}));
  const nn::StateDict sd = a.state_dict();
  EXPECT_EQ(sd[3].second.item<int64_t>(), 1);
  manual_seed(18);
  nn::HybridEmbedding b(8, 2, {.hot_rows = 2, .count_batches = 3});
  (void)b(ids_of({1, 1, 1}, {3}));
  (void)b(ids_of({1, 1, 1}, {3}));  // two calls of its own, forgotten by the load
  b.load_state_dict(sd);
  for (nn::HybridEmbedding* e : {&a, &b}) {
    (void)(*e)(ids_of({6, 7}, {2}));
    (void)(*e)(ids_of({7}, {1}));
    EXPECT_GE(e->slot_of(0), 0);  // three calls counted, the rebalance waits for the next call
    (void)(*e)(ids_of({0}, {1}));
    EXPECT_LT(e->slot_of(0), 0);
    EXPECT_GE(e->slot_of(5), 0);
    EXPECT_GE(e->slot_of(6), 0);
  }
  EXPECT_EQ(bytes_of(b.table()), bytes_of(a.table()));
  EXPECT_EQ(b.state_dict()[3].second.item<int64_t>(), -1);
  // A state without "calls_counted" (an older one) keeps its saved placement: the counting phase ends.
  nn::HybridEmbedding c(8, 2, {.hot_rows = 2, .count_batches = 3});
  nn::StateDict old = sd;
  old.pop_back();
  c.load_state_dict(old, /*strict=*/false);
  EXPECT_EQ(c.state_dict()[3].second.item<int64_t>(), -1);
  // A bad value is refused before anything changes.
  nn::StateDict bad = sd;
  bad[3].second = internal::full({}, -2, {.dtype = DType::Int64});
  expect_error([&] { c.load_state_dict(bad); }, {"\"calls_counted\" is -2", "or -1 once the counting phase is over"});
  bad[3].second = internal::full({}, 1.5);
  expect_error([&] { c.load_state_dict(bad); }, {"\"calls_counted\" must be an integer"});
}

TEST(HybridEmbedding, RebalanceMovesOnlyTheRowsThatChangeTierAndCarriesTheirState) {
  manual_seed(7);
  auto emb = scattered(3);  // hot: 2, 4, 7, 9
  // Per-row companions of the tiers, as an optimizer's state: copies of the tiers' values, and a step counter.
  std::map<std::string, Tensor> hot_state{{"exp_avg", emb.hot.detach().clone()},
                                          {"step", internal::scalar_tensor(3.0)}};
  std::map<std::string, Tensor> cold_state{{"exp_avg", emb.cold.detach().clone()},
                                           {"step", internal::scalar_tensor(3.0)}};
  emb.on_rebalance = [&](const nn::RowSwaps& s) { emb.swap_state_rows(s, hot_state, cold_state); };
  (void)emb(ids_of({0, 0, 0, 2, 2, 1, 1, 5, 5, 5, 7, 7}, {12}));  // with the frequencies: 7 (11), 2 (10), 9, 0|5
  const Tensor before_table = emb.table();
  std::vector<int64_t> before_slot;
  for (int64_t r = 0; r < 10; ++r) before_slot.push_back(emb.slot_of(r));
  const nn::RowSwaps swaps = emb.rebalance();
  // Scores: 7: 9 + 2, 2: 8 + 2, 9: 7, 4: 5, 5: 1 + 3, 0: 0 + 3 -> hot 7, 2, 9, 4: nothing moves.
  EXPECT_EQ(swaps.size(), 0);
  (void)emb(ids_of({0, 0, 0, 5, 5, 5, 5, 5, 5, 5, 5, 5}, {12}));  // 0: 6, 5: 13 -> hot 5, 7, 2, 9; 4 leaves
  const nn::RowSwaps swaps2 = emb.rebalance();
  ASSERT_EQ(swaps2.size(), 1);
  EXPECT_EQ(values(swaps2.hot_slots), std::vector<double>{1});   // row 4's hot slot
  EXPECT_EQ(values(swaps2.cold_slots), std::vector<double>{3});  // row 5's cold slot (cold rows 0, 1, 3, 5, ...)
  EXPECT_EQ(emb.slot_of(5), 1);
  EXPECT_EQ(emb.slot_of(4), -4);
  for (int64_t r : {0, 1, 2, 3, 6, 7, 8, 9}) EXPECT_EQ(emb.slot_of(r), before_slot[r]) << r;
  EXPECT_EQ(bytes_of(emb.table()), bytes_of(before_table));
  // The state followed its rows; the counter stayed.
  EXPECT_EQ(bytes_of(hot_state["exp_avg"]), bytes_of(emb.hot));
  EXPECT_EQ(bytes_of(cold_state["exp_avg"]), bytes_of(emb.cold));
  EXPECT_EQ(values(hot_state["step"]), std::vector<double>{3});
  // A pending gradient refuses a rebalance; a state on one side only refuses to move.
  loss_of(emb(ids_of({1}, {1}))).backward();
  expect_error([&] { emb.rebalance(); }, {"HybridEmbedding::rebalance", "still holds a gradient", "zero_grad"});
  std::map<std::string, Tensor> lone{{"exp_avg", emb.hot.detach().clone()}}, none;
  expect_error([&] { emb.swap_state_rows(swaps2, lone, none); }, {"\"exp_avg\"", "no counterpart in the cold"});
}

TEST(HybridEmbedding, StateDictPresentsOneLogicalTable) {
  manual_seed(8);
  auto emb = scattered();
  (void)emb(ids_of({1, 1, 9}, {3}));
  const nn::StateDict sd = emb.state_dict();
  ASSERT_EQ(sd.size(), 4u);
  EXPECT_EQ(sd[0].first, "weight");
  EXPECT_EQ(sd[0].second.shape(), (Shape{10, 3}));
  EXPECT_TRUE(sd[0].second.is_cpu());
  EXPECT_EQ(bytes_of(sd[0].second), bytes_of(emb.table()));
  EXPECT_EQ(sd[1].first, "slot");
  EXPECT_EQ(sd[2].first, "counts");
  EXPECT_EQ(values(sd[2].second), (std::vector<double>{0, 2, 0, 0, 0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(sd[3].first, "calls_counted");  // no counting phase: -1
  EXPECT_EQ(sd[3].second.shape(), Shape{});
  EXPECT_EQ(sd[3].second.item<int64_t>(), -1);
  // Row 7 of the logical table is hot slot 2.
  EXPECT_EQ(bytes_of(sd[0].second.select(0, 7)), bytes_of(emb.hot.select(0, 2)));
  // Inside a model, under its name; parameters() still lists the tiers (what optimizers update).
  nn::Sequential seq{std::make_shared<nn::HybridEmbedding>(6, 2, nn::HybridEmbeddingOptions{.hot_rows = 2})};
  std::vector<std::string> names;
  for (const auto& [name, t] : seq.state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.slot", "0.counts", "0.calls_counted"}));
  names.clear();
  for (const auto& [name, t] : seq.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.hot", "0.cold"}));
}

TEST(HybridEmbedding, StateDictLoadsIntoAnotherPlacement) {
  manual_seed(9);
  auto a = scattered();
  (void)a(ids_of({1, 1, 9, 0}, {4}));
  manual_seed(10);
  nn::HybridEmbedding b(10, 3, {.hot_rows = 4});  // rows 0..3 hot, other values
  ASSERT_NE(bytes_of(b.table()), bytes_of(a.table()));
  b.load_state_dict(a.state_dict());
  for (int64_t r = 0; r < 10; ++r) EXPECT_EQ(b.slot_of(r), a.slot_of(r)) << r;
  EXPECT_EQ(bytes_of(b.hot), bytes_of(a.hot));
  EXPECT_EQ(bytes_of(b.cold), bytes_of(a.cold));
  EXPECT_EQ(bytes_of(b.counts), bytes_of(a.counts));
  const Tensor ids = ids_of({0, 9, 4, 7, 7, 1}, {3, 2});
  EXPECT_EQ(bytes_of(b(ids)), bytes_of(a(ids)));
  // A state with the table only (a plain Embedding's) keeps the placement and scatters the rows into it.
  manual_seed(11);
  nn::HybridEmbedding c(10, 3, {.hot_rows = 4});
  nn::Embedding plain(10, 3);
  const auto result = c.load_state_dict(plain.state_dict(), /*strict=*/false);
  EXPECT_EQ(result.missing_keys, (std::vector<std::string>{"slot", "counts", "calls_counted"}));
  EXPECT_EQ(c.slot_of(0), 0);
  EXPECT_EQ(bytes_of(c.table()), bytes_of(plain.weight));
}

TEST(HybridEmbedding, LoadTakesTheGivenTableInPiecesInAnyDtypeAndLayout) {
  // Rows of 16.8 MB: the tiers are written from the given table 3 rows (64 MiB) at a time, so the 5 cold rows take two
  // pieces. The table is given as Float64 columns 1..D of a (V, D + 1) tensor: read as it is, cast on the way.
  constexpr int64_t d = 4'200'000;
  manual_seed(15);
  nn::HybridEmbedding a(7, d, {.hot_rows = 2, .frequencies = make({0, 3, 0, 1, 0, 9, 0}, {7})});  // rows 5, 1 hot
  const Tensor given = cat({zeros({7, 1}), a.table()}, 1).to(DType::Float64).narrow(1, 1, d);     // (V, D), strided
  ASSERT_FALSE(given.is_contiguous());
  const std::vector<uint8_t> given_before = bytes_of(given);
  manual_seed(16);
  nn::HybridEmbedding b(7, d, {.hot_rows = 2});  // rows 0, 1 hot, other values
  const auto result = b.load_state_dict(
      {{"weight", given}, {"slot", a.slot}, {"counts", a.counts}, {"calls_counted", a.state_dict()[3].second}});
  EXPECT_TRUE(result.missing_keys.empty());
  EXPECT_EQ(b.slot_of(5), a.slot_of(5));
  EXPECT_EQ(bytes_of(b.hot), bytes_of(a.hot));    // Float64 of Float32 values casts back exactly
  EXPECT_EQ(bytes_of(b.cold), bytes_of(a.cold));  // five rows, two pieces
  EXPECT_EQ(bytes_of(given), given_before);       // the given table is read, not written
  EXPECT_EQ(b.cold.dtype(), DType::Float32);
}

TEST(HybridEmbedding, BadSavedPlacementsAreRefusedAndChangeNothing) {
  manual_seed(12);
  auto emb = scattered();
  const Tensor before = emb.table();
  nn::StateDict sd = emb.state_dict();
  sd[1].second = make({0, 1, 2, 3, -1, -2, -3, -4, -5, -5}, {10}, {.dtype = DType::Int64});  // cold slot 4 twice
  expect_error(
      [&] { emb.load_state_dict(sd); },
      {"HybridEmbedding.load_state_dict", "\"slot\" is not a placement of 10 rows with 4 hot", "row 9", "taken twice"});
  sd[1].second = make({0, 1, 2, 3, 4, -1, -2, -3, -4, -5}, {10}, {.dtype = DType::Int64});  // 5 hot
  expect_error([&] { emb.load_state_dict(sd); }, {"the saved table has 5 hot rows, this one 4", "hot_rows = 5"});
  sd[1].second = make({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {10});  // floats
  expect_error([&] { emb.load_state_dict(sd); }, {"\"slot\" must hold integers"});
  EXPECT_EQ(bytes_of(emb.table()), bytes_of(before));
  EXPECT_EQ(emb.slot_of(7), 2);
}

// A small model holding a hybrid table: the checkpoint's model part stores the logical table.
struct Recommender : nn::Module {
  nn::Handle<nn::HybridEmbedding> emb;
  nn::Handle<nn::Linear> head;
  explicit Recommender(nn::HybridEmbeddingOptions o) : Module("Recommender") {
    emb = register_module("emb", nn::HybridEmbedding(12, 4, std::move(o)));
    head = register_module("head", nn::Linear(4, 2));
  }
  Tensor forward(const Tensor& ids) override { return head(emb(ids)); }
};

TEST(HybridEmbedding, CheckpointRoundTripThroughIo) {
  TempFolder dir;
  manual_seed(13);
  Recommender a({.hot_rows = 3, .frequencies = make(uniform(12, 0, 1, 5), {12})});
  (void)a(ids_of({11, 11, 4, 0}, {4}));
  io::save_checkpoint(dir.file("c.h5"), {.model = &a});
  manual_seed(14);
  Recommender b({.hot_rows = 3});
  io::load_checkpoint(dir.file("c.h5"), {.model = &b});
  const Tensor ids = ids_of({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  EXPECT_EQ(bytes_of(b(ids)), bytes_of(a(ids)));
  for (int64_t r = 0; r < 12; ++r) EXPECT_EQ(b.emb->slot_of(r), a.emb->slot_of(r)) << r;
  EXPECT_EQ(bytes_of(b.emb->counts), bytes_of(a.emb->counts));
}

TEST(HybridEmbedding, AFailedLoadLetsGoOfItsStaging) {
  // The table is taken as given (no copy) and held for finish_load_state; when the load fails on another module (the
  // head's shape), nothing is loaded and the table is let go, not kept until the next load.
  manual_seed(15);
  Recommender model({.hot_rows = 3});
  const Tensor before = model.emb->table();
  Tensor weight = make(uniform(12 * 4, -1, 1, 6), {12, 4});
  const long users = weight.impl_ptr().use_count();
  nn::StateDict state = model.state_dict();
  for (auto& [key, t] : state) {
    if (key == "emb.weight") t = weight;
    if (key == "head.weight") t = zeros({3, 4});  // the head is (2, 4)
  }
  expect_error([&] { model.load_state_dict(state); }, {"shape mismatches", "head.weight"});
  EXPECT_EQ(weight.impl_ptr().use_count(), users + 1) << "only the state holds the given table";
  EXPECT_EQ(bytes_of(model.emb->table()), bytes_of(before));
  // A load that succeeds afterwards takes its own values.
  for (auto& [key, t] : state)
    if (key == "head.weight") t = zeros({2, 4});
  model.load_state_dict(state);
  EXPECT_EQ(bytes_of(model.emb->table()), bytes_of(weight));
}

// count_reduction as a second rank would answer it: adds that rank's lookups since the last agreement to a (V) tensor
// (and starts its own again from zero), and 1 to a (1) flag when that rank holds a gradient.
struct OtherRank {
  std::vector<int64_t> pending;  // (V)
  bool holds_gradient = false;
  int reductions = 0;  // how many collectives were asked of it
  std::function<void(Tensor&)> reduction() {
    return [this](Tensor& t) {
      ++reductions;
      int64_t* p = t.data_ptr<int64_t>();
      if (t.numel() == 1) {
        p[0] += holds_gradient ? 1 : 0;
        return;
      }
      for (size_t r = 0; r < pending.size(); ++r) p[r] += std::exchange(pending[r], 0);
    };
  }
};

TEST(HybridEmbedding, ACountReductionAddsEveryRanksLookupsOnce) {
  manual_seed(20);
  nn::HybridEmbedding emb(6, 2, {.hot_rows = 2});
  OtherRank other{.pending = {0, 0, 0, 0, 4, 1}};
  emb.count_reduction = other.reduction();
  (void)emb(ids_of({3, 3, 5}, {3}));
  EXPECT_EQ(values(emb.counts), std::vector<double>(6, 0.0));  // pending until the ranks agree
  emb.agree_counts();
  EXPECT_EQ(values(emb.counts), (std::vector<double>{0, 0, 0, 2, 4, 2}));
  emb.agree_counts();  // nothing new on either rank: nothing added
  EXPECT_EQ(values(emb.counts), (std::vector<double>{0, 0, 0, 2, 4, 2}));
  other.pending[1] = 5;
  const Tensor before = emb.table();
  (void)emb.rebalance();  // agrees first: 1 (5) and 4 (4) hot
  EXPECT_EQ(values(emb.counts), (std::vector<double>{0, 5, 0, 2, 4, 2}));
  EXPECT_GE(emb.slot_of(1), 0);
  EXPECT_GE(emb.slot_of(4), 0);
  EXPECT_EQ(bytes_of(emb.table()), bytes_of(before));
  emb.eval();
  (void)emb(ids_of({0}, {1}));  // not counted
  emb.train();
  emb.agree_counts();
  EXPECT_EQ(values(emb.counts), (std::vector<double>{0, 5, 0, 2, 4, 2}));
  // Loaded counts stand for every rank's: the lookups pending before the load are dropped.
  const nn::StateDict saved = emb.state_dict();
  (void)emb(ids_of({0, 0}, {2}));
  emb.load_state_dict(saved);
  emb.agree_counts();
  EXPECT_EQ(values(emb.counts), (std::vector<double>{0, 5, 0, 2, 4, 2}));
  // Without a reduction the lookups go to counts again, with those still pending.
  (void)emb(ids_of({2}, {1}));
  emb.count_reduction = nullptr;
  (void)emb(ids_of({2}, {1}));
  EXPECT_EQ(values(emb.counts), (std::vector<double>{0, 5, 1, 2, 4, 2}));
  emb.agree_counts();
  EXPECT_EQ(values(emb.counts), (std::vector<double>{0, 5, 2, 2, 4, 2}));
}

TEST(HybridEmbedding, WithACountReductionTheRanksDecideTogetherWhenToRebalance) {
  manual_seed(21);
  nn::HybridEmbedding emb(6, 2, {.hot_rows = 2, .count_batches = 1});
  OtherRank other{.pending = std::vector<int64_t>(6, 0), .holds_gradient = true};
  emb.count_reduction = other.reduction();
  int rebalances = 0;
  emb.on_rebalance = [&](const nn::RowSwaps&) { ++rebalances; };
  (void)emb(ids_of({4, 5}, {2}));  // the counted call
  (void)emb(ids_of({4}, {1}));     // due, but the other rank holds a gradient: both wait
  EXPECT_EQ(rebalances, 0);
  other.holds_gradient = false;
  emb.eval();
  const int asked = other.reductions;
  (void)emb(ids_of({4}, {1}));  // an evaluation (perhaps on one rank only) neither rebalances nor asks the ranks
  EXPECT_EQ(rebalances, 0);
  EXPECT_EQ(other.reductions, asked);
  emb.train();
  (void)emb(ids_of({4}, {1}));
  EXPECT_EQ(rebalances, 1);
  EXPECT_GE(emb.slot_of(4), 0);
  EXPECT_GE(emb.slot_of(5), 0);
  EXPECT_EQ(values(emb.counts), (std::vector<double>{0, 0, 0, 0, 2, 1}));  // the call at which it waited too
  other.holds_gradient = true;
  expect_error([&] { (void)emb.rebalance(); },
               {"HybridEmbedding::rebalance: a tier still holds a gradient on another rank", "on every rank"});
}

TEST(HybridEmbedding, ACountReductionThatChangesTheTensorIsRefused) {
  nn::HybridEmbedding emb(6, 2, {.hot_rows = 2});
  emb.count_reduction = [](Tensor&) {};  // one rank: the sum is its own
  (void)emb(ids_of({1}, {1}));
  emb.count_reduction = [](Tensor& t) { t = internal::zeros({3}, {.dtype = DType::Int64}); };
  expect_error([&] { emb.agree_counts(); },
               {"HybridEmbedding (6 rows): count_reduction was given the counts pending since the last agreement",
                "shape [6] Int64 on the CPU", "gave back shape [3] int64 on cpu", "sum the tensor over the ranks"});
  emb.count_reduction = [](Tensor& t) { t = t.to(DType::Float64); };
  expect_error([&] { emb.agree_counts(); }, {"gave back shape [6] float64"});
  emb.count_reduction = [](Tensor& t) { t = Tensor(); };
  expect_error([&] { (void)emb.rebalance(); },
               {"the flag of the ranks whose tiers hold a gradient", "gave back an undefined tensor"});
  EXPECT_EQ(values(emb.counts), std::vector<double>(6, 0.0));
  // A reduction may give back a new tensor of the same shape: here the other rank looked up what this one did.
  emb.count_reduction = [](Tensor& t) { t = t + t; };
  emb.agree_counts();
  EXPECT_EQ(values(emb.counts), (std::vector<double>{0, 2, 0, 0, 0, 0}));
}

TEST(HybridEmbedding, ToMovesTheHotTierAndCastsBothKeepingThePlacement) {
  manual_seed(16);
  auto emb = scattered();
  const Tensor before = emb.table();
  emb.to(Device::cpu(), DType::Float64);
  EXPECT_EQ(emb.hot.dtype(), DType::Float64);
  EXPECT_EQ(emb.cold.dtype(), DType::Float64);
  EXPECT_TRUE(emb.cold.is_cpu());
  EXPECT_EQ(emb.slot.dtype(), DType::Int64);  // integer buffers keep their dtype and stay on the CPU
  EXPECT_EQ(emb.counts.dtype(), DType::Int64);
  EXPECT_EQ(emb.slot_of(7), 2);
  EXPECT_EQ(bytes_of(emb.table()), bytes_of(before.to(DType::Float64)));
  const Tensor out = emb(ids_of({7, 0}, {2}));
  EXPECT_EQ(out.dtype(), DType::Float64);
  loss_of(out).backward();
  EXPECT_EQ(autograd::sparse_grad(emb.cold)->values.dtype(), DType::Float64);
}

TEST(HybridEmbedding, EmptyIdsGiveAnEmptyResult) {
  auto emb = scattered();
  const Tensor out = emb(ids_of({}, {2, 0}));
  EXPECT_EQ(out.shape(), (Shape{2, 0, 3}));
  loss_of(out).backward();
  EXPECT_EQ(autograd::sparse_grad(emb.hot)->nnz(), 0);  // both tiers take a gradient on every call, as one table
  EXPECT_EQ(autograd::sparse_grad(emb.cold)->nnz(), 0);
}

TEST(HybridEmbedding, BadIdsNameTheTableAndTheId) {
  auto emb = scattered();
  expect_error(
      [&] {
        (void)emb(ids_of({1, 10}, {2}));
      },
      {"HybridEmbedding (10 x 3 table)", "id 10 at position 1", "out of range [0, 10)"});
  expect_error([&] { (void)emb(ids_of({-1}, {1})); }, {"HybridEmbedding", "id -1 at position 0"});
  expect_error([&] { (void)emb(make({1.0}, {1})); }, {"HybridEmbedding: expected integer ids", "float32"});
  EXPECT_EQ(values(emb.counts), std::vector<double>(10, 0.0));  // nothing counted
}

TEST(HybridEmbedding, BadIdsNameTheTableByItsPlaceInTheModel) {
  // As DLRM: the tables in a ModuleList "tables" inside the model.
  auto tables = nn::make<nn::ModuleList>();
  tables->push_back(std::make_shared<nn::HybridEmbedding>(4, 2)).push_back(scattered());
  nn::Sequential model;
  model.append("tables", tables);
  auto emb = tables->at<nn::HybridEmbedding>(1);
  expect_error(
      [&] {
        (void)emb(ids_of({1, 10}, {2}));
      },
      {"HybridEmbedding \"tables.1\" (10 x 3 table)", "id 10 at position 1", "out of range [0, 10)"});
  expect_error([&] { (void)emb(ids_of({-1}, {1})); }, {"HybridEmbedding \"tables.1\" (10 x 3 table)", "id -1"});
  expect_error([&] { (void)tables->at<nn::HybridEmbedding>(0)(ids_of({4}, {1})); },
               {"HybridEmbedding \"tables.0\" (4 x 2 table)", "id 4 at position 0"});
  EXPECT_EQ(values(emb->counts), std::vector<double>(10, 0.0));  // nothing counted
}

TEST(HybridEmbedding, BadOptionsAreRefused) {
  expect_error([] { nn::HybridEmbedding(10, 3, {.hot_rows = 11}); },
               {"HybridEmbedding: hot_rows 11 is out of range for 10 rows", "[0, 10]"});
  expect_error([] { nn::HybridEmbedding(10, 3, {.hot_rows = -2}); }, {"hot_rows -2 is out of range"});
  expect_error([] { nn::HybridEmbedding(10, 3, {.hot_fraction = 1.5}); }, {"hot_fraction 1.5 is outside [0, 1]"});
  expect_error([] { nn::HybridEmbedding(10, 3, {.frequencies = zeros({9})}); },
               {"HybridEmbedding: frequencies of shape [9] for a table of 10 rows", "shape [10]"});
  expect_error([] { nn::HybridEmbedding(2, 3, {.frequencies = zeros({2, 1})}); }, {"frequencies of shape [2, 1]"});
  expect_error(
      [] {
        nn::HybridEmbedding(2, 3, {.frequencies = make({1, -1}, {2})});
      },
      {"frequencies[1] is -1", "finite and non-negative"});
  expect_error([] { nn::HybridEmbedding(10, 3, {.count_batches = -1}); }, {"count_batches must be >= 0"});
  expect_error([] { nn::HybridEmbedding(0, 3); }, {"num_embeddings and embedding_dim must be positive"});
}

}  // namespace
}  // namespace kiln::testing
