// Size arithmetic from user input (DESIGN.md rule 11): element counts, byte sizes and view extents are checked
// for overflow and negative sizes, never wrapped. Each case below once gave a wrong numel, a wrong value or a
// segfault (zeros({2^32, 2^32, 4}) had numel 0; empty({INT64_MAX/2, 4}) had numel -4; an expand to
// (2^32, 2^32) summed to 0).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "kiln/tensor/checked_size.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;

constexpr int64_t k2p32 = int64_t{1} << 32;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(SizeChecks, NumelRefusesOverflowAndNegativeSizes) {
  // 2^32 * 2^32 * 4 = 2^66 wraps to 0 in int64 arithmetic.
  expect_error(
      [] {
        (void)numel({k2p32, k2p32, 4}, "zeros");
      },
      {"zeros: shape [4294967296, 4294967296, 4] has more than 2^63-1 elements"});
  // (2^63-1)/2 * 4 wraps to -4.
  expect_error([] { (void)numel({kMax / 2, 4}); }, {"shape [4611686018427387903, 4]", "more than 2^63-1"});
  expect_error([] { (void)numel({3, -2}, "view"); }, {"view: negative size in shape [3, -2]"});
  // The largest counts that fit are exact; a zero anywhere makes the product 0 even after a huge partial product.
  EXPECT_EQ(numel({kMax}), kMax);
  EXPECT_EQ(numel({int64_t{1} << 31, int64_t{1} << 31, 1}), int64_t{1} << 62);
  EXPECT_EQ(numel({k2p32, k2p32, k2p32, 0}), 0);
}

TEST(SizeChecks, CheckedArithmetic) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "t"), int64_t{1} << 62);
  EXPECT_EQ(checked_add(kMax - 1, 1, "t"), kMax);
  expect_error([] { (void)checked_mul(int64_t{1} << 32, int64_t{1} << 31, "reader 'x.bin'"); },
               {"reader 'x.bin': 4294967296 * 2147483648 overflows"});
  expect_error([] { (void)checked_add(kMax, 1, "offsets"); }, {"offsets: 9223372036854775807 + 1 overflows"});
  EXPECT_EQ(checked_nbytes({3, 5}, 8, "t"), 120);
  // 2^61 elements fit in int64, their bytes as float64 (2^64) do not.
  expect_error([] { (void)checked_nbytes({int64_t{1} << 61}, 8, "empty"); },
               {"empty: shape [2305843009213693952] has 2305843009213693952 elements", "exceeds 2^63-1"});
}

TEST(SizeChecks, FactoriesNameTheOpAndTheShape) {
  expect_error(
      [] {
        (void)zeros({k2p32, k2p32, 4});
      },
      {"zeros: shape [4294967296, 4294967296, 4] has more than 2^63-1 elements"});
  expect_error([] { (void)ones({k2p32, k2p32}); }, {"ones: shape [4294967296, 4294967296]"});
  expect_error([] { (void)full({k2p32, k2p32}, 1.0); }, {"full: shape [4294967296, 4294967296]"});
  expect_error([] { (void)empty({kMax / 2, 4}); }, {"empty: shape [4611686018427387903, 4] has more than 2^63-1"});
  expect_error([] { (void)empty({2, -3}); }, {"empty: negative size in shape [2, -3]"});
  // Elements fit, bytes do not: 2^62 float32 values need 2^64 bytes.
  expect_error([] { (void)empty({int64_t{1} << 62}); },
               {"empty: shape [4611686018427387904] of float32", "more than 2^63-1 bytes"});
  // Strides that reach past 2^63-1 elements.
  expect_error([] { (void)empty_strided({2, 2}, {kMax, 1}); }, {"empty_strided", "spans more than 2^63-1"});
  // A shape that fits but cannot be allocated is an OutOfMemoryError naming the size, not a crash: 2^50 bytes.
  try {
    (void)empty({int64_t{1} << 48, 4}, {.dtype = DType::UInt8});
    ADD_FAILURE() << "a 1 PiB tensor was allocated";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("1125899906842624 bytes"), std::string::npos) << e.what();
  }
  // A huge empty shape stays valid (numel 0), as in PyTorch.
  EXPECT_EQ(zeros({0, k2p32, k2p32}).numel(), 0);
}

TEST(SizeChecks, ViewsAndExpandRefuseOverflowingShapes) {
  Tensor one = ones({1, 1});
  // Was a view of numel 0 whose sum() returned 0.
  expect_error(
      [&] {
        (void)one.expand({k2p32, k2p32});
      },
      {"expand: shape [4294967296, 4294967296] has more than 2^63-1 elements"});
  // An expand that fits counts every element: 2^31 x 2^31 views of one value.
  Tensor big = one.expand({int64_t{1} << 31, int64_t{1} << 31});
  EXPECT_EQ(big.numel(), int64_t{1} << 62);
  // reshape/view of an empty tensor to a shape whose product wraps to 0.
  Tensor e = zeros({0});
  expect_error([&] { (void)e.reshape({k2p32, k2p32}); }, {"reshape: shape [4294967296, 4294967296]", "2^63-1"});
  // A zero anywhere makes the shape empty, however large the other sizes (as numel()).
  EXPECT_EQ(e.view({k2p32, k2p32, 0}).numel(), 0);
  // as_strided whose last element lies past 2^63-1.
  Tensor t = zeros({4});
  expect_error([&] { (void)as_strided(t, {3}, {int64_t{1} << 62}, 0); }, {"as_strided", "beyond element 2^63-1"});
}

TEST(SizeChecks, SelectOnARefusedShapeNeverReadsOutOfBounds) {
  // The segfault of the report: zeros({2^32, 2^32, 4}).select(0, 1).item(). It must throw at zeros.
  bool threw = false;
  try {
    Tensor z = zeros({k2p32, k2p32, 4});
    (void)z.select(0, 1).select(0, 0).select(0, 0).item<float>();
  } catch (const Error&) {
    threw = true;
  }
  EXPECT_TRUE(threw);
}

TEST(SizeChecks, SliceWithAHugeStepTakesTheFirstElement) {
  // (end - begin + step - 1) / step and stride * step overflowed for a step near 2^63.
  Tensor t = arange(10, {.dtype = DType::Int64});
  Tensor s = t.slice(0, 3, 10, kMax);
  ASSERT_EQ(s.shape(), (Shape{1}));
  EXPECT_EQ(s.item<int64_t>(), 3);
  EXPECT_EQ(t.slice(0, 0, 10, 4).shape(), (Shape{3}));  // ceil(10 / 4)
  EXPECT_EQ(t.slice(0, 5, 5, 4).shape(), (Shape{0}));
}

TEST(SizeChecks, ArangeRefusesRangesLargerThanATensor) {
  expect_error([] { (void)arange(0.0, 1e30, 1.0); }, {"arange", "more than a tensor can hold"});
}

}  // namespace
}  // namespace kiln
