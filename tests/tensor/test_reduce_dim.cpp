// Reductions along one dim: max/min with indices, argmax/argmin, softmax and log-softmax.
// References are plain loops in double over the input's own values.
#include <cmath>
#include <limits>

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

// The lines of x along dim: line o holds the values at every index of dim, for one position of the others.
struct Lines {
  Shape kept;  // x's shape with size 1 at dim
  std::vector<std::vector<double>> lines;
};
Lines lines_of(const Tensor& x, int64_t dim) {
  Lines l{x.shape(), {}};
  l.kept[dim] = 1;
  l.lines.resize(static_cast<size_t>(numel(l.kept)));
  const auto v = values(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = testing::unravel(i, x.shape());
    idx[dim] = 0;
    l.lines[testing::ravel(idx, l.kept)].push_back(v[i]);
  }
  return l;
}

Shape drop(Shape s, int64_t dim) {
  s.erase(s.begin() + dim);
  return s;
}

// First index of the max (or min); the first NaN wins.
int64_t ref_arg(const std::vector<double>& v, bool is_max) {
  int64_t best = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) return static_cast<int64_t>(i);
    if (is_max ? v[i] > v[best] : v[i] < v[best]) best = static_cast<int64_t>(i);
  }
  return best;
}

std::vector<double> ref_softmax(const std::vector<double>& v, bool log) {
  double m = -kInf;
  for (double x : v) m = std::max(m, x);
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  std::vector<double> out;
  for (double x : v) out.push_back(log ? x - m - std::log(s) : std::exp(x - m) / s);
  return out;
}

// Scatters per-line results back into x's row-major order.
std::vector<double> unlines(const Tensor& x, int64_t dim, const std::vector<std::vector<double>>& per_line) {
  Shape kept = x.shape();
  kept[dim] = 1;
  std::vector<double> out(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = testing::unravel(i, x.shape());
    const int64_t k = idx[dim];
    idx[dim] = 0;
    out[i] = per_line[testing::ravel(idx, kept)][k];
  }
  return out;
}

class ReduceDimTest : public testing::BackendTest {};

TEST_P(ReduceDimTest, MaxMinWithIndices) {
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int32, DType::UInt8}) {
    const bool floating = is_floating_point(dt);
    Tensor base = testing::make(floating ? uniform(60, -3, 3, 2) : uniform(60, 0, 100, 2), {3, 4, 5}, opts(dt));
    if (!floating) base = testing::make(values(base), {3, 4, 5}, opts(dt));
    for (const Tensor& x : {base, testing::non_contiguous(base)}) {
      for (int64_t dim : {0, 1, 2, -1}) {
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dt << " dim " << dim << " keepdim " << keepdim);
          const int64_t d = dim < 0 ? dim + 3 : dim;
          const Lines l = lines_of(x, d);
          const Shape shape = keepdim ? l.kept : drop(l.kept, d);
          for (bool is_max : {true, false}) {
            std::vector<double> vals, idx;
            for (const auto& line : l.lines) {
              idx.push_back(static_cast<double>(ref_arg(line, is_max)));
              vals.push_back(line[static_cast<size_t>(idx.back())]);
            }
            auto [v, i] = is_max ? internal::max(x, dim, keepdim) : internal::min(x, dim, keepdim);
            EXPECT_EQ(v.dtype(), dt);
            EXPECT_EQ(i.dtype(), DType::Int64);
            expect_values(v, shape, vals, 0, 0);
            expect_values(i, shape, idx, 0, 0);
            expect_values(is_max ? x.argmax(dim, keepdim) : x.argmin(dim, keepdim), shape, idx, 0, 0);
          }
        }
      }
    }
  }
}

TEST_P(ReduceDimTest, TiesGiveTheFirstIndexAndNaNWins) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor x = testing::make({1, 3, 3, 0, 0, 1, 2, kNaN, 5, kNaN}, {2, 5}, opts(dt));
    auto [v, i] = internal::max(x, 1);
    expect_values(v, {2}, {3, kNaN});
    expect_values(i, {2}, {1, 2});
    auto [vn, in] = internal::min(testing::make({2, 1, 1, 0, 0}, {5}, opts(dt)), 0);
    expect_values(vn, {}, {0});
    expect_values(in, {}, {3});
    expect_values(testing::make({1, 3, 3, 0, 3}, {5}, opts(dt)).argmax(), {}, {1});
    expect_values(x.argmin(), {}, {7});  // flattened: the first NaN
    expect_values(x.argmax(0), {5}, {0, 0, 1, 1, 1});
  }
  expect_values(testing::make({1, 0, 1}, {3}, opts(DType::Bool)).argmin(), {}, {1});
}

TEST_P(ReduceDimTest, ArgmaxOverTheFlattenedTensor) {
  Tensor x = testing::make(uniform(24, -1, 1, 3), {2, 3, 4}, opts());
  const auto v = values(x);
  std::vector<double> all(v.begin(), v.end());
  const double expected = static_cast<double>(ref_arg(all, true));
  expect_values(x.argmax(), {}, {expected});
  expect_values(x.argmax(std::nullopt, true), {1, 1, 1}, {expected});
  // Non-contiguous: the index is into the row-major order of the logical tensor.
  Tensor t = x.transpose(0, 2);
  const auto tv = values(t);
  expect_values(t.argmin(), {}, {static_cast<double>(ref_arg(tv, false))});
  // 0-d tensors: the only index is 0.
  Tensor s = scalar_tensor(4.0, opts());
  expect_values(s.argmax(), {}, {0});
  expect_values(s.argmax(0), {}, {0});
  auto [sv, si] = internal::max(s, -1, true);
  expect_values(sv, {}, {4});
  expect_values(si, {}, {0});
}

