// Reductions over sets of dims: sum, mean, prod, amax/amin, max/min, var/std, norm, logsumexp,
// all/any, count_nonzero. References are plain loops in double over the input's own values.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::expect_values;
using testing::kFloatTypes;
using testing::kInf;
using testing::kNaN;
using testing::uniform;
using testing::values;

// The input values each output of a reduction sees, and the output's shape: the reference side.
struct Groups {
  Shape shape;
  std::vector<std::vector<double>> members;

  std::vector<double> apply(const std::function<double(const std::vector<double>&)>& f) const {
    std::vector<double> out;
    for (const auto& m : members) out.push_back(f(m));
    return out;
  }
};

Groups groups(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const Shape& in = x.shape();
  const int64_t rank = x.dim();
  std::vector<bool> mask(static_cast<size_t>(rank), dims.empty());
  for (int64_t d : dims) mask[static_cast<size_t>(d < 0 ? d + rank : d)] = true;
  Shape kept = in, shape;
  for (int64_t d = 0; d < rank; ++d) {
    if (mask[d]) kept[d] = 1;
    if (!mask[d] || keepdim) shape.push_back(kept[d]);
  }
  Groups g{shape, std::vector<std::vector<double>>(static_cast<size_t>(numel(kept)))};
  const std::vector<double> v = values(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = testing::unravel(i, in);
    for (int64_t d = 0; d < rank; ++d) {
      if (mask[d]) idx[d] = 0;
    }
    g.members[testing::ravel(idx, kept)].push_back(v[i]);
  }
  return g;
}

double ref_sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
double ref_mean(const std::vector<double>& v) { return ref_sum(v) / static_cast<double>(v.size()); }
double ref_prod(const std::vector<double>& v) {
  double p = 1;
  for (double x : v) p *= x;
  return p;
}
double ref_max(const std::vector<double>& v) {
  double m = -kInf;
  for (double x : v) {
    if (std::isnan(x)) return x;
    m = std::max(m, x);
  }
  return m;
}
double ref_min(const std::vector<double>& v) {
  double m = kInf;
  for (double x : v) {
    if (std::isnan(x)) return x;
    m = std::min(m, x);
  }
  return m;
}
double ref_var(const std::vector<double>& v, int64_t correction) {
  const double m = ref_mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / std::max<double>(static_cast<double>(v.size()) - static_cast<double>(correction), 0);
}
double ref_norm(const std::vector<double>& v, double p) {
  if (std::isinf(p)) {
    double m = p > 0 ? 0 : kInf;
    for (double x : v) m = p > 0 ? std::max(m, std::abs(x)) : std::min(m, std::abs(x));
    return m;
  }
  double s = 0;
  for (double x : v) s += p == 0 ? (x != 0) : std::pow(std::abs(x), p);
  return p == 0 ? s : std::pow(s, 1 / p);
}
double ref_logsumexp(const std::vector<double>& v) {
  double m = ref_max(v);
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}

// Float32 sums of n terms of magnitude ~2 round at each of ~log n levels: allow for it near zero.
double sum_atol(DType dt, size_t n) {
  return dt == DType::Float32 ? 1e-6 * static_cast<double>(n) : testing::default_atol(dt) * 4;
}

const std::vector<std::vector<int64_t>> kDimSets = {{0}, {1}, {2}, {-1}, {0, 2}, {-3, -1}, {1, 0}, {}, {0, 1, 2}};

class ReduceTest : public testing::BackendTest {};

TEST_P(ReduceTest, SumMeanAmaxAminOverDimSets) {
  for (DType dt : kFloatTypes) {
    Tensor x = testing::make(uniform(60, -2, 2), {3, 4, 5}, opts(dt));
    for (const auto& dims : kDimSets) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << dt << " dims " << ::testing::PrintToString(dims) << " keepdim " << keepdim);
        const Groups g = groups(x, dims, keepdim);
        const size_t n = g.members[0].size();
        Tensor s = x.sum(dims, keepdim);
        EXPECT_EQ(s.dtype(), dt);
        expect_values(s, g.shape, g.apply(ref_sum), -1, sum_atol(dt, n));
        expect_values(x.mean(dims, keepdim), g.shape, g.apply(ref_mean), -1, sum_atol(dt, n) / n);
        expect_values(x.amax(dims, keepdim), g.shape, g.apply(ref_max), 0, 0);
        expect_values(x.amin(dims, keepdim), g.shape, g.apply(ref_min), 0, 0);
      }
    }
  }
}

