// Gradients of the indexing ops (index_select, gather, the scatter family, index_add, masked_select,
// embedding, sort, topk, tril, triu) and of cat and stack: gradcheck for each, repeated indices where
// gradients add up, ties for sort, and hand-derived values.
#include <gtest/gtest.h>

#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

Tensor index(const std::vector<double>& v, const Shape& shape, Device device = Device::cpu()) {
  return make(v, shape, {.dtype = DType::Int64, .device = device});
}

Tensor strided_input(const Shape& shape, uint64_t seed = 7) {
  return non_contiguous(make_input(shape, -1, 1, seed).detach()).requires_grad_();
}

// ---------------------------------------------------------------- gradcheck

TEST(IndexGrad, IndexSelectAndGather) {
  auto select = [](int64_t dim) {
    return [dim](const TensorList& in) { return TensorList{kiln::index_select(in[0], dim, in[1])}; };
  };
  check_gradients(select(0), {make_input({4, 3}), index({2, 0, 2}, {3})});  // row 2 read twice
  check_gradients(select(-1), {strided_input({2, 3}), index({1}, {1})});
  check_gradients(select(0), {make_input({4}), index({3}, {})});  // 0-d index
  auto gather = [](int64_t dim) {
    return [dim](const TensorList& in) { return TensorList{kiln::gather(in[0], dim, in[1])}; };
  };
  check_gradients(gather(1), {make_input({3, 4}), index({0, 0, 1, 3, 3, 2}, {3, 2})});
  check_gradients(gather(0), {strided_input({3, 2}), index({2, 0, 2, 2}, {2, 2})});
}

TEST(IndexGrad, ScatterFamily) {
  // Distinct positions per row; src (2, 3) larger than the index (2, 2): its third column gets nothing.
  const Tensor idx = index({0, 2, 3, 1}, {2, 2});
  check_gradients([](const TensorList& in) { return TensorList{kiln::scatter(in[0], 1, in[1], in[2])}; },
                  {make_input({3, 4}), idx, make_input({2, 3}, -1, 1, 9)});
  check_gradients([](const TensorList& in) { return TensorList{kiln::scatter(in[0], -1, in[1], Scalar(2.5))}; },
                  {strided_input({3, 4}), idx});
  // scatter_add accumulates: repeated positions are fine.
  const Tensor rep = index({0, 0, 1, 1}, {2, 2});
  check_gradients([](const TensorList& in) { return TensorList{kiln::scatter_add(in[0], 0, in[1], in[2])}; },
                  {make_input({3, 2}), rep, make_input({2, 2}, -1, 1, 9)});
  // In place, into a non-leaf copy of the input.
  check_gradients(
      [](const TensorList& in) {
        Tensor a = in[0] * 1.0;
        kiln::scatter_(a, 1, in[1], in[2]);
        return TensorList{a};
      },
      {make_input({3, 4}), idx, make_input({2, 2}, -1, 1, 9)});
  check_gradients(
      [](const TensorList& in) {
        Tensor a = in[0] * 2.0;
        kiln::scatter_add_(a, 0, in[1], in[2]);
        return TensorList{a * a};
      },
      {make_input({3, 2}), rep, make_input({2, 2}, -1, 1, 9)});
}

