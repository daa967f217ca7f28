// Views share storage and never copy; reshape copies only when no view exists.
#include "kiln/tensor/owned_split.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::expect_values;

// 0..n-1 as float64 values in `shape`.
Tensor iota(const Shape& shape, const TensorOptions& o) {
  return arange(numel(shape), o).to(DType::Float64).reshape(shape);
}

std::vector<double> range(int n) {
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

class ViewTest : public testing::BackendTest {};

TEST_P(ViewTest, ViewAndReshapeShareStorage) {
  Tensor x = iota({2, 3, 4}, {.device = dev()});
  Tensor v = x.view({6, 4});
  EXPECT_TRUE(v.is_alias_of(x));
  expect_values(v, {6, 4}, range(24));
  expect_values(x.view({-1}), {24}, range(24));
  expect_values(x.view({4, -1}), {4, 6}, range(24));
  EXPECT_TRUE(x.reshape({3, 8}).is_alias_of(x));
  expect_error([&] { x.view({5, -1}); }, {"view", "[5, -1]", "24 elements"});
  expect_error([&] { x.view({-1, -1}); }, {"view", "only one dim can be inferred"});
}

TEST_P(ViewTest, ViewOfNonContiguousNeedsCompatibleStrides) {
  Tensor x = iota({2, 3, 4}, {.device = dev()});
  Tensor t = x.transpose(0, 1);                      // (3, 2, 4), strides (4, 12, 1)
  EXPECT_TRUE(t.view({3, 2, 2, 2}).is_alias_of(x));  // splitting the last dim works
  expect_error([&] { t.view({6, 4}); }, {"view", "not compatible", "reshape"});
  Tensor r = t.reshape({6, 4});  // copies
  EXPECT_FALSE(r.is_alias_of(x));
  std::vector<double> expected;
  for (int j = 0; j < 3; ++j)
    for (int i = 0; i < 2; ++i)
      for (int k = 0; k < 4; ++k) expected.push_back(i * 12 + j * 4 + k);
  expect_values(r, {6, 4}, expected);
}

TEST_P(ViewTest, PermuteTransposeAndT) {
  Tensor x = iota({2, 3, 4}, {.device = dev()});
  Tensor p = x.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Strides{1, 12, 4}));
  std::vector<double> expected;
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) expected.push_back(i * 12 + j * 4 + k);
  expect_values(p, {4, 2, 3}, expected);
  Tensor m = iota({2, 3}, {.device = dev()});
  expect_values(m.t(), {3, 2}, {0, 3, 1, 4, 2, 5});
  expect_values(x.transpose(-1, 0).contiguous().transpose(0, 2), {2, 3, 4}, range(24));
  expect_error([&] { x.permute({0, 1}); }, {"permute", "rank 3"});
  expect_error([&] { x.permute({0, 1, 1}); }, {"permute", "appears twice"});
}

TEST_P(ViewTest, NarrowSliceSelect) {
  Tensor x = iota({4, 5}, {.device = dev()});
  expect_values(x.narrow(1, 1, 2), {4, 2}, {1, 2, 6, 7, 11, 12, 16, 17});
  expect_values(x.slice(0, 1, std::nullopt, 2), {2, 5}, {5, 6, 7, 8, 9, 15, 16, 17, 18, 19});
  expect_values(x.slice(1, -2, std::nullopt), {4, 2}, {3, 4, 8, 9, 13, 14, 18, 19});
  expect_values(x.slice(1, 3, 100), {4, 2}, {3, 4, 8, 9, 13, 14, 18, 19});
  EXPECT_EQ(x.slice(1, 4, 2).numel(), 0);
  expect_values(x.select(0, -1), {5}, {15, 16, 17, 18, 19});
  expect_values(x[1][2], {}, {7});
  expect_error([&] { x.select(0, 4); }, {"select", "index 4", "size 4"});
  expect_error([&] { x.narrow(1, 3, 3); }, {"narrow", "out of bounds"});
  expect_error([&] { x.slice(0, 0, 2, 0); }, {"slice", "step must be positive"});
}

