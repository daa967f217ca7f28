// Conformance tests of the indexing ops: index_select, gather, scatter family, index_add, masked_select,
// nonzero, one_hot, embedding, cat, stack, sort, argsort, topk, tril, triu. References are hand-derived
// values or plain loops written here.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kiln/tensor/backend.h"  // detail::IndexOpScope: the name a bad index's error gives
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::expect_values;
using testing::kFloatTypes;
using testing::kInf;
using testing::kNaN;
using testing::make;
using testing::uniform;

class IndexTest : public testing::BackendTest {
 protected:
  Tensor idx(const std::vector<double>& v, const Shape& shape, DType dtype = DType::Int64) const {
    return make(v, shape, opts(dtype));
  }
};
class SortTest : public testing::BackendTest {};

// 0, 1, 2, ... as doubles.
std::vector<double> iota(int64_t n, double start = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<double>(i);
  return v;
}

const std::vector<DType> kValueDTypes = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                         DType::Int32,   DType::Int64,   DType::UInt8};

// ---------------------------------------------------------------- index_select, embedding

TEST_P(IndexTest, IndexSelectAlongEachDim) {
  // a = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
  for (DType dt : kValueDTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    const Tensor a = make(iota(12), {3, 4}, opts(dt));
    expect_values(internal::index_select(a, 0, idx({2, 0, 2}, {3})), {3, 4}, {8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
    expect_values(internal::index_select(a, -1, idx({3, 1}, {2}, DType::Int32)), {3, 2}, {3, 1, 7, 5, 11, 9});
    expect_values(internal::index_select(testing::non_contiguous(a), 1, idx({0, 0}, {2})), {3, 2}, {0, 0, 4, 4, 8, 8});
    expect_values(internal::index_select(a.t(), 0, idx({1}, {1})), {1, 3}, {1, 5, 9});
  }
  const Tensor b = make({1, 0, 1, 1}, {2, 2}, opts(DType::Bool));
  expect_values(internal::index_select(b, 0, idx({1, 0}, {2})), {2, 2}, {1, 1, 1, 0});
  // 0-d index, empty index, 0-d input
  const Tensor a = make(iota(6), {2, 3}, opts());
  expect_values(internal::index_select(a, 1, idx({2}, {})), {2, 1}, {2, 5});
  expect_values(internal::index_select(a, 0, internal::empty({0}, opts(DType::Int64))), {0, 3}, {});
  expect_values(internal::index_select(make({7}, {}, opts()), 0, idx({0}, {1})), {}, {7});
  // a strided index
  expect_values(internal::index_select(a, 1, testing::non_contiguous(idx({2, 1}, {2}))), {2, 2}, {2, 1, 5, 4});
}

TEST_P(IndexTest, IndexSelectLargeRows) {
  // Many rows: the kernel spreads rows over threads; check every element.
  const int64_t rows = 3000, cols = 17, picks = 2500;
  const Tensor a = make(iota(rows * cols), {rows, cols}, opts(DType::Float64));
  std::vector<double> index(picks), want;
  for (int64_t i = 0; i < picks; ++i) {
    index[i] = static_cast<double>((i * 7919) % rows);
    for (int64_t j = 0; j < cols; ++j) want.push_back(index[i] * cols + j);
  }
  expect_values(internal::index_select(a, 0, idx(index, {picks})), {picks, cols}, want);
}

TEST_P(IndexTest, IndexSelectErrors) {
  const Tensor a = make(iota(6), {3, 2}, opts());
  expect_error(
      [&] {
        internal::index_select(a, 0, idx({0, 3}, {2})).cpu();  // on a GPU the error surfaces at the copy back
      },
      {"index_select", "index 3", "out of range", "dim 0", "0 <= index < 3"});
  expect_error([&] { internal::index_select(a, 1, idx({-1}, {1})).cpu(); },
               {"index_select", "index -1", "0 <= index < 2"});
  expect_error([&] { internal::index_select(a, 0, make({0}, {1}, opts())); }, {"index_select", "Int64", "float32"});
  expect_error([&] { internal::index_select(a, 0, idx({0, 1}, {1, 2})); }, {"index_select", "1-D", "[1, 2]"});
  expect_error([&] { internal::index_select(a, 2, idx({0}, {1})); }, {"index_select", "dim 2"});
  expect_error(
      [&] {
        internal::index_select(internal::empty({0, 2}, opts()), 0, idx({0}, {1}));
      },
      {"index_select", "size 0"});
}

TEST_P(IndexTest, Embedding) {
  // weight (4, 3): row r = [10r, 10r + 1, 10r + 2]
  std::vector<double> w;
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) w.push_back(10 * r + c);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float64}) {
    const Tensor weight = make(w, {4, 3}, opts(dt));
    expect_values(internal::embedding(weight, idx({3, 0, 0, 2}, {2, 2})), {2, 2, 3},
                  {30, 31, 32, 0, 1, 2, 0, 1, 2, 20, 21, 22});
    expect_values(internal::embedding(weight, idx({1}, {}, DType::Int32)), {3}, {10, 11, 12});
  }
  const Tensor weight = make(w, {4, 3}, opts());
  expect_values(internal::embedding(weight, internal::empty({2, 0}, opts(DType::Int64))), {2, 0, 3}, {});
  expect_error(
      [&] {
        internal::embedding(weight, idx({1, 4}, {2})).cpu();
      },
      {"embedding", "index 4", "0 <= index < 4"});
  expect_error([&] { internal::embedding(make(w, {12}, opts()), idx({1}, {1})); }, {"embedding", "2-D", "[12]"});
  expect_error([&] { internal::embedding(weight, make({1}, {1}, opts())); }, {"embedding", "Int64", "float32"});
}

