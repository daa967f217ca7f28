// Examples, batches, collation and the per-sample random stream.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using data::Example;

TEST(DataExample, FieldsByNameAndStructuredBinding) {
  Example ex{{"image", internal::full({2, 2}, 1.5)}, {"label", internal::scalar_tensor(int64_t{7})}};
  EXPECT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex["label"].item<int64_t>(), 7);
  auto [image, label] = ex;
  EXPECT_EQ(image.shape(), (Shape{2, 2}));
  EXPECT_EQ(label.item<int64_t>(), 7);
  expect_error([&] { (void)ex["mask"]; }, {"no field named 'mask'", "image, label"});
  expect_error([&] { ex.add("image", internal::zeros({1})); }, {"already there"});
  Example three{{"a", internal::zeros({1})}, {"b", internal::zeros({1})}, {"c", internal::zeros({1})}};
  expect_error(
      [&] {
        auto [a, b] = three;
        (void)a;
        (void)b;
      },
      {"exactly two fields", "a, b, c"});
}

TEST(DataExample, CollateStacksEachField) {
  std::vector<Example> xs;
  for (int i = 0; i < 3; ++i) {
    xs.push_back({{"x", internal::full({2}, double(i))}, {"y", internal::scalar_tensor(int64_t{10 + i})}});
  }
  data::Batch b = data::collate(xs);
  EXPECT_EQ(b.batch_size(), 3);
  EXPECT_EQ(b["x"].shape(), (Shape{3, 2}));
  EXPECT_EQ(b["x"].to_vector<double>(), (std::vector<double>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(b["y"].to_vector<int64_t>(), (std::vector<int64_t>{10, 11, 12}));
  xs[1]["x"] = internal::zeros({3});
  expect_error([&] { data::collate(xs); }, {"field 'x' of sample 1", "[3]", "[2]"});
}

TEST(DataExample, CollatorCopiesEachSampleAsItArrives) {
  // The samples are let go as soon as they are added: the batch holds copies, in order.
  data::Collator c(3, /*pinned=*/false);
  for (int i = 0; i < 3; ++i) {
    // A transposed (non-contiguous) field is stacked as its logical values.
    Tensor m = internal::arange(0.0, 6.0, 1.0).reshape({2, 3}).transpose(0, 1) * double(i + 1);
    c.add({{"m", m}, {"y", internal::scalar_tensor(int64_t{i})}});
    EXPECT_EQ(c.added(), static_cast<size_t>(i + 1));
  }
  data::Batch b = c.finish();
  EXPECT_EQ(b["m"].shape(), (Shape{3, 3, 2}));
  const std::vector<double> m = b["m"].to(DType::Float64).to_vector<double>();
  // Sample i is (i + 1) * [[0, 3], [1, 4], [2, 5]].
  for (int i = 0; i < 3; ++i) {
    const double t[6] = {0, 3, 1, 4, 2, 5};
    for (int k = 0; k < 6; ++k) EXPECT_EQ(m[static_cast<size_t>(i * 6 + k)], (i + 1) * t[k]) << i << " " << k;
  }
  EXPECT_EQ(b["y"].to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
  // Empty again: the next batch may have other shapes.
  EXPECT_EQ(c.added(), 0u);
  c.add({{"m", internal::zeros({4})}, {"y", internal::scalar_tensor(int64_t{5})}});
  expect_error(
      [&] {
        c.add({{"y", internal::scalar_tensor(int64_t{6})}, {"m", internal::zeros({4})}});
      },
      {"sample 1 has fields (y, m) but sample 0 has (m, y)"});
  expect_error(
      [&] {
        c.add({{"m", internal::zeros({4}, {.dtype = DType::Float64})}, {"y", internal::scalar_tensor(int64_t{6})}});
      },
      {"field 'm' of sample 1", "float64", "[4]"});
  expect_error([&] { (void)c.finish(); }, {"a batch of 3 finished after 1 examples"});
  data::Collator one(1);
  one.add({{"x", internal::zeros({1})}});
  expect_error([&] { one.add({{"x", internal::zeros({1})}}); }, {"example 1 added to a batch of 1"});
  expect_error([] { data::Collator none(0); }, {"no examples to stack"});
}

TEST(DataSampleRng, PureFunctionOfSeedEpochIndex) {
  data::SampleRng a(1, 2, 3), b(1, 2, 3), c(1, 3, 3), d(1, 2, 4);
  const double va = a.uniform();
  EXPECT_EQ(va, b.uniform());
  EXPECT_NE(va, c.uniform());
  EXPECT_NE(va, d.uniform());
  // randint is uniform over its range: 6000 draws of 6 values, each close to 1000.
  data::SampleRng r(5, 0, 0);
  std::vector<int> counts(6);
  for (int i = 0; i < 6000; ++i) ++counts[r.randint(6)];
  for (int c6 : counts) EXPECT_NEAR(c6, 1000, 150);
  // Forks are independent of the parent's position and reproducible.
  data::SampleRng p(9, 9, 9);
  p.uniform();
  EXPECT_EQ(p.fork(1).uniform(), data::SampleRng(9, 9, 9).fork(1).uniform());
  EXPECT_NE(p.fork(1).uniform(), p.fork(2).uniform());
}

}  // namespace
}  // namespace kiln::testing