TEST_P(ViewTest, ExpandSqueezeUnsqueezeFlatten) {
  Tensor x = iota({3, 1}, {.device = dev()});
  Tensor e = x.expand({2, 3, 4});
  EXPECT_EQ(e.strides(), (Strides{0, 1, 0}));
  std::vector<double> expected;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 4; ++k) expected.push_back(i);
  expect_values(e, {2, 3, 4}, expected);
  expect_values(x.expand({-1, 2}), {3, 2}, {0, 0, 1, 1, 2, 2});
  expect_error([&] { x.expand({2, 4}); }, {"expand", "must be 1", "[3, 1]"});
  EXPECT_EQ(x.unsqueeze(0).shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(x.unsqueeze(-1).shape(), (Shape{3, 1, 1}));
  EXPECT_EQ(x.squeeze().shape(), (Shape{3}));
  EXPECT_EQ(x.squeeze(0).shape(), (Shape{3, 1}));  // size 3: unchanged
  EXPECT_EQ(x.squeeze(1).shape(), (Shape{3}));
  Tensor y = iota({2, 3, 4}, {.device = dev()});
  EXPECT_EQ(y.flatten().shape(), (Shape{24}));
  EXPECT_EQ(y.flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(y.flatten(0, 1).shape(), (Shape{6, 4}));
  EXPECT_EQ(y.unflatten(2, {2, -1}).shape(), (Shape{2, 3, 2, 2}));
  EXPECT_EQ(full({}, 1.0, opts()).flatten().shape(), (Shape{1}));
  expect_error([&] { y.unsqueeze(4); }, {"unsqueeze", "dim 4"});
}

TEST_P(ViewTest, SplitChunkUnbindDiagonal) {
  Tensor x = iota({5, 2}, {.device = dev()});
  auto parts = x.split(2);
  ASSERT_EQ(parts.size(), 3u);
  expect_values(parts[2], {1, 2}, {8, 9});
  auto chunks = x.chunk(2, 0);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].size(0), 3);
  EXPECT_EQ(chunks[1].size(0), 2);
  auto rows = unbind(x, 1);
  ASSERT_EQ(rows.size(), 2u);
  expect_values(rows[1], {5}, {1, 3, 5, 7, 9});
  auto sized = split_with_sizes(x, {1, 4});
  expect_values(sized[0], {1, 2}, {0, 1});
  expect_error([&] { split_with_sizes(x, {1, 3}); }, {"split_with_sizes", "add up to 4", "size 5"});
  Tensor m = iota({3, 4}, {.device = dev()});
  expect_values(m.diagonal(), {3}, {0, 5, 10});
  expect_values(m.diagonal(1), {3}, {1, 6, 11});
  expect_values(m.diagonal(-1), {2}, {4, 9});
}