// Lookups of whole rows of every width: rows of 16-byte multiples (copied 16 bytes at a time on a GPU) and others,
// from a table whose rows are further apart than their width (a narrowed table), with repeated and scattered indices.
TEST_P(IndexTest, EmbeddingRowsOfEveryWidth) {
  const int64_t v = 50, n = 37;
  std::vector<double> index(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) index[static_cast<size_t>(i)] = static_cast<double>((i * 13 + 7) % v);
  index[5] = index[6] = 49;
  for (int64_t d : {1, 3, 4, 300, 768}) {
    for (DType dt : {DType::Float32, DType::BFloat16, DType::Float64, DType::UInt8}) {
      SCOPED_TRACE(::testing::Message() << dt << ", width " << d);
      std::vector<double> w(static_cast<size_t>(v * (d + 4)));
      for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<double>(i % 251);
      const Tensor table = internal::narrow(make(w, {v, d + 4}, opts(dt)), 1, 0, d);  // rows d + 4 apart
      std::vector<double> want;
      for (double r : index)
        for (int64_t c = 0; c < d; ++c) want.push_back(w[static_cast<size_t>(static_cast<int64_t>(r) * (d + 4) + c)]);
      expect_values(internal::embedding(table, idx(index, {n})), {n, d}, want);
    }
  }
}

// A bad index's error names the op the user called: the outermost detail::IndexOpScope (a module opens one with its
// table's name), on every backend (the CPU's at the call, a GPU's at the copy back); ops inside keep that name.
TEST_P(IndexTest, TheOutermostIndexOpScopeNamesABadIndex) {
  const Tensor weight = internal::ones({4, 3}, opts());
  const std::string table = "Embedding \"tables.3\" (4 x 3 table)";
  {
    detail::IndexOpScope scope(table);
    EXPECT_EQ(detail::IndexOpScope::current(), table);
    {
      detail::IndexOpScope inner("embedding");
      EXPECT_EQ(detail::IndexOpScope::current(), table);  // the outer name is kept
    }
    expect_error(
        [&] {
          (void)internal::embedding(weight, idx({0, 4}, {2})).cpu();
        },
        {"Embedding \"tables.3\" (4 x 3 table): index 4 is out of range", "size 4"});
    expect_error(
        [&] {
          (void)internal::index_add(internal::zeros({2, 2}, opts()), 0, idx({-1}, {1}), internal::ones({1, 2}, opts()))
              .cpu();
        },
        {"Embedding \"tables.3\" (4 x 3 table): index -1 is out of range", "size 2"});
  }
  EXPECT_EQ(detail::IndexOpScope::current(), "");
  // Outside every scope: the op called (embedding, index_add), on the CPU as on a GPU.
  expect_error([&] { (void)internal::embedding(weight, idx({4}, {1})).cpu(); }, {"embedding: index 4", "size 4"});
  expect_error(
      [&] {
        (void)internal::index_add(internal::zeros({2, 2}, opts()), 0, idx({2}, {1}), internal::ones({1, 2}, opts()))
            .cpu();
      },
      {"index_add: index 2", "size 2"});
}

// ---------------------------------------------------------------- gather, scatter, index_add

TEST_P(IndexTest, GatherAlongDims) {
  // a = [[1, 2], [3, 4]]; torch.gather(a, 1, [[0, 0], [1, 0]]) = [[1, 1], [4, 3]]
  for (DType dt : kValueDTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    const Tensor a = make({1, 2, 3, 4}, {2, 2}, opts(dt));
    expect_values(internal::gather(a, 1, idx({0, 0, 1, 0}, {2, 2})), {2, 2}, {1, 1, 4, 3});
    expect_values(internal::gather(a, 0, idx({1, 0, 0, 0}, {2, 2})), {2, 2}, {3, 2, 1, 2});
  }
  // The index may be smaller than the input outside dim, and larger along dim.
  const Tensor a = make(iota(12), {3, 4}, opts());
  expect_values(internal::gather(a, 1, idx({3, 3, 3, 0, 1, 2}, {2, 3})), {2, 3}, {3, 3, 3, 4, 5, 6});
  expect_values(internal::gather(testing::non_contiguous(a), 0, testing::non_contiguous(idx({2, 1, 0, 0}, {1, 4}))),
                {1, 4}, {8, 5, 2, 3});
  expect_values(internal::gather(a.t(), 1, idx({2, 0}, {2, 1})), {2, 1}, {8, 1});  // a.t() (4, 3)
  // 0-d
  expect_values(internal::gather(make({5}, {}, opts()), 0, idx({0}, {})), {}, {5});
}

TEST_P(IndexTest, GatherErrors) {
  const Tensor a = make(iota(6), {2, 3}, opts());
  expect_error(
      [&] {
        internal::gather(a, 1, idx({0, 5}, {1, 2})).cpu();
      },
      {"gather", "index 5", "dim 1", "0 <= index < 3"});
  expect_error([&] { internal::gather(a, 1, idx({0, 1}, {2})); }, {"gather", "rank", "[2]", "[2, 3]"});
  expect_error(
      [&] {
        internal::gather(a, 1, idx({0, 0, 0}, {3, 1}));
      },
      {"gather", "[3, 1]", "[2, 3]", "dim 0", "3 > 2"});
  expect_error([&] { internal::gather(a, 0, make({0, 0}, {1, 2}, opts(DType::UInt8))); }, {"gather", "Int64", "uint8"});
}