TEST(IndexGrad, IndexAddMaskedSelectEmbedding) {
  check_gradients([](const TensorList& in) { return TensorList{kiln::index_add(in[0], 0, in[1], in[2])}; },
                  {make_input({4, 2}), index({1, 3, 1}, {3}), make_input({3, 2}, -1, 1, 9)});
  check_gradients([](const TensorList& in) { return TensorList{kiln::index_add(in[0], -1, in[1], in[2])}; },
                  {strided_input({2, 3}), index({2}, {1}), make_input({2, 1}, -1, 1, 9)});
  // The mask broadcasts over a's rows, and a broadcasts over the mask's rows.
  const Tensor row_mask = make({1, 0, 1}, {3}, {.dtype = DType::Bool});
  check_gradients([](const TensorList& in) { return TensorList{kiln::masked_select(in[0], in[1])}; },
                  {make_input({2, 3}), row_mask});
  const Tensor mask = make({1, 0, 0, 1, 1, 0}, {2, 3}, {.dtype = DType::Bool});
  check_gradients([](const TensorList& in) { return TensorList{kiln::masked_select(in[0], in[1])}; },
                  {make_input({3}), mask});
  check_gradients([](const TensorList& in) { return TensorList{kiln::embedding(in[0], in[1])}; },
                  {make_input({4, 3}), index({0, 3, 3, 1, 0, 0}, {2, 3})});
}

TEST(IndexGrad, SortTopkTriangles) {
  // Distinct values (make_input draws them), so finite differences do not cross a reordering.
  check_gradients([](const TensorList& in) { return TensorList{std::get<0>(kiln::sort(in[0], -1, true))}; },
                  {make_input({2, 4})});
  check_gradients([](const TensorList& in) { return TensorList{std::get<0>(kiln::sort(in[0], 0))}; },
                  {strided_input({3, 2})});
  check_gradients([](const TensorList& in) { return TensorList{std::get<0>(kiln::topk(in[0], 2))}; },
                  {make_input({2, 5})});
  check_gradients([](const TensorList& in) { return TensorList{std::get<0>(kiln::topk(in[0], 2, 0, false))}; },
                  {make_input({3, 2})});
  check_gradients([](const TensorList& in) { return TensorList{kiln::tril(in[0])}; }, {make_input({3, 4})});
  check_gradients([](const TensorList& in) { return TensorList{kiln::tril(in[0], -1)}; }, {make_input({2, 3, 3})});
  check_gradients([](const TensorList& in) { return TensorList{kiln::triu(in[0], 1)}; }, {strided_input({3, 4})});
}

TEST(IndexGrad, CatAndStack) {
  check_gradients(
      [](const TensorList& in) {
        return TensorList{kiln::cat({in[0], in[1], in[2]}, 1)};
      },
      {make_input({2, 1}), make_input({2, 3}, -1, 1, 8), strided_input({2, 2}, 9)});
  check_gradients(
      [](const TensorList& in) {
        return TensorList{kiln::cat({in[0], in[1]}, -2)};
      },
      {make_input({1, 2}), make_input({3, 2}, -1, 1, 8)});
  // A 1-D empty tensor beside 2-D ones is skipped, and gets an empty gradient.
  check_gradients(
      [](const TensorList& in) {
        return TensorList{kiln::cat({in[0], in[1]}, 0)};
      },
      {make_input({0}), make_input({2, 2}, -1, 1, 8)});
  check_gradients(
      [](const TensorList& in) {
        return TensorList{kiln::stack({in[0], in[1]}, 1)};
      },
      {make_input({2, 3}), strided_input({2, 3}, 8)});
  check_gradients(
      [](const TensorList& in) {
        return TensorList{kiln::stack({in[0], in[1], in[0]}, -1)};
      },
      {make_input({2}), make_input({2}, -1, 1, 8)});
}

// ---------------------------------------------------------------- values, names, errors

class IndexGradTest : public BackendTest {};

// index [2, 0, 2]: element 2 is read twice, element 1 never.
TEST_P(IndexGradTest, IndexSelectSumsRepeatedIndices) {
  Tensor a = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor out = kiln::index_select(a, 0, index({2, 0, 2}, {3}, dev()));
  EXPECT_EQ(out.grad_fn()->name(), "IndexSelectBackward");
  (out * make({10, 20, 30}, {3}, opts())).sum().backward();
  expect_values(a.grad(), {3}, {20, 0, 40});
}