TEST_P(ReduceTest, ProdOverDimSets) {
  for (DType dt : kFloatTypes) {
    Tensor x = testing::make(uniform(24, 0.8, 1.25, 7), {2, 3, 4}, opts(dt));
    for (const auto& dims : kDimSets) {
      SCOPED_TRACE(::testing::Message() << dt << " dims " << ::testing::PrintToString(dims));
      const Groups g = groups(x, dims, false);
      expect_values(x.prod(dims), g.shape, g.apply(ref_prod));
    }
  }
}

TEST_P(ReduceTest, NonContiguousAndChannelsLastInputs) {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
    Tensor base = testing::make(uniform(2 * 3 * 4 * 5, -2, 2, 3), {2, 3, 4, 5}, opts(dt));
    Tensor channels_last = base.contiguous(MemoryFormat::ChannelsLast);
    ASSERT_TRUE(channels_last.is_contiguous(MemoryFormat::ChannelsLast));
    Tensor strided = testing::non_contiguous(base);
    ASSERT_FALSE(strided.is_contiguous());
    Tensor permuted = base.permute({3, 1, 0, 2}).contiguous().permute({2, 1, 3, 0});  // same values, odd strides
    for (const Tensor& x : {channels_last, strided, permuted}) {
      for (const std::vector<int64_t>& dims :
           std::vector<std::vector<int64_t>>{{0, 2, 3}, {1}, {2, 3}, {0}, {3}, {}, {-1, 1}}) {
        SCOPED_TRACE(::testing::Message() << dt << " strides " << ::testing::PrintToString(x.strides()) << " dims "
                                          << ::testing::PrintToString(dims));
        const Groups g = groups(x, dims, true);
        const size_t n = g.members[0].size();
        expect_values(x.sum(dims, true), g.shape, g.apply(ref_sum), -1, sum_atol(dt, n));
        expect_values(x.amax(dims, true), g.shape, g.apply(ref_max), 0, 0);
        expect_values(x.var(dims, 1, true), g.shape, g.apply([](const auto& v) { return ref_var(v, 1); }), -1,
                      sum_atol(dt, n) / n);
        expect_values(x.norm(2, dims, true), g.shape, g.apply([](const auto& v) { return ref_norm(v, 2); }));
      }
    }
  }
}

TEST_P(ReduceTest, BroadcastInputsWithZeroStrides) {
  Tensor row = testing::make({1, 2, 3}, {1, 3}, opts());
  Tensor x = row.expand({4, 3});  // stride 0 in dim 0
  expect_values(x.sum({0}), {3}, {4, 8, 12});
  expect_values(x.sum({1}), {4}, {6, 6, 6, 6});
  expect_values(x.sum(), {}, {24});
  expect_values(x.prod({0}), {3}, {1, 16, 81});
}

// Outer reductions with a contiguous kept dim take the column path: tiles of outputs, split rows.
TEST_P(ReduceTest, ColumnPathShapes) {
  for (const Shape& shape : std::vector<Shape>{{50, 600}, {300000, 4}, {4, 50, 300}}) {
    Tensor x = testing::make(uniform(numel(shape), -1, 1, 11), shape, opts());
    const std::vector<int64_t> dims = shape.size() == 2 ? std::vector<int64_t>{0} : std::vector<int64_t>{1};
    SCOPED_TRACE(::testing::PrintToString(shape));
    const Groups g = groups(x, dims, false);
    const size_t n = g.members[0].size();
    expect_values(x.sum(dims), g.shape, g.apply(ref_sum), 1e-5, 1e-7 * static_cast<double>(n));
    expect_values(x.amin(dims), g.shape, g.apply(ref_min), 0, 0);
    expect_values(x.mean(dims), g.shape, g.apply(ref_mean), 1e-5, 1e-6);
  }
  // NaN in one column of a column-path max and sum.
  Tensor y = testing::make({1, 2, kNaN, 3, 5, 0}, {3, 2}, opts());  // columns (1, NaN, 5), (2, 3, 0)
  expect_values(y.amax({0}), {2}, {kNaN, 3});
  expect_values(y.amin({0}), {2}, {kNaN, 0});
  expect_values(y.sum({0}), {2}, {kNaN, 5});
  expect_values(y.prod({0}), {2}, {kNaN, 0});
}