TEST_P(IndexTest, ScatterAssignsAndAccumulates) {
  for (DType dt : kValueDTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    const Tensor a = internal::zeros({3, 4}, opts(dt));
    // src (2, 5) is larger than index (2, 3): only its leading (2, 3) block is used.
    const Tensor src = make(iota(10, 1), {2, 5}, opts(dt));
    const Tensor index = idx({0, 1, 2, 2, 0, 1}, {2, 3});
    // dim 0: out[index[i][j]][j] = src[i][j]
    expect_values(internal::scatter(a, 0, index, src), {3, 4}, {1, 7, 0, 0, 0, 2, 8, 0, 6, 0, 3, 0});
    // scatter_add with duplicates along dim 1: row i gets src[i][j] added at column index[i][j]
    const Tensor dup = idx({1, 1, 3, 0, 0, 0}, {2, 3});
    expect_values(internal::scatter_add(a, 1, dup, src), {3, 4}, {0, 3, 0, 3, 6 + 7 + 8, 0, 0, 0, 0, 0, 0, 0});
  }
  // scalar source, Int32 index, non-contiguous self
  const Tensor base = testing::non_contiguous(make(iota(6), {2, 3}, opts()));
  expect_values(internal::scatter(base, 1, idx({2, 0}, {2, 1}, DType::Int32), 9.5), {2, 3}, {0, 1, 9.5, 9.5, 4, 5});
  // bool scatter
  expect_values(internal::scatter(internal::zeros({3}, opts(DType::Bool)), 0, idx({2}, {1}), true), {3}, {0, 0, 1});
}

TEST_P(IndexTest, ScatterInPlace) {
  Tensor a = internal::ones({2, 3}, opts());
  const Tensor src = make(iota(6, 10), {2, 3}, opts());
  Tensor& r = internal::scatter_(a, 1, idx({2, 1, 0, 2}, {2, 2}), src);
  EXPECT_TRUE(r.is_same(a));
  expect_values(a, {2, 3}, {1, 11, 10, 13, 1, 14});
  internal::scatter_add_(a, 0, idx({1, 1, 1}, {1, 3}), src);
  expect_values(a, {2, 3}, {1, 11, 10, 23, 12, 26});
  // Writing into a view writes through to its base.
  Tensor base = internal::zeros({2, 4}, opts());
  Tensor view = base.narrow(1, 1, 2);
  internal::scatter_add_(view, 1, idx({1, 1}, {1, 2}), make({2, 3}, {1, 2}, opts()));
  expect_values(base, {2, 4}, {0, 0, 5, 0, 0, 0, 0, 0});
  // Source aliasing self: values are read before they are overwritten.
  Tensor v = make({1, 2, 3}, {3}, opts());
  internal::scatter_(v, 0, idx({2, 1, 0}, {3}), v);
  expect_values(v, {3}, {3, 2, 1});
  // An expanded (stride 0) self cannot be written in place.
  Tensor e = internal::zeros({1, 3}, opts()).expand({2, 3});
  expect_error(
      [&] {
        internal::scatter_(e, 1, idx({0}, {1, 1}), internal::ones({1, 1}, opts()));
      },
      {"scatter_", "stride 0"});
}

TEST_P(IndexTest, ScatterAddLargeIsExactAndDeterministic) {
  // (64, 2048) updates into (8, 2048) along dim 0: many duplicates per column, spread over threads.
  const int64_t steps = 64, cols = 2048, rows = 8;
  std::vector<double> index(steps * cols), src(steps * cols), want(rows * cols, 0.0);
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t r = (t * 3 + c) % rows;
      index[t * cols + c] = static_cast<double>(r);
      src[t * cols + c] = static_cast<double>((t + c) % 5);
      want[r * cols + c] += src[t * cols + c];
    }
  for (DType dt : {DType::Float32, DType::Int64}) {
    const Tensor out = internal::scatter_add(internal::zeros({rows, cols}, opts(dt)), 0, idx(index, {steps, cols}),
                                             make(src, {steps, cols}, opts(dt)));
    expect_values(out, {rows, cols}, want);
  }
}

TEST_P(IndexTest, ScatterErrors) {
  const Tensor a = internal::zeros({2, 3}, opts());
  expect_error(
      [&] {
        internal::scatter(a, 1, idx({3}, {1, 1}), internal::ones({1, 1}, opts())).cpu();
      },
      {"scatter", "index 3", "dim 1", "0 <= index < 3"});
  expect_error(
      [&] {
        internal::scatter_add(a, 0, idx({-2}, {1, 1}), internal::ones({1, 1}, opts())).cpu();
      },
      {"scatter_add", "index -2", "0 <= index < 2"});
  expect_error(
      [&] {
        internal::scatter(a, 1, idx({0}, {1, 1}), internal::ones({1, 1}, opts(DType::Float64)));
      },
      {"scatter", "dtype", "float32", "float64"});
  expect_error(
      [&] {
        internal::scatter(a, 1, idx({0, 0}, {1, 2}), internal::ones({1, 1}, opts()));
      },
      {"scatter", "[1, 2]", "src", "[1, 1]"});
  expect_error([&] { internal::scatter(a, 1, idx({0}, {1}), internal::ones({1}, opts())); },
               {"scatter", "rank", "[1]", "[2, 3]"});
  expect_error([&] { internal::scatter(a, 1, idx({0, 0, 0}, {3, 1}), 1.0); }, {"scatter", "[3, 1]", "dim 0", "3 > 2"});
  expect_error(
      [&] {
        internal::scatter_add(a, 1, make({0}, {1, 1}, opts()), internal::ones({1, 1}, opts()));
      },
      {"scatter_add", "Int64", "float32"});
}