// out[i][j] = a[i][index[i][j]]: index [[0, 0], [2, 1]].
TEST_P(IndexGradTest, GatherValues) {
  Tensor a = ones({2, 3}, opts()).requires_grad_();
  Tensor out = kiln::gather(a, 1, index({0, 0, 2, 1}, {2, 2}, dev()));
  EXPECT_EQ(out.grad_fn()->name(), "GatherBackward");
  out.sum().backward();
  expect_values(a.grad(), {2, 3}, {2, 0, 0, 0, 1, 1});
}

// a (2, 3); src (2, 1) written to a[0][1] and a[1][2]: those positions of a get no gradient.
TEST_P(IndexGradTest, ScatterValues) {
  Tensor a = ones({2, 3}, opts()).requires_grad_();
  Tensor src = make({7, 8}, {2, 1}, opts()).requires_grad_();
  Tensor out = kiln::scatter(a, 1, index({1, 2}, {2, 1}, dev()), src);
  EXPECT_EQ(out.grad_fn()->name(), "ScatterBackward");
  expect_values(out, {2, 3}, {1, 7, 1, 1, 1, 8});
  (out * make({1, 2, 3, 4, 5, 6}, {2, 3}, opts())).sum().backward();
  expect_values(a.grad(), {2, 3}, {1, 0, 3, 4, 5, 0});
  expect_values(src.grad(), {2, 1}, {2, 6});

  Tensor b = ones({2, 2}, opts()).requires_grad_();
  Tensor filled = kiln::scatter(b, 0, index({1, 0}, {1, 2}, dev()), Scalar(5));
  filled.sum().backward();
  expect_values(b.grad(), {2, 2}, {1, 0, 0, 1});
}

TEST_P(IndexGradTest, ScatterAddAndIndexAddValues) {
  Tensor a = zeros({3}, opts()).requires_grad_();
  Tensor src = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor out = kiln::scatter_add(a, 0, index({2, 2, 0}, {3}, dev()), src);
  EXPECT_EQ(out.grad_fn()->name(), "ScatterAddBackward");
  (out * make({10, 20, 30}, {3}, opts())).sum().backward();
  expect_values(a.grad(), {3}, {10, 20, 30});
  expect_values(src.grad(), {3}, {30, 30, 10});

  Tensor x = zeros({3, 2}, opts()).requires_grad_();
  Tensor rows = ones({2, 2}, opts()).requires_grad_();
  Tensor y = kiln::index_add(x, 0, index({2, 0}, {2}, dev()), rows);
  EXPECT_EQ(y.grad_fn()->name(), "IndexAddBackward");
  (y * make({1, 2, 3, 4, 5, 6}, {3, 2}, opts())).sum().backward();
  expect_values(x.grad(), {3, 2}, {1, 2, 3, 4, 5, 6});
  expect_values(rows.grad(), {2, 2}, {5, 6, 1, 2});
}

TEST_P(IndexGradTest, InPlaceScatterRecordsOnTheTensor) {
  Tensor x = ones({2, 3}, opts()).requires_grad_();
  Tensor src = make({7, 8}, {2, 1}, opts()).requires_grad_();
  Tensor a = x * 2;
  kiln::scatter_(a, 1, index({0, 1}, {2, 1}, dev()), src);
  EXPECT_EQ(a.grad_fn()->name(), "ScatterBackward");
  expect_values(a, {2, 3}, {7, 2, 2, 2, 8, 2});
  (a * make({1, 2, 3, 4, 5, 6}, {2, 3}, opts())).sum().backward();
  expect_values(x.grad(), {2, 3}, {0, 4, 6, 8, 0, 12});
  expect_values(src.grad(), {2, 1}, {1, 5});

  // A buffer without grad, scattered into from a src with grad, now requires grad.
  Tensor buffer = zeros({3}, opts());
  Tensor s = make({4}, {1}, opts()).requires_grad_();
  kiln::scatter_add_(buffer, 0, index({1}, {1}, dev()), s);
  EXPECT_TRUE(buffer.requires_grad());
  EXPECT_EQ(buffer.grad_fn()->name(), "ScatterAddBackward");
  (buffer * make({1, 2, 3}, {3}, opts())).sum().backward();
  expect_values(s.grad(), {1}, {2});
}