// Sums over the rows of (R, C) with C a multiple of the pack (8 16-bit floats, 4 float32, 2 float64 in 16 bytes):
// on the GPU each thread reads a pack of neighbouring outputs per row. Also views whose rows start off a 16-byte
// boundary (the unpacked path), a view starting a whole row in, the outer dims of a 3-D tensor, and statistics.
TEST_P(ReduceTest, ColumnSumsOverRowsOfPacks) {
  for (DType dt : kFloatTypes) {
    for (const Shape& shape : std::vector<Shape>{{3000, 64}, {7, 2304}, {1, 48}, {513, 24}, {20000, 16}}) {
      SCOPED_TRACE(::testing::Message() << dt << " shape " << ::testing::PrintToString(shape));
      Tensor x = testing::make(uniform(numel(shape), -1, 1, 21), shape, opts(dt));
      const int64_t rows = shape[0], cols = shape[1];
      std::vector<std::pair<std::string, Tensor>> inputs = {{"whole", x}};
      if (cols > 8) inputs.emplace_back("a column in", x.narrow(1, 1, cols - 8));  // rows off 16-byte boundaries
      if (rows > 1) inputs.emplace_back("a row in", x.narrow(0, 1, rows - 1));
      for (const auto& [what, t] : inputs) {
        SCOPED_TRACE(what);
        const Groups g = groups(t, {0}, false);
        const size_t n = g.members[0].size();
        expect_values(t.sum({0}), g.shape, g.apply(ref_sum), -1, sum_atol(dt, n));
        expect_values(t.mean({0}), g.shape, g.apply(ref_mean), -1, sum_atol(dt, n) / static_cast<double>(n));
        if (n > 1) expect_values(t.var({0}), g.shape, g.apply([](const auto& v) { return ref_var(v, 1); }));
        expect_values(t.amax({0}), g.shape, g.apply(ref_max), 0, 0);
      }
    }
    Tensor cube = testing::make(uniform(6 * 50 * 40, -1, 1, 22), {6, 50, 40}, opts(dt));
    const Groups g = groups(cube, {0, 1}, false);
    expect_values(cube.sum({0, 1}), g.shape, g.apply(ref_sum), -1, sum_atol(dt, 300));
  }
}

// var, norms and logsumexp of outer dims (channels-last statistics) take the column path too.
TEST_P(ReduceTest, StatisticsOnTheColumnPath) {
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16}) {
    Tensor cl =
        testing::make(uniform(2 * 3 * 4 * 5, -2, 2, 12), {2, 3, 4, 5}, opts(dt)).contiguous(MemoryFormat::ChannelsLast);
    Tensor tall = testing::make(uniform(50000 * 3, -2, 2, 13), {50000, 3}, opts(dt));  // split rows, in float16 range
    Tensor wide = testing::make(uniform(40 * 700, -2, 2, 14), {40, 700}, opts(dt));    // several tiles
    for (const auto& [x, dims] : std::vector<std::pair<Tensor, std::vector<int64_t>>>{
             {cl, {0, 2, 3}}, {cl, {2, 3}}, {tall, {0}}, {wide, {0}}}) {
      SCOPED_TRACE(::testing::Message() << dt << " shape " << ::testing::PrintToString(x.shape()));
      const Groups g = groups(x, dims, false);
      const double n = static_cast<double>(g.members[0].size());
      const double rtol = dt == DType::Float32 ? 1e-5 : -1;
      expect_values(x.var(dims), g.shape, g.apply([](const auto& v) { return ref_var(v, 1); }), rtol);
      expect_values(x.std(dims, 0), g.shape, g.apply([](const auto& v) { return std::sqrt(ref_var(v, 0)); }), rtol);
      expect_values(x.logsumexp(dims), g.shape, g.apply(ref_logsumexp), rtol);
      for (double p : {2.0, 1.0, kInf, -kInf, 0.0, 3.0}) {
        SCOPED_TRACE(::testing::Message() << "p " << p);
        expect_values(x.norm(p, dims), g.shape, g.apply([p](const auto& v) { return ref_norm(v, p); }), rtol,
                      p == 0 ? 0.5 : 1e-6 * n);
      }
    }
  }
}