TEST_P(IndexTest, IndexAdd) {
  // a (3, 2) of ones; add rows of src at rows [2, 0, 2]
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Int32}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const Tensor a = internal::ones({3, 2}, opts(dt));
    const Tensor src = make(iota(6, 1), {3, 2}, opts(dt));  // [[1, 2], [3, 4], [5, 6]]
    expect_values(internal::index_add(a, 0, idx({2, 0, 2}, {3}), src), {3, 2}, {4, 5, 1, 1, 7, 9});
    // dim 1: columns [1, 1] of a (2, 2)
    expect_values(internal::index_add(internal::zeros({2, 2}, opts(dt)), 1, idx({1, 1}, {2}, DType::Int32),
                                      make({1, 2, 3, 4}, {2, 2}, opts(dt))),
                  {2, 2}, {0, 3, 0, 7});
  }
  const Tensor a = internal::ones({3, 2}, opts());
  expect_error(
      [&] {
        internal::index_add(a, 0, idx({0, 1}, {2}), internal::ones({3, 2}, opts()));
      },
      {"index_add", "[3, 2]", "expected [2, 2]"});
  expect_error(
      [&] {
        internal::index_add(a, 0, idx({5}, {1}), internal::ones({1, 2}, opts())).cpu();
      },
      {"index_add", "index 5"});
  // In place: into a tensor with two elements at one address (expanded) it refuses, and leaves the tensor as it was.
  Tensor row = internal::ones({1, 2}, opts());
  Tensor expanded = internal::expand(row, {3, 2});
  expect_error(
      [&] {
        internal::index_add_(expanded, 0, idx({0}, {1}), internal::ones({1, 2}, opts()));
      },
      {"index_add_", "one memory location"});
  expect_values(row, {1, 2}, {1, 1});
  // Its arguments are checked as index_add's.
  Tensor b = internal::ones({3, 2}, opts());
  expect_error(
      [&] {
        internal::index_add_(b, 0, idx({0, 1}, {2}), internal::ones({3, 2}, opts()));
      },
      {"index_add", "[3, 2]", "expected [2, 2]"});
  expect_values(b, {3, 2}, {1, 1, 1, 1, 1, 1});
}

// index_add of many rows, as an embedding's gradient adds them: runs of one index (a token-type table's rows), an index
// that cycles (positions), and scattered ones, with rows wider than one block of columns and not a multiple of it.
// Integer values, so that every order of addition gives the same sums; the reference is a loop in float64.
TEST_P(IndexTest, IndexAddOfManyRowsMatchesALoop) {
  const int64_t d = 300, v = 7;
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
    // bfloat16 holds the integers up to 256 exactly: 120 rows of values up to 2.
    const int64_t n = dt == DType::BFloat16 ? 120 : 1000;
    std::vector<double> src(static_cast<size_t>(n * d));
    for (int64_t i = 0; i < n * d; ++i) src[static_cast<size_t>(i)] = static_cast<double>((i * 7 + i / d) % 3);
    const std::vector<std::pair<const char*, std::vector<double>>> patterns = {
        {"one run", std::vector<double>(static_cast<size_t>(n), 3)},
        {"runs of 50",
         [&] {
           std::vector<double> x(static_cast<size_t>(n));
           for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<double>((i / 50) % v);
           return x;
         }()},
        {"cycling",
         [&] {
           std::vector<double> x(static_cast<size_t>(n));
           for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<double>(i % v);
           return x;
         }()},
        {"scattered", [&] {
           std::vector<double> x(static_cast<size_t>(n));
           for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<double>((i * 5 + i * i) % v);
           return x;
         }()}};
    for (const auto& [what, index] : patterns) {
      SCOPED_TRACE(::testing::Message() << dt << ", " << what);
      std::vector<double> want(static_cast<size_t>(v * d), 1.0);  // added into ones
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < d; ++c)
          want[static_cast<size_t>(static_cast<int64_t>(index[static_cast<size_t>(r)]) * d + c)] +=
              src[static_cast<size_t>(r * d + c)];
      Tensor a = internal::ones({v, d}, opts(dt));
      internal::index_add_(a, 0, idx(index, {n}), make(src, {n, d}, opts(dt)));
      expect_values(a, {v, d}, want);
    }
  }
}

// ---------------------------------------------------------------- masks and nonzero