// mask [T, F, T] broadcast over 2 rows selects a[0][0], a[0][2], a[1][0], a[1][2] in that order.
TEST_P(IndexGradTest, MaskedSelectValues) {
  Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts()).requires_grad_();
  Tensor mask = make({1, 0, 1}, {3}, opts(DType::Bool));
  Tensor out = kiln::masked_select(a, mask);
  EXPECT_EQ(out.grad_fn()->name(), "MaskedSelectBackward");
  expect_values(out, {4}, {1, 3, 4, 6});
  (out * make({1, 2, 3, 4}, {4}, opts())).sum().backward();
  expect_values(a.grad(), {2, 3}, {1, 0, 2, 3, 0, 4});
}

// weight (3, 2), index [[0, 2], [0, 0]]: row 0 read three times, row 1 never.
TEST_P(IndexGradTest, EmbeddingValues) {
  Tensor w = make({1, 2, 3, 4, 5, 6}, {3, 2}, opts()).requires_grad_();
  Tensor idx = index({0, 2, 0, 0}, {2, 2}, dev());
  Tensor out = kiln::embedding(w, idx);
  EXPECT_EQ(out.grad_fn()->name(), "EmbeddingBackward");
  EXPECT_EQ(out.shape(), (Shape{2, 2, 2}));
  out.sum().backward();
  expect_values(w.grad(), {3, 2}, {3, 3, 0, 0, 1, 1});
}

// A table with other uses besides its lookups (a tied output layer, a second lookup): the lookups' rows are added
// into the gradient the other uses began (the engine offers it to EmbeddingBackward), and the sum is the same.
// weight (3, 2); index [[0, 2], [0, 0]] reads row 0 three times and row 2 once; (w * c).sum() adds c.
TEST_P(IndexGradTest, EmbeddingAddsIntoTheTablesOtherGradients) {
  Tensor w = make({1, 2, 3, 4, 5, 6}, {3, 2}, opts()).requires_grad_();
  const Tensor c = make({10, 20, 30, 40, 50, 60}, {3, 2}, opts());
  const Tensor idx = index({0, 2, 0, 0}, {2, 2}, dev());
  (kiln::embedding(w, idx).sum() + (w * c).sum()).backward();
  expect_values(w.grad(), {3, 2}, {13, 23, 30, 40, 51, 61});

  // Two lookups of one table (index [1, 1] and [2, 0]) and a product with the table's transpose: the second lookup's
  // rows go into the sum the first and the product began. d/dw of sum(x @ w^T) for x (1, 2) = [1, -1] is each row
  // [1, -1].
  Tensor v = make({1, 2, 3, 4, 5, 6}, {3, 2}, opts()).requires_grad_();
  const Tensor x = make({1, -1}, {1, 2}, opts());
  (kiln::embedding(v, index({1, 1}, {2}, dev())).sum() + kiln::embedding(v, index({2, 0}, {2}, dev())).sum() +
   kiln::matmul(x, kiln::transpose(v, 0, 1)).sum())
      .backward();
  expect_values(v.grad(), {3, 2}, {2, 0, 3, 1, 2, 0});
}