TEST_P(ReduceDimTest, ChannelsLastArgmax) {
  Tensor base = testing::make(uniform(2 * 3 * 4 * 5, -1, 1, 5), {2, 3, 4, 5}, opts());
  Tensor x = base.contiguous(MemoryFormat::ChannelsLast);
  const Lines l = lines_of(x, 1);
  std::vector<double> idx;
  for (const auto& line : l.lines) idx.push_back(static_cast<double>(ref_arg(line, true)));
  expect_values(x.argmax(1), {2, 4, 5}, idx, 0, 0);
}

class SoftmaxTest : public testing::BackendTest {};

TEST_P(SoftmaxTest, MatchesReferenceAlongEveryDim) {
  for (DType dt : kFloatTypes) {
    Tensor base = testing::make(uniform(60, -4, 4, 9), {3, 4, 5}, opts(dt));
    for (const Tensor& x : {base, testing::non_contiguous(base), base.transpose(0, 2).contiguous().transpose(0, 2)}) {
      for (int64_t dim : {0, 1, 2, -1, -3}) {
        for (bool log : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dt << " dim " << dim << " log " << log);
          const int64_t d = dim < 0 ? dim + 3 : dim;
          const Lines l = lines_of(x, d);
          std::vector<std::vector<double>> per_line;
          for (const auto& line : l.lines) per_line.push_back(ref_softmax(line, log));
          Tensor y = log ? x.log_softmax(dim) : x.softmax(dim);
          EXPECT_EQ(y.dtype(), dt);
          expect_values(y, x.shape(), unlines(x, d, per_line));
        }
      }
    }
  }
}

TEST_P(SoftmaxTest, ChannelsLastAndLongRows) {
  Tensor x =
      testing::make(uniform(2 * 3 * 4 * 5, -3, 3, 4), {2, 3, 4, 5}, opts()).contiguous(MemoryFormat::ChannelsLast);
  const Lines l = lines_of(x, 1);
  std::vector<std::vector<double>> per_line;
  for (const auto& line : l.lines) per_line.push_back(ref_softmax(line, false));
  expect_values(x.softmax(1), x.shape(), unlines(x, 1, per_line));
  // A long row (more than one parallel grain).
  Tensor r = testing::make(uniform(3 * 50000, -10, 10, 6), {3, 50000}, opts());
  const Lines lr = lines_of(r, 1);
  std::vector<std::vector<double>> per_row;
  for (const auto& line : lr.lines) per_row.push_back(ref_softmax(line, true));
  expect_values(r.log_softmax(1), r.shape(), unlines(r, 1, per_row), 1e-5, 1e-5);
}

TEST_P(SoftmaxTest, StableForLargeValuesAndInfinities) {
  for (DType dt : {DType::Float32, DType::Float64}) {
    Tensor x = testing::make({1000, 1001, 1002, -kInf, 0, -kInf}, {2, 3}, opts(dt));
    const auto big = ref_softmax({0, 1, 2}, false);
    const auto big_log = ref_softmax({0, 1, 2}, true);
    expect_values(x.softmax(1), {2, 3}, {big[0], big[1], big[2], 0, 1, 0});
    expect_values(x.log_softmax(1), {2, 3}, {big_log[0], big_log[1], big_log[2], -kInf, 0, -kInf});
    Tensor n = testing::make({1, kNaN, 2}, {3}, opts(dt));
    expect_values(n.softmax(0), {3}, {kNaN, kNaN, kNaN});
    // All -inf: there is no distribution; NaN, as in PyTorch.
    expect_values(testing::make({-kInf, -kInf}, {2}, opts(dt)).softmax(0), {2}, {kNaN, kNaN});
  }
}

TEST_P(SoftmaxTest, ZeroDimAndZeroSize) {
  Tensor s = scalar_tensor(3.0, opts());
  expect_values(s.softmax(0), {}, {1});
  expect_values(s.log_softmax(-1), {}, {0});
  Tensor e = zeros({0, 4}, opts());
  expect_values(e.softmax(1), {0, 4}, {});
  expect_values(zeros({3, 0}, opts()).log_softmax(1), {3, 0}, {});
}

TEST_P(SoftmaxTest, ErrorsNameTheOpAndTheCulprit) {
  Tensor i = testing::make({1, 2}, {2}, opts(DType::Int64));
  expect_error([&] { i.softmax(0); }, {"softmax", "int64", "Float32"});
  expect_error([&] { i.log_softmax(0); }, {"log_softmax", "int64"});
  Tensor x = zeros({2, 3}, opts());
  expect_error([&] { x.softmax(2); }, {"softmax", "dim 2", "out of range"});
  expect_error([&] { internal::max(x, -3); }, {"max", "dim -3"});
  Tensor e = zeros({2, 0}, opts());
  expect_error([&] { internal::max(e, 1); }, {"max", "dim 1", "size 0", "[2, 0]"});
  expect_error([&] { internal::min(e, -1); }, {"min", "dim 1", "size 0"});
  expect_error([&] { e.argmax(1); }, {"argmax", "dim 1", "size 0"});
  expect_error([&] { e.argmin(); }, {"argmin", "empty", "[2, 0]"});
}

KILN_INSTANTIATE_BACKENDS(ReduceDimTest);
KILN_INSTANTIATE_BACKENDS(SoftmaxTest);

}  // namespace
}  // namespace kiln
