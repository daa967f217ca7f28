// Random numbers: reproducible from a seed, with the documented Philox numbering and sound statistics.
#include <cmath>
#include <set>

#include "kiln/tensor/generator.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;

// Philox4x32-10 known-answer values from the Random123 distribution's kat_vectors
// (counter {0,0,0,0}, key {0,0}) and (counter all ones, key all ones).
TEST(Philox, KnownAnswers) {
  uint32_t out[4];
  philox::block(0, 0, 0, out);
  EXPECT_EQ(out[0], 0x6627e8d5u);
  EXPECT_EQ(out[1], 0xe169c58du);
  EXPECT_EQ(out[2], 0xbc57ac4cu);
  EXPECT_EQ(out[3], 0x9b00dbd8u);
  philox::block(~0ULL, ~0ULL, ~0ULL, out);
  EXPECT_EQ(out[0], 0x408f276du);
  EXPECT_EQ(out[1], 0x41c83b0eu);
  EXPECT_EQ(out[2], 0xa20bc7c6u);
  EXPECT_EQ(out[3], 0x6d5451fdu);
}

class RandomTest : public testing::BackendTest {};

TEST_P(RandomTest, SameSeedSameNumbers) {
  Generator g1(123), g2(123);
  Tensor a = rand({1000}, opts(), &g1);
  Tensor b = rand({1000}, opts(), &g2);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  Tensor c = rand({1000}, opts(), &g1);  // next draw differs
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  manual_seed(7);
  Tensor d = randn({64}, opts());
  manual_seed(7);
  Tensor e = randn({64}, opts());
  EXPECT_EQ(d.to_vector<float>(), e.to_vector<float>());
}

TEST_P(RandomTest, FollowsTheDocumentedNumbering) {
  Generator g(42);
  const GeneratorState draw = g.state();
  Tensor u = rand({9}, opts(), &g);
  const auto got = u.to_vector<float>();
  for (uint64_t i = 0; i < 9; ++i) {
    uint32_t w[4];
    philox::block(42, i / 4, draw.offset, w);
    EXPECT_EQ(got[i], static_cast<float>(w[i % 4] >> 8) / 16777216.0f) << i;
  }
  Tensor n = randn({5}, opts(DType::Float64), &g);
  const auto gn = n.to_vector<double>();
  for (uint64_t i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(gn[i], philox::normal_value(42, draw.offset + 1, i, true));
}

TEST_P(RandomTest, LayoutDoesNotChangeValues) {
  Generator g1(5), g2(5);
  Tensor a = rand({2, 3, 4, 5}, opts(), &g1);
  Tensor b = rand({2, 3, 4, 5}, {.device = dev(), .memory_format = MemoryFormat::ChannelsLast}, &g2);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
}

TEST_P(RandomTest, UniformAndNormalStatistics) {
  Generator g(2024);
  const int64_t n = 200000;
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor ut = empty({n}, opts(dt));
    auto u = uniform_(ut, -2.0, 6.0, &g).to_vector<double>();
    double mean = 0, lo = 1e9, hi = -1e9;
    for (double v : u) {
      mean += v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    mean /= n;
    EXPECT_NEAR(mean, 2.0, 0.05);
    EXPECT_GE(lo, -2.0);
    EXPECT_LE(hi, 6.0);
    auto z = normal({n}, 1.0, 3.0, opts(dt), &g).to_vector<double>();
    double m = 0, sq = 0;
    for (double v : z) m += v;
    m /= n;
    for (double v : z) sq += (v - m) * (v - m);
    EXPECT_NEAR(m, 1.0, 0.05);
    EXPECT_NEAR(std::sqrt(sq / (n - 1)), 3.0, 0.05);
  }
}

TEST_P(RandomTest, RandintBernoulliRandperm) {
  Generator g(99);
  auto r = randint(-3, 4, {10000}, {.device = dev()}, &g);
  EXPECT_EQ(r.dtype(), DType::Int64);
  std::set<int64_t> seen;
  for (int64_t v : r.to_vector<int64_t>()) {
    ASSERT_GE(v, -3);
    ASSERT_LT(v, 4);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 7u);
  auto b = bernoulli({20000}, 0.25, opts(), &g).to_vector<double>();
  double ones = 0;
  for (double v : b) {
    ASSERT_TRUE(v == 0 || v == 1);
    ones += v;
  }
  EXPECT_NEAR(ones / 20000, 0.25, 0.02);
  expect_error([&] { randint(3, 3, {2}, {.device = dev()}, &g); }, {"randint", "low < high"});
  expect_error([&] { bernoulli({2}, 1.5, opts(), &g); }, {"bernoulli", "[0, 1]"});
  expect_error([&] { randn({2}, opts(DType::Int32), &g); }, {"normal_", "floating-point", "int32"});
}

KILN_INSTANTIATE_BACKENDS(RandomTest);

}  // namespace
}  // namespace kiln
