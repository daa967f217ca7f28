// Row-sparse gradients (kiln/autograd/sparse_grad.h): nn::Embedding({.sparse = true}) against the dense path and a
// float64 reference computed here, duplicates, the padding row, accumulation over backward calls, coalesce and
// to_dense, zero_grad, and the refusals.
#include <gtest/gtest.h>

#include <map>

#include "kiln/autograd/sparse_grad.h"
#include "kiln/kiln.h"

namespace {

using namespace kiln;

std::vector<double> values_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu(), DType::Float64).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}
std::vector<int64_t> ints_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu(), DType::Int64).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// The gradient of sum(w[ids] * c) with respect to w, by hand: row r gets c[i, :] for every lookup i of r.
std::map<int64_t, std::vector<double>> reference_rows(const std::vector<int64_t>& ids, const std::vector<double>& c,
                                                      int64_t d, std::optional<int64_t> padding = {}) {
  std::map<int64_t, std::vector<double>> rows;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (padding && ids[i] == *padding) continue;
    auto& row = rows.try_emplace(ids[i], std::vector<double>(static_cast<size_t>(d), 0.0)).first->second;
    for (int64_t j = 0; j < d; ++j)
      row[static_cast<size_t>(j)] += c[i * static_cast<size_t>(d) + static_cast<size_t>(j)];
  }
  return rows;
}

TEST(SparseGrad, EmbeddingGivesTheLookedUpRowsSummedAsTheReference) {
  const int64_t v = 10, d = 3;
  auto emb = nn::make<nn::Embedding>(v, d, nn::EmbeddingOptions{.sparse = true});
  emb->to(DType::Float64);
  const std::vector<int64_t> ids{4, 1, 4, 9, 1, 4};  // rows 1 and 4 repeated
  const Tensor index = from_vector(ids, {2, 3});
  const Tensor c = randn({2, 3, d}, {.dtype = DType::Float64});
  sum(emb(index) * c).backward();
  EXPECT_FALSE(emb->weight.grad().defined());
  const SparseRowGrad* g = autograd::sparse_grad(emb->weight);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->nnz(), 6);  // one row per lookup until coalesced
  EXPECT_FALSE(g->coalesced);
  EXPECT_EQ(g->dense_shape, (Shape{v, d}));
  const SparseRowGrad merged = g->coalesce();
  EXPECT_TRUE(merged.coalesced);
  EXPECT_EQ(ints_of(merged.indices), (std::vector<int64_t>{1, 4, 9}));
  const auto expected = reference_rows(ids, values_of(c), d);
  const std::vector<double> got = values_of(merged.values);
  size_t k = 0;
  for (const auto& [row, want] : expected) {
    for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(got[k * d + j], want[static_cast<size_t>(j)], 1e-12) << "row " << row;
    ++k;
  }
}

TEST(SparseGrad, ToDenseEqualsTheDenseEmbeddingsGradient) {
  manual_seed(7);
  const Tensor index = from_vector(std::vector<int64_t>{0, 5, 5, 2, 7, 0, 7, 7}, {4, 2});
  const Tensor c = randn({4, 2, 4}, {.dtype = DType::Float64});
  auto sparse = nn::make<nn::Embedding>(8, 4, nn::EmbeddingOptions{.sparse = true});
  auto dense = nn::make<nn::Embedding>(8, 4);
  sparse->to(DType::Float64);
  dense->to(DType::Float64);
  {
    NoGradGuard no_grad;
    dense->weight.copy_(sparse->weight);
  }
  const Tensor ys = sparse(index), yd = dense(index);
  EXPECT_EQ(values_of(ys), values_of(yd));  // the same forward
  sum(ys * c).backward();
  sum(yd * c).backward();
  const std::vector<double> a = values_of(autograd::sparse_grad(sparse->weight)->to_dense());
  const std::vector<double> b = values_of(dense->weight.grad());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-12) << i;
}