TEST_P(ReduceTest, LargeFloat32SumsStayAccurate) {
  // 10 million values of float(0.1): a naive float accumulator drifts to ~1.09e6.
  const int64_t n = 10'000'000;
  Tensor x = full({n}, 0.1, opts());
  const double expected = static_cast<double>(n) * static_cast<double>(0.1f);
  expect_values(x.sum(), {}, {expected}, 1e-6, 0);
  expect_values(x.mean(), {}, {static_cast<double>(0.1f)}, 1e-6, 0);
  // Random values over several outputs, on the split row path and the column path.
  const std::vector<double> data = uniform(n, 0, 1, 5);
  Tensor r = testing::make(data, {n}, opts());
  expect_values(r.sum(), {}, {ref_sum(data)}, 1e-6, 0);
  std::vector<double> row_sums(4, 0.0), col_sums(8, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    row_sums[i / (n / 4)] += data[i];
    col_sums[i % 8] += data[i];
  }
  expect_values(r.view({4, n / 4}).sum({1}), {4}, row_sums, 1e-6, 0);
  expect_values(r.view({n / 8, 8}).sum({0}), {8}, col_sums, 1e-6, 0);
  // Variance of values with a large common offset (a one-pass sum of squares would cancel).
  const std::vector<double> shifted_data = uniform(1'000'000, 1000, 1001, 9);
  Tensor shifted = testing::make(shifted_data, {1'000'000}, opts());
  expect_values(shifted.var(), {}, {ref_var(values(shifted), 1)}, 1e-4, 0);
}

TEST_P(ReduceTest, IntegerAndBoolInputs) {
  for (DType dt : {DType::Int32, DType::Int64, DType::UInt8}) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor x = testing::make({1, 2, 3, 4, 5, 6}, {2, 3}, opts(dt));
    Tensor s = x.sum({1});
    EXPECT_EQ(s.dtype(), DType::Int64);
    expect_values(s, {2}, {6, 15});
    expect_values(x.sum(), {}, {21});
    Tensor p = x.prod({0});
    EXPECT_EQ(p.dtype(), DType::Int64);
    expect_values(p, {3}, {4, 10, 18});
    Tensor m = x.amax({0});
    EXPECT_EQ(m.dtype(), dt);
    expect_values(m, {3}, {4, 5, 6});
    expect_values(x.amin({1}, true), {2, 1}, {1, 4});
    expect_values(x.max(), {}, {6});
    expect_values(x.min(), {}, {1});
    Tensor f = internal::sum(x, {}, false, DType::Float64);
    EXPECT_EQ(f.dtype(), DType::Float64);
    expect_values(f, {}, {21});
  }
  // int32 sums beyond 2^31 are exact in int64.
  Tensor big = full({3}, 2'000'000'000, opts(DType::Int32));
  expect_values(big.sum(), {}, {6e9});
  Tensor b = testing::make({1, 0, 1, 1}, {2, 2}, opts(DType::Bool));
  Tensor bs = b.sum({0});
  EXPECT_EQ(bs.dtype(), DType::Int64);
  expect_values(bs, {2}, {2, 1});
  expect_values(b.amax({1}), {2}, {1, 1});
  Tensor half_sum = internal::sum(testing::make({1, 2, 3}, {3}, opts()), {}, false, DType::Float16);
  EXPECT_EQ(half_sum.dtype(), DType::Float16);
  expect_values(half_sum, {}, {6});
}