// internal::split_owned: pieces with storages of their own where nothing else holds the tensor, views otherwise.
TEST_P(ViewTest, SplitOwnedGivesDisjointPiecesOfATensorNothingElseHolds) {
  Tensor x = iota({5, 2}, {.device = dev()});
  const char* base = static_cast<const char*>(x.data_ptr());
  std::vector<Tensor> parts = internal::split_owned(std::move(x), {2, 0, 3});
  ASSERT_EQ(parts.size(), 3u);
  expect_values(parts[0], {2, 2}, {0, 1, 2, 3});
  EXPECT_EQ(parts[1].shape(), (Shape{0, 2}));
  expect_values(parts[2], {3, 2}, {4, 5, 6, 7, 8, 9});
  // The same memory, no copy, each piece with a storage of its own that covers its rows only.
  EXPECT_EQ(static_cast<const char*>(parts[0].data_ptr()), base);
  EXPECT_EQ(static_cast<const char*>(parts[2].data_ptr()), base + 4 * sizeof(double));
  EXPECT_FALSE(parts[0].is_alias_of(parts[2]));
  EXPECT_EQ(parts[2].impl().storage()->nbytes(), 6 * sizeof(double));
  EXPECT_FALSE(parts[2].impl().is_view());
  // A write to one piece leaves the other as it was.
  parts[0].fill_(-1.0);
  expect_values(parts[2], {3, 2}, {4, 5, 6, 7, 8, 9});
  parts[0] = Tensor();  // the memory stays while a piece holds it
  expect_values(parts[2], {3, 2}, {4, 5, 6, 7, 8, 9});

  // Held elsewhere too (or a view, or not contiguous): views of it.
  Tensor y = iota({4, 2}, {.device = dev()});
  Tensor other = y;
  std::vector<Tensor> views = internal::split_owned(std::move(y), {1, 3});
  EXPECT_TRUE(views[0].is_alias_of(other));
  EXPECT_TRUE(views[1].is_alias_of(other));
  expect_values(views[1], {3, 2}, {2, 3, 4, 5, 6, 7});
  std::vector<Tensor> of_t = internal::split_owned(iota({2, 3}, {.device = dev()}).t(), {1, 2});
  EXPECT_TRUE(of_t[0].is_alias_of(of_t[1]));
  expect_values(of_t[1], {2, 2}, {1, 4, 2, 5});
  expect_error(
      [&] {
        internal::split_owned(iota({3, 2}, {.device = dev()}), {1, 1});
      },
      {"split_owned", "2 rows in all", "3 rows"});
}

TEST_P(ViewTest, AsStridedIsBoundsChecked) {
  Tensor x = iota({6}, {.device = dev()});
  expect_values(x.as_strided({2, 2}, {3, 1}), {2, 2}, {0, 1, 3, 4});
  expect_values(x.as_strided({2}, {2}, 1), {2}, {1, 3});
  expect_error([&] { x.as_strided({3, 3}, {3, 1}); }, {"as_strided", "storage holds 6"});
}

TEST_P(ViewTest, WritesThroughViewsReachTheBase) {
  Tensor x = zeros({3, 3}, opts());
  Tensor col = x.select(1, 2);
  col.fill_(5);
  x.diagonal().fill_(1);
  expect_values(x, {3, 3}, {1, 0, 5, 0, 1, 5, 0, 0, 1});
  expect_error([&] { x.select(0, 0).unsqueeze(0).expand({4, 3}).fill_(2); }, {"fill_", "one memory location"});
}

TEST_P(ViewTest, ContiguousAndClone) {
  Tensor x = iota({2, 3}, {.device = dev()});
  EXPECT_TRUE(x.contiguous().is_same(x));
  Tensor t = x.t().contiguous();
  EXPECT_TRUE(t.is_contiguous());
  expect_values(t, {3, 2}, {0, 3, 1, 4, 2, 5});
  Tensor c = x.clone();
  EXPECT_FALSE(c.is_alias_of(x));
  c.fill_(0);
  expect_values(x, {2, 3}, range(6));
  Tensor img = iota({2, 3, 4, 5}, {.device = dev()});
  Tensor cl = img.contiguous(MemoryFormat::ChannelsLast);
  EXPECT_TRUE(cl.is_contiguous(MemoryFormat::ChannelsLast));
  expect_values(cl, {2, 3, 4, 5}, range(120));
  EXPECT_TRUE(cl.clone().is_contiguous(MemoryFormat::ChannelsLast));  // Preserve
  expect_values(cl.contiguous(), {2, 3, 4, 5}, range(120));
}

TEST_P(ViewTest, VersionCounterCountsWritesThroughViews) {
  Tensor x = zeros({4}, opts());
  const uint64_t v0 = x.impl().storage()->version();
  x.narrow(0, 0, 2).fill_(1);
  EXPECT_EQ(x.impl().storage()->version(), v0 + 1);
  x.copy_(ones({4}, opts()));
  EXPECT_EQ(x.impl().storage()->version(), v0 + 2);
}

KILN_INSTANTIATE_BACKENDS(ViewTest);

}  // namespace
}  // namespace kiln