TEST_P(IndexTest, MaskedSelectBroadcasts) {
  const Tensor a = make(iota(6), {2, 3}, opts());
  expect_values(internal::masked_select(a, make({1, 0, 1, 0, 0, 1}, {2, 3}, opts(DType::Bool))), {3}, {0, 2, 5});
  // mask (3,) broadcast over rows
  expect_values(internal::masked_select(a, make({0, 1, 1}, {3}, opts(DType::Bool))), {4}, {1, 2, 4, 5});
  // input broadcast against a larger mask: a (1, 3) with mask (2, 3)
  expect_values(internal::masked_select(make({7, 8, 9}, {1, 3}, opts(DType::Int32)),
                                        make({1, 0, 0, 0, 0, 1}, {2, 3}, opts(DType::Bool))),
                {2}, {7, 9});
  expect_values(internal::masked_select(a, internal::zeros({2, 3}, opts(DType::Bool))), {0}, {});
  expect_values(internal::masked_select(a.t(), make({1, 0, 0, 0, 0, 1}, {3, 2}, opts(DType::Bool))), {2}, {0, 5});
  expect_error(
      [&] {
        internal::masked_select(a, internal::ones({2, 3}, opts()));
      },
      {"masked_select", "Bool", "float32"});
  expect_error([&] { internal::masked_select(a, internal::ones({2}, opts(DType::Bool))); },
               {"masked_select", "[2, 3]", "[2]"});
}

TEST_P(IndexTest, Nonzero) {
  for (DType dt : {DType::Float32, DType::Float16, DType::Int32, DType::Bool, DType::UInt8}) {
    SCOPED_TRACE(::testing::Message() << dt);
    expect_values(internal::nonzero(make({0, 1, 0, 2, 0, 3}, {2, 3}, opts(dt))), {3, 2}, {0, 1, 1, 0, 1, 2});
  }
  expect_values(internal::nonzero(make({0, kNaN, -0.0}, {3}, opts())), {1, 1}, {1});  // NaN is nonzero, -0 is zero
  expect_values(internal::nonzero(make({5}, {}, opts())), {1, 0}, {});
  expect_values(internal::nonzero(make({0}, {}, opts())), {0, 0}, {});
  expect_values(internal::nonzero(internal::zeros({2, 2}, opts())), {0, 2}, {});
  expect_values(internal::nonzero(internal::empty({0, 3}, opts())), {0, 2}, {});
  expect_values(internal::nonzero(make({0, 1, 2, 0}, {2, 2}, opts()).t()), {2, 2}, {0, 1, 1, 0});
  // Large: chunks counted in parallel must still come out in row-major order.
  const int64_t n = 200000;
  std::vector<double> v(n, 0.0), want;
  for (int64_t i = 0; i < n; i += 7) {
    v[i] = 1;
    want.push_back(static_cast<double>(i / 500));
    want.push_back(static_cast<double>(i % 500));
  }
  expect_values(internal::nonzero(make(v, {n / 500, 500}, opts())), {static_cast<int64_t>(want.size() / 2), 2}, want);
}

TEST_P(IndexTest, OneHot) {
  Tensor r = internal::one_hot(idx({2, 0, 1}, {3}), 4);
  EXPECT_EQ(r.dtype(), DType::Int64);
  expect_values(r, {3, 4}, {0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0});
  expect_values(internal::one_hot(idx({1, 0, 3, 1}, {2, 2}, DType::Int32)), {2, 2, 4},
                {0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0});
  expect_values(internal::one_hot(idx({0}, {})), {1}, {1});
  expect_values(internal::one_hot(internal::empty({0}, opts(DType::Int64)), 3), {0, 3}, {});
  expect_error([&] { internal::one_hot(idx({0, -1}, {2}), 3); }, {"one_hot", "non-negative", "-1"});
  expect_error([&] { internal::one_hot(idx({0, 3}, {2}), 3); }, {"one_hot", "3", "num_classes 3"});
  expect_error([&] { internal::one_hot(internal::empty({0}, opts(DType::Int64))); },
               {"one_hot", "empty", "num_classes"});
  expect_error([&] { internal::one_hot(make({1}, {1}, opts())); }, {"one_hot", "Int64", "float32"});
}

// ---------------------------------------------------------------- cat and stack

TEST_P(IndexTest, CatAlongDims) {
  for (DType dt : kValueDTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    const Tensor a = make(iota(4), {2, 2}, opts(dt)), b = make(iota(2, 10), {1, 2}, opts(dt)),
                 c = make(iota(6, 20), {2, 3}, opts(dt));
    expect_values(internal::cat({a, b}, 0), {3, 2}, {0, 1, 2, 3, 10, 11});
    expect_values(internal::cat({a, c, a}, -1), {2, 7}, {0, 1, 20, 21, 22, 0, 1, 2, 3, 23, 24, 25, 2, 3});
    expect_values(internal::cat({testing::non_contiguous(c), a.t()}, 1), {2, 5}, {20, 21, 22, 0, 2, 23, 24, 25, 1, 3});
  }
  // Promotion: int32 with float16 gives float16; int64 with float64 gives float64; bool with uint8 gives uint8
  Tensor p = internal::cat({make({1, 2}, {2}, opts(DType::Int32)), make({0.5}, {1}, opts(DType::Float16))});
  EXPECT_EQ(p.dtype(), DType::Float16);
  expect_values(p, {3}, {1, 2, 0.5});
  EXPECT_EQ(internal::cat({make({1}, {1}, opts(DType::Bool)), make({7}, {1}, opts(DType::UInt8))}).dtype(),
            DType::UInt8);
  // Legacy 1-D empty tensors are skipped whatever the other ranks; zero-size parts are fine.
  expect_values(
      internal::cat({internal::empty({0}, opts()), make(iota(4), {2, 2}, opts()), internal::empty({0, 2}, opts())}, 0),
      {2, 2}, {0, 1, 2, 3});
  expect_values(internal::cat({internal::empty({0}, opts()), internal::empty({0}, opts())}), {0}, {});
  // Channels-last inputs give a channels-last output.
  Tensor x = internal::contiguous(make(iota(16), {1, 4, 2, 2}, opts()), MemoryFormat::ChannelsLast);
  Tensor y = internal::contiguous(make(iota(8, 100), {1, 2, 2, 2}, opts()), MemoryFormat::ChannelsLast);
  Tensor z = internal::cat({x, y}, 1);
  EXPECT_TRUE(z.is_contiguous(MemoryFormat::ChannelsLast));
  std::vector<double> want = iota(16);
  for (double v : iota(8, 100)) want.push_back(v);
  expect_values(z, {1, 6, 2, 2}, want);
  EXPECT_TRUE(internal::cat({x, make(iota(8), {1, 2, 2, 2}, opts())}, 1).is_contiguous());
}