TEST(SparseGrad, PaddingRowLookupsAreLeftOut) {
  auto emb = nn::make<nn::Embedding>(6, 2, nn::EmbeddingOptions{.padding_idx = 0, .sparse = true});
  const std::vector<int64_t> ids{0, 3, 0, 5};
  sum(emb(from_vector(ids, {4})) * 2.0).backward();
  const SparseRowGrad* g = autograd::sparse_grad(emb->weight);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(ints_of(g->indices), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(values_of(g->values), (std::vector<double>{2, 2, 2, 2}));
}

TEST(SparseGrad, BackwardCallsAccumulateByAppendingRows) {
  auto emb = nn::make<nn::Embedding>(5, 2, nn::EmbeddingOptions{.sparse = true});
  sum(emb(from_vector(std::vector<int64_t>{1, 2}, {2}))).backward();
  sum(emb(from_vector(std::vector<int64_t>{2, 4}, {2})) * 3.0).backward();
  const SparseRowGrad* g = autograd::sparse_grad(emb->weight);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(ints_of(g->indices), (std::vector<int64_t>{1, 2, 2, 4}));
  const SparseRowGrad c = g->coalesce();
  EXPECT_EQ(ints_of(c.indices), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(values_of(c.values), (std::vector<double>{1, 1, 4, 4, 3, 3}));
  // Coalescing again changes nothing.
  EXPECT_EQ(values_of(c.coalesce().values), values_of(c.values));
}

TEST(SparseGrad, ZeroGradClearsIt) {
  auto emb = nn::make<nn::Embedding>(5, 2, nn::EmbeddingOptions{.sparse = true});
  sum(emb(from_vector(std::vector<int64_t>{1}, {1}))).backward();
  ASSERT_TRUE(autograd::has_sparse_grad(emb->weight));
  emb->zero_grad();
  EXPECT_FALSE(autograd::has_sparse_grad(emb->weight));
  sum(emb(from_vector(std::vector<int64_t>{1}, {1}))).backward();
  optim::SGD opt(emb->parameters(), {.lr = 0.1});
  opt.zero_grad(/*set_to_none=*/false);
  EXPECT_FALSE(autograd::has_sparse_grad(emb->weight));
}

TEST(SparseGrad, Refusals) {
  // A table computed by an op cannot take sparse gradients: they accumulate into a leaf.
  Tensor w = randn({4, 2}).requires_grad_();
  const Tensor index = from_vector(std::vector<int64_t>{1}, {1});
  try {
    (void)nn::embedding(index, w * 2.0, std::nullopt, /*sparse=*/true);
    FAIL() << "expected a kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be a leaf"), std::string::npos) << e.what();
  }
  // Dense and sparse gradients do not mix on one parameter.
  sum(nn::embedding(index, w)).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_THROW(sum(nn::embedding(index, w, std::nullopt, true)).backward(), Error);
  // Shapes, dtypes and devices are checked.
  Tensor p = randn({4, 2});
  EXPECT_THROW(autograd::set_sparse_grad(p, {from_vector(std::vector<int64_t>{0}, {1}), randn({1, 3}), {4, 3}}), Error);
  EXPECT_THROW(autograd::set_sparse_grad(p, {from_vector(std::vector<int64_t>{0}, {1}), randn({2, 2}), {4, 2}}), Error);
  EXPECT_THROW(autograd::set_sparse_grad(
                   p, {from_vector(std::vector<int64_t>{0}, {1}), randn({1, 2}, {.dtype = DType::Float64}), {4, 2}}),
               Error);
  // A row index outside the table is named when the gradient is coalesced.
  const SparseRowGrad bad{from_vector(std::vector<int64_t>{7}, {1}), randn({1, 2}), {4, 2}};
  try {
    (void)bad.coalesce();
    FAIL() << "expected a kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row index 7"), std::string::npos) << e.what();
  }
  // Out-of-range ids are refused at the lookup, as for dense tables.
  auto emb = nn::make<nn::Embedding>(4, 2, nn::EmbeddingOptions{.sparse = true});
  EXPECT_THROW((void)emb(from_vector(std::vector<int64_t>{4}, {1})), Error);
  EXPECT_THROW((void)emb(from_vector(std::vector<int64_t>{-1}, {1})), Error);
}

}  // namespace
