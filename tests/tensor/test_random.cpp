// Random numbers: reproducible from a seed, with the documented Philox numbering and sound statistics.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor/cuda.h"
#include "kiln/tensor/generator.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::default_atol;
using testing::default_rtol;
using testing::expect_error;
using testing::expect_values;
using testing::kInf;
using testing::kNaN;
using testing::make;
using testing::uniform;
using testing::values;

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

// Every element of a large CPU draw (many threads' chunks, each starting anywhere inside a Philox block or a
// Box-Muller pair) is generator.h's value for its row-major index, also written through a transposed layout. Integer
// results and the Bernoulli decisions are exact; floating ones within a few units in the last place of their dtype
// (the kernels are built for the machine's instruction set, whose fused multiply-adds may round a + b * x once).
TEST(RandomCpu, EveryElementIsItsDocumentedValue) {
  constexpr int64_t rows = 613, cols = 331;  // 202,903 elements: odd sizes, many chunks
  Generator g(2024);
  const auto transposed = [](DType dtype) { return empty({cols, rows}, {.dtype = dtype}).t(); };  // (rows, cols)
  double rel = 0;  // the tolerance of the checks that follow
  const auto expect_each = [&](const Tensor& t, auto expected, const char* what) {
    const std::vector<double> got = values(t);
    ASSERT_EQ(got.size(), static_cast<size_t>(rows * cols));
    for (uint64_t i = 0; i < got.size(); ++i) {
      const double want = expected(i);
      ASSERT_LE(std::abs(got[i] - want), rel * std::max(1.0, std::abs(want))) << what << " element " << i;
    }
  };
  rel = 4 * std::numeric_limits<float>::epsilon();
  {
    Tensor t = transposed(DType::Float32);
    const GeneratorState d = g.state();
    normal_(t, 0.5, 2.0, &g);
    expect_each(
        t,
        [&](uint64_t i) {
          return double{static_cast<float>(0.5 + 2.0 * philox::normal_value(d.seed, d.offset, i, false))};
        },
        "float32 normal");
  }
  rel = 4 * std::numeric_limits<double>::epsilon();
  {
    Tensor t = transposed(DType::Float64);
    const GeneratorState d = g.state();
    normal_(t, -1.0, 3.0, &g);
    expect_each(
        t, [&](uint64_t i) { return -1.0 + 3.0 * philox::normal_value(d.seed, d.offset, i, true); }, "float64 normal");
  }
  rel = 4 * std::numeric_limits<float>::epsilon();
  {
    Tensor t = transposed(DType::Float32);
    const GeneratorState d = g.state();
    uniform_(t, -2.0, 6.0, &g);
    expect_each(
        t, [&](uint64_t i) { return double{-2.0f + 8.0f * philox::uniform_float(d.seed, d.offset, i)}; },
        "float32 uniform");
  }
  rel = 4 * std::numeric_limits<double>::epsilon();
  {
    Tensor t = transposed(DType::Float64);
    const GeneratorState d = g.state();
    uniform_(t, 0.0, 1.0, &g);
    expect_each(
        t, [&](uint64_t i) { return philox::uniform_double(d.seed, d.offset, i); }, "float64 uniform");
  }
  rel = 0;
  {
    const GeneratorState d = g.state();
    const Tensor t = randint(-1000, 1000, {rows, cols}, {.dtype = DType::Int64}, &g);
    expect_each(
        t,
        [&](uint64_t i) {
          return static_cast<double>(-1000 + static_cast<int64_t>(philox::bits64(d.seed, d.offset, i) % 2000));
        },
        "randint");
  }
  {
    const GeneratorState d = g.state();
    const Tensor t = bernoulli({rows, cols}, 0.3, {}, &g);
    expect_each(
        t, [&](uint64_t i) { return philox::uniform_float(d.seed, d.offset, i) < 0.3 ? 1.0 : 0.0; }, "bernoulli");
  }
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

// ---- the fused dropout (internal::dropout) ----

// What dropout computed before it was one kernel: a bernoulli(1 - p) mask in x's dtype, scaled in place,
// times x. {out, mask}.
std::pair<Tensor, Tensor> composed_dropout(const Tensor& x, double p, Generator* g) {
  Tensor mask = bernoulli(x.shape(), 1 - p, x.options(), g);
  mask.mul_(1.0 / (1.0 - p));
  return {x * mask, mask};
}

// The same numbers element by element in row-major order: equal with the same sign, or both NaN.
void expect_same_values(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  const auto g = values(got), w = values(want);
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool same = std::isnan(w[i]) ? std::isnan(g[i]) : (g[i] == w[i] && std::signbit(g[i]) == std::signbit(w[i]));
    if (!same && ++bad <= 5) ADD_FAILURE() << "element " << i << ": got " << g[i] << ", want " << w[i];
  }
  EXPECT_EQ(bad, 0) << "of " << g.size() << " elements";
}