TEST_P(IndexTest, CatErrors) {
  const Tensor a = internal::ones({2, 3}, opts());
  expect_error(
      [&] {
        internal::cat({a, internal::ones({2, 4}, opts())}, 0);
      },
      {"cat", "dim 0", "tensor 0", "[2, 3]", "tensor 1", "[2, 4]", "3 != 4"});
  expect_error(
      [&] {
        internal::cat({a, a, internal::ones({2}, opts())}, 0);
      },
      {"cat", "rank", "tensor 2", "[2]", "[2, 3]"});
  expect_error([&] { internal::cat({a, internal::ones({}, opts())}); }, {"cat", "tensor 1", "0-d"});
  expect_error([&] { internal::cat({}); }, {"cat", "non-empty"});
  expect_error([&] { internal::cat({a}, 2); }, {"cat", "dim 2"});
  expect_error([&] { internal::cat({a, Tensor()}); }, {"cat", "tensor 1", "undefined"});
}

TEST_P(IndexTest, Stack) {
  const Tensor a = make({1, 2, 3}, {3}, opts()), b = make({4, 5, 6}, {3}, opts());
  expect_values(internal::stack({a, b}), {2, 3}, {1, 2, 3, 4, 5, 6});
  expect_values(internal::stack({a, b}, 1), {3, 2}, {1, 4, 2, 5, 3, 6});
  expect_values(internal::stack({a, b}, -1), {3, 2}, {1, 4, 2, 5, 3, 6});
  expect_values(internal::stack({make({1}, {}, opts()), make({2}, {}, opts(DType::Int64))}), {2}, {1, 2});
  expect_values(internal::stack({internal::empty({0}, opts()), internal::empty({0}, opts())}), {2, 0}, {});
  expect_error(
      [&] {
        internal::stack({a, internal::ones({4}, opts())});
      },
      {"stack", "same shape", "[3]", "tensor 1", "[4]"});
  expect_error([&] { internal::stack({a, b}, 2); }, {"stack", "dim 2"});
  expect_error([&] { internal::stack({}); }, {"stack", "non-empty"});
}

// ---------------------------------------------------------------- sort, argsort, topk

TEST_P(SortTest, SortsAscendingAndDescendingStably) {
  for (DType dt :
       {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int32, DType::Int64, DType::UInt8}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const Tensor a = make({3, 1, 2, 1, 3, 0}, {6}, opts(dt));
    auto [v, i] = internal::sort(a);
    expect_values(v, {6}, {0, 1, 1, 2, 3, 3});
    expect_values(i, {6}, {5, 1, 3, 2, 0, 4});  // ties keep their order
    auto [vd, id] = internal::sort(a, 0, /*descending=*/true);
    expect_values(vd, {6}, {3, 3, 2, 1, 1, 0});
    expect_values(id, {6}, {0, 4, 2, 1, 3, 5});
  }
  auto [vb, ib] = internal::sort(make({1, 0, 1, 0}, {4}, opts(DType::Bool)));
  expect_values(vb, {4}, {0, 0, 1, 1});
  expect_values(ib, {4}, {1, 3, 0, 2});
}