// Stable ascending sort of [1, 1, 0]: values [0, 1, 1] from positions [2, 0, 1]; the tied ones each
// send their gradient to the position they came from.
TEST_P(IndexGradTest, SortWithTiesAndTopk) {
  Tensor a = make({1, 1, 0}, {3}, opts()).requires_grad_();
  auto [values, indices] = kiln::sort(a);
  EXPECT_EQ(values.grad_fn()->name(), "SortBackward");
  EXPECT_FALSE(indices.requires_grad());
  expect_values(indices, {3}, {2, 0, 1});
  (values * make({10, 20, 30}, {3}, opts())).sum().backward();
  expect_values(a.grad(), {3}, {20, 30, 10});

  Tensor b = make({3, 1, 4, 1, 5}, {5}, opts()).requires_grad_();
  auto [top, top_idx] = kiln::topk(b, 2);  // 5 at 4, 4 at 2
  EXPECT_EQ(top.grad_fn()->name(), "TopkBackward");
  EXPECT_FALSE(top_idx.requires_grad());
  (top * make({1, 2}, {2}, opts())).sum().backward();
  expect_values(b.grad(), {5}, {0, 0, 2, 0, 1});
}

TEST_P(IndexGradTest, TrilTriuValues) {
  Tensor a = ones({2, 3}, opts()).requires_grad_();
  Tensor l = kiln::tril(a);
  EXPECT_EQ(l.grad_fn()->name(), "TrilBackward");
  Tensor u = kiln::triu(a, 1);
  EXPECT_EQ(u.grad_fn()->name(), "TriuBackward");
  (l + u * 10).sum().backward();
  expect_values(a.grad(), {2, 3}, {1, 10, 10, 1, 1, 10});
}

TEST_P(IndexGradTest, CatAndStackValues) {
  Tensor a = make({1, 2}, {1, 2}, opts()).requires_grad_();
  Tensor b = make({3, 4, 5, 6}, {2, 2}, opts(DType::Float64)).requires_grad_();
  Tensor c = kiln::cat({a, b}, 0);  // (3, 2), promoted to Float64
  EXPECT_EQ(c.grad_fn()->name(), "CatBackward");
  EXPECT_EQ(c.dtype(), DType::Float64);
  (c * make({1, 2, 3, 4, 5, 6}, {3, 2}, opts(DType::Float64))).sum().backward();
  EXPECT_EQ(a.grad().dtype(), DType::Float32);
  expect_values(a.grad(), {1, 2}, {1, 2});
  expect_values(b.grad(), {2, 2}, {3, 4, 5, 6});

  Tensor x = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor y = make({3, 4}, {2}, opts());  // no grad: gets none
  Tensor s = kiln::stack({x, y}, 1);     // (2, 2): [[1, 3], [2, 4]]
  EXPECT_EQ(s.grad_fn()->name(), "StackBackward");
  (s * make({1, 2, 3, 4}, {2, 2}, opts())).sum().backward();
  expect_values(x.grad(), {2}, {1, 3});
  EXPECT_FALSE(y.grad().defined());
  // Nothing requires grad: nothing recorded.
  EXPECT_EQ(kiln::cat({y, y}).grad_fn(), nullptr);
}

TEST_P(IndexGradTest, Errors) {
  Tensor leaf = zeros({3}, opts()).requires_grad_();
  Tensor src = ones({1}, opts());
  expect_error([&] { kiln::scatter_(leaf, 0, index({1}, {1}, dev()), src); },
               {"scatter_", "leaf that requires grad", "NoGradGuard"});
  expect_error([&] { kiln::scatter_add_(leaf, 0, index({1}, {1}, dev()), src); },
               {"scatter_add_", "leaf that requires grad"});
  Tensor h = leaf * 2;
  Tensor view = h.narrow(0, 0, 2);
  expect_error([&] { kiln::scatter_(view, 0, index({1}, {1}, dev()), src); }, {"scatter_", "view"});

  // The index that gather saved, modified in place before backward.
  Tensor a = ones({2, 2}, opts()).requires_grad_();
  Tensor idx = index({0, 1, 1, 0}, {2, 2}, dev());
  Tensor out = kiln::gather(a, 1, idx);
  kiln::fill_(idx, 0);
  expect_error([&] { out.sum().backward(); }, {"GatherBackward", "modified in place"});
}

KILN_INSTANTIATE_BACKENDS(IndexGradTest);

}  // namespace
}  // namespace kiln::testing
