// SyntheticDataset: fixed samples per (seed, index), the fields asked for, normal floats, labels in range.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/data/datasets/synthetic.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

data::SyntheticOptions options(uint64_t seed) {
  return {.size = 1000,
          .fields = {{"image", {3, 8, 8}, DType::Float32},
                     {"label", {}, DType::Int64, 10},
                     {"tokens", {16}, DType::Int32, 30522},
                     {"pixels", {5}, DType::UInt8},
                     {"mask", {4}, DType::Bool},
                     {"half", {2, 3}, DType::Float16},
                     {"double", {7}, DType::Float64}},
          .seed = seed};
}

TEST(DataSynthetic, FieldsHaveTheShapesAndDTypesAskedFor) {
  data::SyntheticDataset ds(options(1));
  EXPECT_EQ(ds.size(), 1000);
  data::Example ex = ds.sample(3);
  ASSERT_EQ(ex.names(), (std::vector<std::string>{"image", "label", "tokens", "pixels", "mask", "half", "double"}));
  EXPECT_EQ(ex["image"].shape(), (Shape{3, 8, 8}));
  EXPECT_EQ(ex["image"].dtype(), DType::Float32);
  EXPECT_EQ(ex["label"].shape(), Shape{});
  EXPECT_EQ(ex["label"].dtype(), DType::Int64);
  EXPECT_EQ(ex["tokens"].dtype(), DType::Int32);
  EXPECT_EQ(ex["pixels"].dtype(), DType::UInt8);
  EXPECT_EQ(ex["mask"].dtype(), DType::Bool);
  EXPECT_EQ(ex["half"].shape(), (Shape{2, 3}));
  EXPECT_EQ(ex["half"].dtype(), DType::Float16);
  EXPECT_EQ(ex["double"].dtype(), DType::Float64);
  expect_error([&] { ds.sample(1000); }, {"SyntheticDataset", "out of range"});
}

TEST(DataSynthetic, TheSameSampleEveryEpochAndInstanceButNotAcrossIndicesOrSeeds) {
  data::SyntheticDataset a(options(7)), b(options(7)), other_seed(options(8));
  for (int64_t i : {0, 1, 999}) {
    data::Example x = a.sample(i, /*seed=*/0, /*epoch=*/0), y = b.sample(i, /*seed=*/3, /*epoch=*/5);
    for (size_t k = 0; k < x.size(); ++k) EXPECT_EQ(values(x[k]), values(y[k])) << x.names()[k] << " sample " << i;
  }
  EXPECT_NE(values(a.sample(0)["image"]), values(a.sample(1)["image"]));
  EXPECT_NE(values(a.sample(0)["image"]), values(other_seed.sample(0)["image"]));
  EXPECT_NE(values(a.sample(0)["tokens"]), values(other_seed.sample(0)["tokens"]));
  // Two float fields of one sample are different streams.
  data::SyntheticDataset two({.size = 1, .fields = {{"p", {32}}, {"q", {32}}}});
  EXPECT_NE(values(two.sample(0)["p"]), values(two.sample(0)["q"]));
}

TEST(DataSynthetic, FloatsAreStandardNormalAndIntegersUniformBelowTheirBound) {
  data::SyntheticDataset ds({.size = 64, .fields = {{"x", {1 << 14}, DType::Float32}}, .seed = 3});
  double sum = 0, sum2 = 0, sum4 = 0;
  int64_t within1 = 0, within2 = 0, count = 0;
  for (int64_t i = 0; i < ds.size(); ++i)
    for (double v : values(ds.sample(i)["x"])) {
      sum += v;
      sum2 += v * v;
      sum4 += v * v * v * v;
      within1 += std::abs(v) < 1;
      within2 += std::abs(v) < 2;
      ++count;
    }
  const double mean = sum / count, var = sum2 / count - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.01);
  EXPECT_NEAR(sum4 / count, 3.0, 0.06);  // a normal's fourth moment
  EXPECT_NEAR(static_cast<double>(within1) / count, 0.6827, 0.004);
  EXPECT_NEAR(static_cast<double>(within2) / count, 0.9545, 0.003);

  data::SyntheticDataset labels({.size = 20000, .fields = {{"y", {}, DType::Int64, 10}, {"m", {}, DType::Bool}}});
  std::vector<int64_t> hist(10, 0);
  int64_t ones = 0;
  for (int64_t i = 0; i < labels.size(); ++i) {
    data::Example ex = labels.sample(i);
    const int64_t y = ex["y"].item<int64_t>();
    ASSERT_GE(y, 0);
    ASSERT_LT(y, 10);
    ++hist[y];
    ones += ex["m"].item<bool>();
  }
  for (int64_t h : hist) EXPECT_NEAR(h, 2000, 200);
  EXPECT_NEAR(ones, 10000, 400);
  data::SyntheticDataset big({.size = 1, .fields = {{"t", {4096}, DType::Int64, int64_t{1} << 40}}});
  int64_t high = 0;
  for (double v : values(big.sample(0)["t"])) {
    ASSERT_GE(v, 0);
    ASSERT_LT(v, static_cast<double>(int64_t{1} << 40));
    high += v >= static_cast<double>(int64_t{1} << 39);
  }
  EXPECT_NEAR(high, 2048, 200);  // the upper half of a bound past 2^32 is reached
}

TEST(DataSynthetic, BadOptions) {
  expect_error(
      [] {
        data::SyntheticDataset ds({.size = 4, .fields = {{"y", {}, DType::Int64}}});
      },
      {"'y'", "num_classes"});
  expect_error(
      [] {
        data::SyntheticDataset ds({.size = 4, .fields = {{"p", {300}, DType::UInt8, 300}}});
      },
      {"'p'", "300 classes"});
  expect_error(
      [] {
        data::SyntheticDataset ds({.size = 4, .fields = {{"x", {2}}, {"x", {3}}}});
      },
      {"'x'", "already there"});
  expect_error([] { data::SyntheticDataset ds({.size = 4}); }, {"at least one field"});
  expect_error([] { data::SyntheticDataset ds({.size = -1, .fields = {{"x", {2}}}}); }, {"size"});
}

}  // namespace
}  // namespace kiln::testing