TEST_P(SortTest, NaNSortsAsTheLargest) {
  for (DType dt : {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const double inf = std::numeric_limits<double>::infinity();
    const Tensor a = make({kNaN, 1, -inf, kNaN, inf, -2}, {6}, opts(dt));
    auto [v, i] = internal::sort(a);
    expect_values(v, {6}, {-inf, -2, 1, inf, kNaN, kNaN});
    expect_values(i, {6}, {2, 5, 1, 4, 0, 3});
    auto [vd, id] = internal::sort(a, -1, true);
    expect_values(vd, {6}, {kNaN, kNaN, inf, 1, -2, -inf});
    expect_values(id, {6}, {0, 3, 4, 1, 5, 2});
    auto [tv, ti] = internal::topk(a, 2);
    expect_values(tv, {2}, {kNaN, kNaN});
    auto [sv, si] = internal::topk(a, 2, -1, /*largest=*/false);
    expect_values(sv, {2}, {-inf, -2});
    expect_values(si, {2}, {2, 5});
  }
}

TEST_P(SortTest, SortsAlongAnyDimOfStridedInput) {
  // a = [[3, 1, 2], [0, 5, 4]]
  const Tensor a = make({3, 1, 2, 0, 5, 4}, {2, 3}, opts());
  auto [v0, i0] = internal::sort(a, 0);
  expect_values(v0, {2, 3}, {0, 1, 2, 3, 5, 4});
  expect_values(i0, {2, 3}, {1, 0, 0, 0, 1, 1});
  auto [v1, i1] = internal::sort(testing::non_contiguous(a), 1, true);
  expect_values(v1, {2, 3}, {3, 2, 1, 5, 4, 0});
  expect_values(i1, {2, 3}, {0, 2, 1, 1, 2, 0});
  auto [vt, it] = internal::sort(a.t(), 1);  // a.t() = [[3, 0], [1, 5], [2, 4]]
  expect_values(vt, {3, 2}, {0, 3, 1, 5, 2, 4});
  expect_values(it, {3, 2}, {1, 0, 0, 1, 0, 1});
  expect_values(internal::argsort(a, 1), {2, 3}, {1, 2, 0, 0, 2, 1});
  expect_values(internal::argsort(a, 0, true), {2, 3}, {0, 1, 1, 1, 0, 0});
  // 0-d and empty
  auto [vs, is] = internal::sort(make({4}, {}, opts()));
  expect_values(vs, {}, {4});
  expect_values(is, {}, {0});
  expect_values(std::get<0>(internal::sort(internal::empty({0, 3}, opts()), 0)), {0, 3}, {});
  expect_error([&] { internal::sort(a, 2); }, {"sort", "dim 2"});
}

TEST_P(SortTest, ManyRowsSortInParallel) {
  const int64_t rows = 4000, n = 33;
  std::vector<double> a(rows * n), want_v, want_i;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) a[r * n + j] = static_cast<double>((j * 13 + r) % n);  // a permutation per row
    std::vector<double> inv(n);
    for (int64_t j = 0; j < n; ++j) inv[static_cast<int64_t>(a[r * n + j])] = static_cast<double>(j);
    for (int64_t v = 0; v < n; ++v) {
      want_v.push_back(static_cast<double>(v));
      want_i.push_back(inv[v]);
    }
  }
  auto [v, i] = internal::sort(make(a, {rows, n}, opts(DType::Int32)), 1);
  expect_values(v, {rows, n}, want_v);
  expect_values(i, {rows, n}, want_i);
}

TEST_P(SortTest, Topk) {
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int32, DType::Int64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    // a = [[1, 9, 3, 7], [4, 4, 8, 0]]
    const Tensor a = make({1, 9, 3, 7, 4, 4, 8, 0}, {2, 4}, opts(dt));
    auto [v, i] = internal::topk(a, 2);
    expect_values(v, {2, 2}, {9, 7, 8, 4});
    expect_values(i, {2, 2}, {1, 3, 2, 0});  // tie between the two 4s: the first position wins
    auto [vs, is] = internal::topk(a, 3, 1, /*largest=*/false);
    expect_values(vs, {2, 3}, {1, 3, 7, 0, 4, 4});
    expect_values(is, {2, 3}, {0, 2, 3, 3, 0, 1});
    auto [v0, i0] = internal::topk(testing::non_contiguous(a), 1, 0);
    expect_values(v0, {1, 4}, {4, 9, 8, 7});
    expect_values(i0, {1, 4}, {1, 0, 1, 0});
    auto [vall, iall] = internal::topk(a, 4, -1, true, /*sorted=*/false);  // k == size: every element, some order
    EXPECT_EQ(vall.shape(), (Shape{2, 4}));
    // k == size, sorted: the whole row in order, ties by position (as sort gives it).
    auto [vk, ik] = internal::topk(a, 4);
    expect_values(vk, {2, 4}, {9, 7, 3, 1, 8, 4, 4, 0});
    expect_values(ik, {2, 4}, {1, 3, 2, 0, 2, 0, 1, 3});
    auto [vks, iks] = internal::topk(a, 4, -1, /*largest=*/false);
    expect_values(vks, {2, 4}, {1, 3, 7, 9, 0, 4, 4, 8});
    expect_values(iks, {2, 4}, {0, 2, 3, 1, 3, 0, 1, 2});
  }
  const Tensor a = make({1, 2, 3}, {3}, opts());
  auto [v, i] = internal::topk(a, 0);
  expect_values(v, {0}, {});
  expect_values(i, {0}, {});
  expect_values(std::get<0>(internal::topk(make({5}, {}, opts()), 1)), {}, {5});
  expect_error([&] { internal::topk(a, 4); }, {"topk", "k = 4", "size 3"});
  expect_error([&] { internal::topk(a, -1); }, {"topk", "k = -1"});
  expect_error([&] { internal::topk(a, 1, 1); }, {"topk", "dim 1"});
}

// ---------------------------------------------------------------- tril, triu

