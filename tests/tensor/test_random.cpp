// Random numbers: reproducible from a seed, with the documented Philox numbering and sound statistics.
#include <cmath>
#include <set>

#include "kiln/tensor/cuda.h"
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

// The GPU draws exactly the CPU's numbers for a seed (generator.h's numbering). Normal values pass
// through log/cos/sin, whose last bit may differ between the host's libm and CUDA's.
TEST(RandomCuda, MatchesTheCpuForTheSameSeed) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  auto both = [&](const auto& make) {
    Generator gc(31337), gg(31337);
    return std::pair<Tensor, Tensor>(make(Device::cpu(), &gc), make(gpu, &gg).cpu());
  };
  // A power-of-two range keeps a + (b - a) * u exact, whatever the CPU compiler contracts.
  auto [uc, ug] = both([](Device d, Generator* g) {
    Tensor t = empty({1001}, {.dtype = DType::Float32, .device = d});
    return uniform_(t, -2.0, 6.0, g);
  });
  EXPECT_EQ(uc.to_vector<float>(), ug.to_vector<float>());
  auto [dc, dg] = both([](Device d, Generator* g) {
    return rand({3, 333}, {.dtype = DType::Float64, .device = d}, g);
  });
  EXPECT_EQ(dc.to_vector<double>(), dg.to_vector<double>());
  auto [hc, hg] = both([](Device d, Generator* g) { return rand({257}, {.dtype = DType::BFloat16, .device = d}, g); });
  EXPECT_EQ(hc.to_vector<float>(), hg.to_vector<float>());
  auto [ic, ig] = both([](Device d, Generator* g) { return randint(-1000, 12345, {999}, {.device = d}, g); });
  EXPECT_EQ(ic.to_vector<int64_t>(), ig.to_vector<int64_t>());
  auto [bc, bg] = both([](Device d, Generator* g) { return bernoulli({777}, 0.3, {.device = d}, g); });
  EXPECT_EQ(bc.to_vector<float>(), bg.to_vector<float>());
  // A transposed (non-contiguous) output still numbers its elements in row-major order.
  auto [tc, tg] = both([](Device d, Generator* g) {
    Tensor t = empty({40, 30}, {.device = d}).transpose(0, 1);
    return uniform_(t, 0.0, 1.0, g);
  });
  EXPECT_EQ(tc.to_vector<float>(), tg.to_vector<float>());
  auto [nc, ng] = both([](Device d, Generator* g) { return randn({1003}, {.device = d}, g); });
  const auto nf_c = nc.to_vector<float>(), nf_g = ng.to_vector<float>();
  for (size_t i = 0; i < nf_c.size(); ++i) EXPECT_NEAR(nf_g[i], nf_c[i], 1e-6 * std::max(1.0f, std::abs(nf_c[i]))) << i;
  auto [nd_c, nd_g] =
      both([](Device d, Generator* g) { return randn({1003}, {.dtype = DType::Float64, .device = d}, g); });
  const auto vd_c = nd_c.to_vector<double>(), vd_g = nd_g.to_vector<double>();
  for (size_t i = 0; i < vd_c.size(); ++i) EXPECT_NEAR(vd_g[i], vd_c[i], 1e-12 * std::max(1.0, std::abs(vd_c[i]))) << i;
}

KILN_INSTANTIATE_BACKENDS(RandomTest);

}  // namespace
}  // namespace kiln