TEST_P(ReduceTest, ZeroSizeAndZeroDim) {
  Tensor e = zeros({0, 3}, opts());
  expect_values(e.sum({0}), {3}, {0, 0, 0});
  expect_values(e.sum({1}), {0}, {});
  expect_values(e.sum(), {}, {0});
  expect_values(e.prod({0}), {3}, {1, 1, 1});
  expect_values(e.mean({0}), {3}, {kNaN, kNaN, kNaN});
  expect_values(e.var({0}), {3}, {kNaN, kNaN, kNaN});
  expect_values(e.norm(2, {0}), {3}, {0, 0, 0});
  expect_values(e.logsumexp({0}), {3}, {-kInf, -kInf, -kInf});
  expect_values(internal::all(e, {0}), {3}, {1, 1, 1});
  expect_values(internal::any(e, {0}), {3}, {0, 0, 0});
  expect_values(internal::count_nonzero(e, {0}), {3}, {0, 0, 0});
  expect_values(e.amax({1}), {0}, {});  // no output, nothing to reduce: fine
  expect_values(e.sum({0}, true), {1, 3}, {0, 0, 0});
  expect_values(zeros({0}, opts(DType::Int32)).sum(), {}, {0});

  Tensor s = scalar_tensor(2.5, opts());
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}}) {
    expect_values(s.sum(dims), {}, {2.5});
    expect_values(s.mean(dims, true), {}, {2.5});
    expect_values(s.amax(dims), {}, {2.5});
    expect_values(s.prod(dims), {}, {2.5});
    expect_values(s.norm(1, dims), {}, {2.5});
    expect_values(s.logsumexp(dims), {}, {2.5});
  }
  expect_values(s.max(), {}, {2.5});
  expect_values(s.var({}, 0), {}, {0});
  expect_values(s.var(), {}, {kNaN});  // one element, Bessel's correction: 0 / 0
}

TEST_P(ReduceTest, NaNPropagates) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor x = testing::make({1, kNaN, 3, 4, 5, 6}, {2, 3}, opts(dt));
    expect_values(x.amax({1}), {2}, {kNaN, 6});
    expect_values(x.amin({1}), {2}, {kNaN, 4});
    expect_values(x.max(), {}, {kNaN});
    expect_values(x.min(), {}, {kNaN});
    expect_values(x.sum({1}), {2}, {kNaN, 15});
    expect_values(x.var({1}), {2}, {kNaN, 1});
    expect_values(x.logsumexp({1}), {2}, {kNaN, ref_logsumexp({4, 5, 6})});
    expect_values(x.norm(kInf, {1}), {2}, {kNaN, 6});
    // NaN after a run of finite values, in a long row: the blocked max must not lose it.
    std::vector<double> long_row = uniform(5000, -1, 1);
    long_row[4321] = kNaN;
    expect_values(testing::make(long_row, {5000}, opts(dt)).amax(), {}, {kNaN});
  }
}

TEST_P(ReduceTest, VarStdVarMean) {
  for (DType dt : kFloatTypes) {
    Tensor x = testing::make(uniform(60, -2, 2, 4), {3, 4, 5}, opts(dt));
    for (const auto& dims : kDimSets) {
      for (int64_t correction : {0, 1, 2}) {
        SCOPED_TRACE(::testing::Message()
                     << dt << " dims " << ::testing::PrintToString(dims) << " correction " << correction);
        const Groups g = groups(x, dims, false);
        const auto var = g.apply([&](const auto& v) { return ref_var(v, correction); });
        std::vector<double> sd;
        for (double v : var) sd.push_back(std::sqrt(v));
        const double atol = sum_atol(dt, g.members[0].size()) / g.members[0].size();
        Tensor v = x.var(dims, correction);
        EXPECT_EQ(v.dtype(), dt);
        expect_values(v, g.shape, var, -1, atol);
        expect_values(x.std(dims, correction), g.shape, sd, -1, atol);
        auto [vm, m] = internal::var_mean(x, dims, correction, true);
        const Groups gk = groups(x, dims, true);
        expect_values(vm, gk.shape, var, -1, atol);
        expect_values(m, gk.shape, gk.apply(ref_mean), -1, atol);
      }
    }
  }
}

TEST_P(ReduceTest, Norms) {
  for (DType dt : kFloatTypes) {
    std::vector<double> data = uniform(60, -2, 2, 6);
    data[7] = 0;
    data[31] = 0;
    Tensor x = testing::make(data, {3, 4, 5}, opts(dt));
    for (double p : {2.0, 1.0, kInf, -kInf, 0.0, 3.0, 0.5}) {
      for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {1}, {0, 2}, {-1}}) {
        SCOPED_TRACE(::testing::Message() << dt << " p " << p << " dims " << ::testing::PrintToString(dims));
        const Groups g = groups(x, dims, true);
        expect_values(x.norm(p, dims, true), g.shape, g.apply([p](const auto& v) { return ref_norm(v, p); }), -1,
                      dt == DType::Float32 ? 1e-5 : -1);
      }
    }
  }
  expect_values(testing::make({3, -4}, {2}, opts()).norm(), {}, {5});  // hand-derived
}