class DropoutOpTest : public testing::BackendTest {};

// The mask is bernoulli's for the same generator state, bit for bit, and the generator moves on by one
// draw as it did: so the new dropout agrees exactly with the old one, and later random numbers are the same.
TEST_P(DropoutOpTest, MaskIsBernoullisForTheSameSeed) {
  for (DType dt : testing::kFloatTypes) {
    for (double p : {0.1, 0.25, 0.5, 1.0 / 3.0, 0.9}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " p = " + std::to_string(p));
      Generator gx(1), g_old(77), g_new(77);
      Tensor x = randn({3, 37, 11}, opts(dt), &gx);  // 1221 elements: not a whole number of vectors
      auto [out_old, mask_old] = composed_dropout(x, p, &g_old);
      auto [out, mask] = internal::dropout(x, p, &g_new);
      EXPECT_EQ(mask.dtype(), dt);
      expect_same_values(mask, mask_old);
      expect_same_values(out, out_old);
      EXPECT_EQ(g_new.state(), g_old.state());
    }
  }
}

// out = x * mask within the dtype's rounding, against products taken in double; mask holds 0 or
// 1 / (1 - p); a dropped inf or NaN gives NaN (x * 0), as the composed dropout did.
TEST_P(DropoutOpTest, OutputIsXTimesTheMask) {
  const double p = 0.3, scale = 1 / (1 - p);
  for (DType dt : testing::kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<double> xv = uniform(4099, -4, 4, 3);
    for (size_t i = 0; i + 7 < xv.size(); i += 50) {  // 82 of each: some are surely dropped
      xv[i + 5] = kInf;
      xv[i + 6] = -kInf;
      xv[i + 7] = kNaN;
    }
    Generator g(2);
    Tensor x = make(xv, {4099}, opts(dt));
    auto [out, mask] = internal::dropout(x, p, &g);
    const auto m = values(mask), xr = values(x);  // x as rounded to dt
    std::vector<double> want(m.size());
    for (size_t i = 0; i < m.size(); ++i) {
      ASSERT_TRUE(m[i] == 0 || std::abs(m[i] - scale) <= default_rtol(dt) * scale) << i << ": " << m[i];
      want[i] = xr[i] * m[i];
    }
    expect_values(out, {4099}, want, default_rtol(dt), default_atol(dt));
    int64_t dropped_infinities = 0;
    for (size_t i = 0; i < m.size(); ++i) dropped_infinities += std::isinf(xr[i]) && m[i] == 0;
    EXPECT_GT(dropped_infinities, 0);
  }
}

// Element i is the i-th in row-major order whatever the layout of x: transposed, channels-last, a view that
// starts one element in (not 16-byte aligned), fewer elements than one vector, 0-d.
TEST_P(DropoutOpTest, LayoutsNumberTheElementsInRowMajorOrder) {
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float64}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator gx(4);
    std::vector<Tensor> inputs = {
        randn({40, 30}, opts(dt), &gx).transpose(0, 1),
        randn({2, 3, 5, 7}, opts(dt), &gx).contiguous(MemoryFormat::ChannelsLast),
        narrow(randn({1001}, opts(dt), &gx), 0, 1, 1000),
        randn({3}, opts(dt), &gx),
        randn({}, opts(dt), &gx),
    };
    for (const Tensor& x : inputs) {
      std::ostringstream where;
      where << "shape " << x.shape() << " strides " << x.strides();
      SCOPED_TRACE(where.str());
      Generator g_old(9), g_new(9);
      auto [out_old, mask_old] = composed_dropout(x, 0.5, &g_old);
      auto [out, mask] = internal::dropout(x, 0.5, &g_new);
      expect_same_values(mask, mask_old);
      expect_same_values(out, out_old);
      EXPECT_EQ(out.suggest_memory_format(), x.suggest_memory_format());
    }
  }
}

TEST_P(DropoutOpTest, DropsAFractionPOfALargeTensor) {
  const int64_t n = int64_t{1} << 20;
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    for (double p : {0.1, 0.5}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " p = " + std::to_string(p));
      Generator g(2025);
      auto [out, mask] = internal::dropout(ones({n}, opts(dt)), p, &g);
      const double dropped = (mask == 0).sum().item<double>();  // Bool sums to Int64
      // Binomial(n, p): within 5 standard deviations (about 1500 for p = 0.5).
      EXPECT_NEAR(dropped, p * static_cast<double>(n), 5 * std::sqrt(static_cast<double>(n) * p * (1 - p)));
      EXPECT_EQ(values(out), values(mask));  // x = 1
    }
  }
}