TEST_P(IndexTest, TrilAndTriu) {
  // a (3, 4) = 1..12
  for (DType dt : {DType::Float32, DType::Float16, DType::Int64, DType::Bool}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const Tensor a = make(iota(12, 1), {3, 4}, opts(dt));
    auto v = [&](std::vector<double> x) {
      if (dt == DType::Bool)
        for (auto& e : x) e = e != 0;
      return x;
    };
    expect_values(internal::tril(a), {3, 4}, v({1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0}));
    expect_values(internal::tril(a, 1), {3, 4}, v({1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12}));
    expect_values(internal::tril(a, -1), {3, 4}, v({0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0}));
    expect_values(internal::triu(a), {3, 4}, v({1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12}));
    expect_values(internal::triu(a, 2), {3, 4}, v({0, 0, 3, 4, 0, 0, 0, 8, 0, 0, 0, 0}));
    expect_values(internal::triu(a, -1), {3, 4}, v({1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12}));
    expect_values(internal::triu(a, 9), {3, 4}, v(std::vector<double>(12, 0)));
    expect_values(internal::tril(a, -9), {3, 4}, v(std::vector<double>(12, 0)));
  }
  // batched and transposed: every matrix of a (2, 2, 2), read through a transpose
  const Tensor b = make(iota(8, 1), {2, 2, 2}, opts()).transpose(1, 2);  // [[1, 3], [2, 4]], [[5, 7], [6, 8]]
  expect_values(internal::tril(b), {2, 2, 2}, {1, 0, 2, 4, 5, 0, 6, 8});
  expect_values(internal::triu(b), {2, 2, 2}, {1, 3, 0, 4, 5, 7, 0, 8});
  expect_values(internal::tril(internal::empty({0, 3}, opts())), {0, 3}, {});
  expect_error([&] { internal::tril(internal::ones({3}, opts())); }, {"tril", "2 dims", "[3]"});
  expect_error([&] { internal::triu(internal::ones({}, opts())); }, {"triu", "2 dims", "[]"});
}

KILN_INSTANTIATE_BACKENDS(IndexTest);
KILN_INSTANTIATE_BACKENDS(SortTest);

// ---------------------------------------------------------------- out-of-range indices on a GPU
// The kernels record a bad index without the host waiting; the error comes at the next index op or
// synchronisation, names the op that launched the kernel, and is raised once.
class CudaIndexErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  }
  const Device gpu = Device::cuda(0);
  Tensor on_gpu(const std::vector<int64_t>& v, const Shape& shape) const {
    return internal::from_vector<int64_t>(v, shape).to(gpu);
  }
  // Waits for the GPU without a synchronising call (which would raise the error itself).
  static void wait_for_gpu() {
    cuda::Event done;
    done.record();
    while (!done.query()) {
    }
  }
};

TEST_F(CudaIndexErrors, TheCallReturnsAndTheCopyBackRaisesIt) {
  const Tensor a = internal::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3}).to(gpu);
  Tensor out;
  ASSERT_NO_THROW(out = internal::gather(a, 1, on_gpu({0, 5}, {1, 2})));
  try {
    (void)out.cpu();
    FAIL() << "expected an IndexError";
  } catch (const IndexError& e) {
    const std::string msg = e.what();
    for (const char* part : {"gather", "index 5", "dim 1", "size 3", "0 <= index < 3", "KILN_CUDA_SYNC_INDEX_CHECKS"})
      EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  }
  // Raised once: the slot is free again, and later index ops work.
  EXPECT_EQ(internal::gather(a, 1, on_gpu({2, 0}, {1, 2})).cpu().to_vector<float>(), (std::vector<float>{2, 0}));
  EXPECT_NO_THROW(cuda::synchronize());
}

TEST_F(CudaIndexErrors, TheNextIndexOpRaisesAnEarlierCallsError) {
  const Tensor a = internal::from_vector<float>({0, 1, 2, 3, 4, 5}, {3, 2}).to(gpu);
  ASSERT_NO_THROW((void)internal::index_select(a, 0, on_gpu({1, 7}, {2})));
  wait_for_gpu();
  expect_error(
      [&] {
        (void)internal::gather(a, 1, on_gpu({0, 0, 0}, {3, 1}));
      },
      {"index_select", "index 7", "dim 0", "size 3"});
  EXPECT_EQ(internal::gather(a, 1, on_gpu({1, 0, 1}, {3, 1})).cpu().to_vector<float>(), (std::vector<float>{1, 2, 5}));
}

TEST_F(CudaIndexErrors, OpsBuiltOnTheKernelsNameThemselves) {
  const Tensor weight = internal::from_vector<float>({0, 1, 2, 3}, {2, 2}).to(gpu);
  EXPECT_THROW(
      {
        (void)internal::embedding(weight, on_gpu({0, 2}, {2}));
        cuda::synchronize();
      },
      IndexError);
  expect_error(
      [&] {
        (void)internal::embedding(weight, on_gpu({-1}, {1}));
        cuda::synchronize();
      },
      {"embedding", "index -1", "size 2"});
  expect_error(
      [&] {
        (void)internal::index_add(internal::zeros({2, 2}, {.device = gpu}), 0, on_gpu({3}, {1}),
                                  internal::ones({1, 2}, {.device = gpu}));
        cuda::Stream::default_stream().synchronize();
      },
      {"index_add", "index 3", "size 2"});
}

TEST_F(CudaIndexErrors, NothingIsWrittenOutsideTheTensor) {
  // out is a view into the middle of a buffer; the bad index would land past its end.
  Tensor buffer = internal::zeros({3, 2}, {.device = gpu});
  Tensor out = buffer.narrow(0, 1, 1);  // row 1
  (void)internal::scatter_(out, 1, on_gpu({0, 2}, {1, 2}), internal::full({1, 2}, 7.0, {.device = gpu}));
  EXPECT_THROW(cuda::synchronize(), IndexError);
  EXPECT_EQ(buffer.cpu().to_vector<float>(), (std::vector<float>{0, 0, 7, 0, 0, 0}));
}

}  // namespace
}  // namespace kiln