TEST_P(ReduceTest, LogSumExp) {
  for (DType dt : kFloatTypes) {
    Tensor x = testing::make(uniform(60, -5, 5, 8), {3, 4, 5}, opts(dt));
    for (const auto& dims : kDimSets) {
      SCOPED_TRACE(::testing::Message() << dt << " dims " << ::testing::PrintToString(dims));
      const Groups g = groups(x, dims, false);
      expect_values(x.logsumexp(dims), g.shape, g.apply(ref_logsumexp));
    }
  }
  // Large values do not overflow; -inf entries vanish; an all -inf row gives -inf; +inf wins.
  Tensor y = testing::make({1000, 1000, -kInf, -kInf, -kInf, 2, 1, kInf}, {4, 2}, opts());
  expect_values(y.logsumexp({1}), {4}, {1000 + std::log(2.0), -kInf, 2, kInf});
  // Integers compute in float32.
  Tensor i = testing::make({0, 0}, {2}, opts(DType::Int64)).logsumexp({0});
  EXPECT_EQ(i.dtype(), DType::Float32);
  expect_values(i, {}, {std::log(2.0)});
}

TEST_P(ReduceTest, AllAnyCountNonzero) {
  for (DType dt : {DType::Float32, DType::Float16, DType::Int32, DType::UInt8, DType::Bool}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const bool floating = is_floating_point(dt);
    Tensor x = testing::make({1, 0, 2, 0, 0, 0, 3, floating ? kNaN : 1.0, 1}, {3, 3}, opts(dt));
    Tensor a = internal::all(x, {1});
    EXPECT_EQ(a.dtype(), DType::Bool);
    expect_values(a, {3}, {0, 0, 1});
    expect_values(internal::any(x, {1}), {3}, {1, 0, 1});
    expect_values(internal::any(x, {0}, true), {1, 3}, {1, 1, 1});
    expect_values(internal::all(x), {}, {0});
    expect_values(x.any(), {}, {1});
    Tensor c = internal::count_nonzero(x, {0});
    EXPECT_EQ(c.dtype(), DType::Int64);
    expect_values(c, {3}, {2, 1, 2});  // NaN counts as nonzero
    expect_values(internal::count_nonzero(x), {}, {5});
    expect_values(internal::count_nonzero(testing::non_contiguous(x), {-1}), {3}, {2, 0, 3});
  }
}

TEST_P(ReduceTest, ErrorsNameTheOpAndTheCulprit) {
  Tensor x = testing::make(uniform(6, -1, 1), {2, 3}, opts());
  expect_error([&] { x.sum({0, -2}); }, {"sum", "dim 0", "more than once"});
  expect_error([&] { x.var({1, 1}); }, {"var", "dim 1", "more than once"});
  expect_error([&] { x.sum({2}); }, {"sum", "dim 2", "out of range"});
  expect_error([&] { x.amax({-3}); }, {"amax", "dim -3", "out of range"});
  Tensor i = testing::make({1, 2}, {2}, opts(DType::Int64));
  expect_error([&] { i.mean(); }, {"mean", "int64", "Float32"});
  expect_error([&] { testing::make({1}, {1}, opts(DType::Int32)).var(); }, {"var", "int32", "floating-point"});
  expect_error([&] { internal::std(i); }, {"std", "int64"});
  expect_error([&] { internal::var_mean(i); }, {"var_mean", "int64"});
  expect_error([&] { i.norm(); }, {"norm", "int64"});
  expect_error([&] { x.norm(kNaN); }, {"norm", "NaN"});
  Tensor e = zeros({0, 3}, opts());
  expect_error([&] { e.max(); }, {"max(): cannot reduce an empty tensor", "[0, 3]"});
  expect_error([&] { e.min(); }, {"min(): cannot reduce an empty tensor"});
  expect_error([&] { e.amax({0}); }, {"amax", "dim 0", "size 0", "[0, 3]"});
  expect_error([&] { e.amin(); }, {"amin", "dim 0", "size 0"});
  expect_error([&] { e.norm(kInf, {0}); }, {"norm", "dim 0", "size 0"});
}

KILN_INSTANTIATE_BACKENDS(ReduceTest);

}  // namespace
}  // namespace kiln