TEST_P(DropoutOpTest, EmptyInputsAndBadArguments) {
  Generator g(3);
  const GeneratorState before = g.state();
  auto [out, mask] = internal::dropout(empty({0, 4}, opts()), 0.5, &g);
  EXPECT_EQ(out.shape(), (Shape{0, 4}));
  EXPECT_EQ(mask.shape(), (Shape{0, 4}));
  EXPECT_EQ(g.state(), before);  // as bernoulli of nothing: no draw
  expect_error([&] { internal::dropout(ones({2}, opts()), 1.0, &g); }, {"dropout", "[0, 1)", "1"});
  expect_error([&] { internal::dropout(ones({2}, opts()), -0.1, &g); }, {"dropout", "[0, 1)", "-0.1"});
  expect_error([&] { internal::dropout(ones({2}, opts()), kNaN, &g); }, {"dropout", "[0, 1)", "nan"});
  expect_error([&] { internal::dropout(ones({2}, opts(DType::Int64)), 0.5, &g); },
               {"dropout", "floating point", "int64"});
  expect_error([&] { internal::dropout(ones({2}, opts(DType::Bool)), 0.5, &g); },
               {"dropout", "floating point", "bool"});
  expect_error([&] { internal::dropout(Tensor(), 0.5, &g); }, {"dropout", "undefined"});
  EXPECT_EQ(g.state(), before);  // a rejected call draws nothing
}

// The integer compares of the fused kernels decide exactly as `uniform < q` does, including at q values
// that are whole multiples of 2^-24 (0.5, 0.25) and just beside them.
TEST(Philox, KeepThresholdsDecideAsUniformBelowQ) {
  const double eps24 = 1.0 / 16777216.0;
  for (double q : {0.0, 1.0, 0.5, 0.25, 0.9, 0.7, 1.0 / 3.0, 0.5 + eps24, 0.5 - eps24, 0.5 + eps24 / 2, 1e-9}) {
    const philox::KeepThreshold t = philox::keep_threshold(q);
    for (uint32_t k : {0u, 1u, 8388607u, 8388608u, 8388609u, 4194304u, 16777215u, 11744051u, 5592405u, 5592406u}) {
      const uint32_t word = k << 8 | 0xABu;  // the low 8 bits are not used
      EXPECT_EQ(philox::keep_float(word, t.below24), static_cast<double>(philox::to_unit_float(word)) < q)
          << "q " << q << " k " << k;
    }
    for (uint64_t k : {uint64_t{0}, uint64_t{1} << 52, (uint64_t{1} << 52) - 1, (uint64_t{1} << 52) + 1,
                       (uint64_t{1} << 53) - 1, uint64_t{3002399751580331}, uint64_t{3002399751580330}}) {
      const uint64_t bits = k << 11 | 0x5A5u;
      const auto hi = static_cast<uint32_t>(bits >> 32), lo = static_cast<uint32_t>(bits);
      EXPECT_EQ(philox::keep_double(hi, lo, t.below53), philox::to_unit_double(hi, lo) < q) << "q " << q << " k " << k;
    }
  }
  // And over many random words.
  for (double q : {0.1, 0.9, 0.5, 0.123456789}) {
    const philox::KeepThreshold t = philox::keep_threshold(q);
    for (uint64_t i = 0; i < 4096; ++i) {
      uint32_t w[4];
      philox::block(11, i, 5, w);
      ASSERT_EQ(philox::keep_float(w[0], t.below24), static_cast<double>(philox::to_unit_float(w[0])) < q);
      ASSERT_EQ(philox::keep_double(w[1], w[2], t.below53), philox::to_unit_double(w[1], w[2]) < q);
    }
  }
}

// The GPU's dropout is the CPU's for the same seed: same mask and output bits, every floating dtype, the
// vectorised (contiguous) and the strided kernels.
TEST(RandomCuda, DropoutMatchesTheCpuForTheSameSeed) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  for (DType dt : testing::kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Generator gx(8);
    const Tensor big = randn({64, 129}, {.dtype = dt}, &gx);
    for (const Tensor& x : {big, big.transpose(0, 1), narrow(big.flatten(), 0, 3, 5000)}) {
      Generator gc(31337), gg(31337);
      auto [oc, mc] = internal::dropout(x, 0.2, &gc);
      auto [og, mg] = internal::dropout(x.to(Device::cuda(0)), 0.2, &gg);
      expect_same_values(mg.cpu(), mc);
      expect_same_values(og.cpu(), oc);
    }
  }
}

KILN_INSTANTIATE_BACKENDS(RandomTest);
KILN_INSTANTIATE_BACKENDS(DropoutOpTest);

}  // namespace
}  // namespace kiln
