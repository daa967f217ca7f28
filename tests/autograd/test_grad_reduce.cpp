// Gradients of the reductions: prod, amax/amin, max/min (all elements and along a dim), var, std,
// var_mean, norm, logsumexp. gradcheck in float64 (and CPU vs GPU where one is visible) on distinct
// values; ties and zeros, where the gradient is special, against hand-derived values.
#include <gtest/gtest.h>

#include <cmath>

#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class ReduceGradTest : public BackendTest {};

// A non-contiguous float64 leaf with make_input's values.
Tensor strided_input(const Shape& shape, double lo = -1.0, double hi = 1.0, uint64_t seed = 7) {
  Tensor t = non_contiguous(make_input(shape, lo, hi, seed).detach()).requires_grad_();
  EXPECT_FALSE(t.is_contiguous());
  return t;
}

Tensor leaf(const std::vector<double>& data, const Shape& shape, const TensorOptions& options) {
  return make(data, shape, options).requires_grad_();
}

// ---------------------------------------------------------------- prod
TEST(ProdGrad, Gradcheck) {
  auto over = [](Dims dims, bool keepdim) {
    return [dims, keepdim](const TensorList& in) { return TensorList{kiln::prod(in[0], dims, keepdim)}; };
  };
  check_gradients(over({}, false), {make_input({3, 4}, 0.5, 1.5)});
  check_gradients(over({1}, false), {make_input({3, 4})});
  check_gradients(over({-1}, true), {make_input({2, 3, 4})});
  check_gradients(over({0, 2}, false), {make_input({2, 3, 4})});
  check_gradients(over({0}, true), {strided_input({3, 4})});
}

TEST(ProdGrad, GradcheckWithZeros) {
  // Rows with no zero, one zero, two zeros: prod is multilinear, so central differences are exact here too.
  Tensor a = make({2, 0, 3, 0.5, 0, 0, 5, 1, 1, 2, 4, -1}, {3, 4}, {.dtype = DType::Float64}).requires_grad_();
  check_gradients([](const TensorList& in) { return TensorList{kiln::prod(in[0], {1})}; }, {a});
  check_gradients([](const TensorList& in) { return TensorList{kiln::prod(in[0])}; }, {a});
}

TEST_P(ReduceGradTest, ProdWithZerosIsExact) {
  // Row 0: one zero -> the product of the others at the zero; row 1: two zeros -> all 0; row 2: none.
  Tensor a = leaf({2, 0, 3, 0, 0, 5, 1, 2, 4}, {3, 3}, opts());
  Tensor p = kiln::prod(a, {1});
  ASSERT_NE(p.grad_fn(), nullptr);
  EXPECT_EQ(p.grad_fn()->name(), "ProdBackward");
  p.backward(make({1, 10, 2}, {3}, opts()));
  expect_values(a.grad(), {3, 3}, {0, 6, 0, 0, 0, 0, 16, 8, 4});
}

TEST_P(ReduceGradTest, ProdOfAOneZeroVectorOverAllElements) {
  Tensor a = leaf({3, 0, -2}, {3}, opts());
  kiln::prod(a).backward();
  expect_values(a.grad(), {3}, {0, -6, 0});
}

// ---------------------------------------------------------------- amax, amin, max(), min()
TEST(ExtremumGrad, Gradcheck) {
  // make_input's values are distinct, so every slice has one extremum.
  check_gradients([](const TensorList& in) { return TensorList{kiln::amax(in[0], {1})}; }, {make_input({3, 4})});
  check_gradients(
      [](const TensorList& in) {
        return TensorList{kiln::amax(in[0], {0, -1}, true)};
      },
      {make_input({2, 3, 4})});
  check_gradients([](const TensorList& in) { return TensorList{kiln::amin(in[0], {0})}; }, {strided_input({3, 4})});
  check_gradients([](const TensorList& in) { return TensorList{kiln::amin(in[0])}; }, {make_input({2, 3})});
  check_gradients([](const TensorList& in) { return TensorList{kiln::max(in[0])}; }, {make_input({2, 3})});
  check_gradients([](const TensorList& in) { return TensorList{kiln::min(in[0])}; }, {strided_input({2, 3})});
}

TEST_P(ReduceGradTest, AmaxSplitsTheGradientAmongTies) {
  Tensor a = leaf({1, 3, 3, 2, 5, 0, 5, 5}, {2, 4}, opts());
  Tensor m = kiln::amax(a, {1});
  EXPECT_EQ(m.grad_fn()->name(), "AmaxBackward");
  m.backward(make({1, 6}, {2}, opts()));
  expect_values(a.grad(), {2, 4}, {0, 0.5, 0.5, 0, 2, 0, 2, 2});
}

TEST_P(ReduceGradTest, AminWithKeepdimSplitsAmongTies) {
  Tensor a = leaf({1, 4, 1, 1, 2, 7}, {2, 3}, opts());
  Tensor m = kiln::amin(a, {0}, /*keepdim=*/true);
  EXPECT_EQ(m.grad_fn()->name(), "AminBackward");
  m.backward(make({2, 3, 4}, {1, 3}, opts()));
  expect_values(a.grad(), {2, 3}, {1, 0, 4, 1, 3, 0});
}

TEST_P(ReduceGradTest, MaxAndMinOfAllElementsSplitAmongTies) {
  Tensor a = leaf({1, 4, 4, 0, 4, 0}, {2, 3}, opts());
  Tensor mx = kiln::max(a);
  EXPECT_EQ(mx.grad_fn()->name(), "MaxBackward");
  mx.backward();
  expect_values(a.grad(), {2, 3}, {0, 1.0 / 3, 1.0 / 3, 0, 1.0 / 3, 0});
  Tensor b = leaf({1, 4, 4, 0, 4, 0}, {2, 3}, opts());
  Tensor mn = kiln::min(b);
  EXPECT_EQ(mn.grad_fn()->name(), "MinBackward");
  (mn * 4).backward();
  expect_values(b.grad(), {2, 3}, {0, 0, 0, 2, 0, 2});
}

// ---------------------------------------------------------------- max, min along a dim
TEST(IndexedExtremumGrad, Gradcheck) {
  auto max_along = [](int64_t dim, bool keepdim) {
    return [dim, keepdim](const TensorList& in) { return TensorList{std::get<0>(kiln::max(in[0], dim, keepdim))}; };
  };
  check_gradients(max_along(1, false), {make_input({3, 4})});
  check_gradients(max_along(-3, true), {make_input({2, 3, 2})});
  check_gradients(max_along(0, false), {strided_input({3, 4})});
  check_gradients([](const TensorList& in) { return TensorList{std::get<0>(kiln::min(in[0], -1))}; },
                  {make_input({2, 3, 4})});
  check_gradients([](const TensorList& in) { return TensorList{std::get<0>(kiln::min(in[0], 1, true))}; },
                  {strided_input({3, 4})});
}

TEST_P(ReduceGradTest, MaxAlongADimSendsTheGradientToTheReturnedIndexOnly) {
  Tensor a = leaf({1, 7, 7, 2, 9, 3}, {2, 3}, opts());
  auto [maxima, indices] = kiln::max(a, 1);
  EXPECT_EQ(maxima.grad_fn()->name(), "MaxBackward");
  EXPECT_FALSE(indices.requires_grad());
  EXPECT_EQ(indices.grad_fn(), nullptr);
  maxima.backward(make({10, 20}, {2}, opts()));
  // Row 0 ties at columns 1 and 2: the whole gradient goes to the index max returned.
  const std::vector<double> idx = values(indices);
  std::vector<double> expected(6, 0.0);
  expected[static_cast<size_t>(idx[0])] = 10;
  expected[3 + static_cast<size_t>(idx[1])] = 20;
  EXPECT_TRUE(idx[0] == 1 || idx[0] == 2);
  EXPECT_EQ(idx[1], 1);
  expect_values(a.grad(), {2, 3}, expected);
}

TEST_P(ReduceGradTest, MinAlongADimWithKeepdim) {
  Tensor a = leaf({4, 1, 3, 2, 5, 0}, {3, 2}, opts());
  auto [minima, indices] = kiln::min(a, 0, /*keepdim=*/true);
  EXPECT_EQ(minima.grad_fn()->name(), "MinBackward");
  EXPECT_FALSE(indices.requires_grad());
  minima.backward(make({3, 5}, {1, 2}, opts()));
  expect_values(a.grad(), {3, 2}, {0, 0, 3, 0, 0, 5});
}

// ---------------------------------------------------------------- var, std, var_mean
TEST(VarianceGrad, Gradcheck) {
  auto var = [](Dims dims, int64_t correction, bool keepdim) {
    return [=](const TensorList& in) { return TensorList{kiln::var(in[0], dims, correction, keepdim)}; };
  };
  auto std_ = [](Dims dims, int64_t correction, bool keepdim) {
    return [=](const TensorList& in) { return TensorList{kiln::std(in[0], dims, correction, keepdim)}; };
  };
  check_gradients(var({}, 1, false), {make_input({3, 4})});
  check_gradients(var({1}, 0, true), {make_input({3, 4})});
  check_gradients(var({0, -1}, 2, false), {strided_input({3, 2, 4})});
  check_gradients(std_({}, 1, false), {make_input({3, 4})});
  check_gradients(std_({-1}, 0, false), {make_input({3, 4})});
  check_gradients(std_({0, 2}, 1, true), {strided_input({3, 2, 4})});
  auto var_mean = [](Dims dims, int64_t correction, bool keepdim) {
    return [=](const TensorList& in) {
      auto [v, m] = kiln::var_mean(in[0], dims, correction, keepdim);
      return TensorList{v, m};
    };
  };
  check_gradients(var_mean({}, 1, false), {make_input({3, 4})});
  check_gradients(var_mean({1}, 0, true), {strided_input({3, 4})});
  check_gradients(var_mean({0, 2}, 1, false), {make_input({2, 3, 2})});
}

TEST_P(ReduceGradTest, VarAndStdValues) {
  // x = [1, 2, 3, 4]: mean 2.5, sum of squares 5; var = 5/3, dvar/dx = 2 (x - 2.5) / 3.
  Tensor a = leaf({1, 2, 3, 4}, {4}, opts());
  Tensor v = kiln::var(a);
  EXPECT_EQ(v.grad_fn()->name(), "VarBackward");
  v.backward();
  expect_values(a.grad(), {4}, {-1, -1.0 / 3, 1.0 / 3, 1});
  // std (correction 0) = sqrt(5/4); dstd/dx = (x - 2.5) / (4 std).
  Tensor b = leaf({1, 2, 3, 4}, {4}, opts());
  Tensor s = kiln::std(b, {}, 0);
  EXPECT_EQ(s.grad_fn()->name(), "StdBackward");
  s.backward();
  const double sd = std::sqrt(1.25);
  expect_values(b.grad(), {4}, {-1.5 / (4 * sd), -0.5 / (4 * sd), 0.5 / (4 * sd), 1.5 / (4 * sd)});
}

TEST_P(ReduceGradTest, StdOfAConstantSliceGivesNaNAsInPyTorch) {
  // (x - mean) / ((N - 1) * std) = 0 / 0 where std = 0.
  Tensor a = leaf({2, 2, 1, 3}, {2, 2}, opts());
  kiln::std(a, {1}).sum().backward();
  const std::vector<double> g = values(a.grad());
  EXPECT_TRUE(std::isnan(g[0]) && std::isnan(g[1]));
  EXPECT_NEAR(g[2], -1 / std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(g[3], 1 / std::sqrt(2.0), 1e-6);
}

TEST_P(ReduceGradTest, VarMeanIsOneNodeWithTwoOutputs) {
  Tensor a = leaf({1, 2, 3, 4, 0, 8}, {2, 3}, opts());
  auto [v, m] = kiln::var_mean(a, {1});
  ASSERT_NE(v.grad_fn(), nullptr);
  EXPECT_EQ(v.grad_fn(), m.grad_fn());
  EXPECT_EQ(v.grad_fn()->name(), "VarMeanBackward");
  // Only the mean reaches backward: 1/3 everywhere, scaled by its gradient.
  m.backward(make({3, 6}, {2}, opts()), /*retain_graph=*/true);
  expect_values(a.grad(), {2, 3}, {1, 1, 1, 2, 2, 2});
  // Only the variance: row 0 mean 2, var 1 -> 2 (x - 2) / 2; row 1 mean 4 -> 2 (x - 4) / 2.
  a.mutable_grad() = Tensor();
  v.backward(make({1, 1}, {2}, opts()), /*retain_graph=*/true);
  expect_values(a.grad(), {2, 3}, {-1, 0, 1, 0, -4, 4});
  // Both.
  a.mutable_grad() = Tensor();
  (v + m).sum().backward();
  expect_values(a.grad(), {2, 3}, {-1 + 1.0 / 3, 1.0 / 3, 1 + 1.0 / 3, 1.0 / 3, -4 + 1.0 / 3, 4 + 1.0 / 3});
}

// ---------------------------------------------------------------- norm
TEST(NormGrad, Gradcheck) {
  auto norm = [](double p, Dims dims, bool keepdim) {
    return [=](const TensorList& in) { return TensorList{kiln::norm(in[0], p, dims, keepdim)}; };
  };
  // Values away from 0, where |x| has a kink, with both signs.
  const Tensor x =
      make({0.5, -0.8, 0.3, 1.2, -0.4, 0.9, -1.1, 0.6, 0.7, -0.35, 1.4, -0.55}, {3, 4}, {.dtype = DType::Float64})
          .requires_grad_();
  check_gradients(norm(2, {}, false), {x});
  check_gradients(norm(2, {1}, true), {make_input({3, 4})});
  check_gradients(norm(2, {0, -1}, false), {strided_input({3, 2, 4})});
  check_gradients(norm(1, {}, false), {x});
  check_gradients(norm(1, {0}, false), {x});
  check_gradients(norm(INFINITY, {}, false), {x});
  check_gradients(norm(INFINITY, {1}, false), {x});
  check_gradients(norm(-INFINITY, {1}, true), {x});
  check_gradients(norm(3, {}, false), {x});
  check_gradients(norm(0.5, {1}, false), {x});
  check_gradients(norm(1.5, {-1}, true), {non_contiguous(x.detach()).requires_grad_()});
}

TEST_P(ReduceGradTest, NormValues) {
  // p = 2 of [3, -4]: 5; gradient x / 5.
  Tensor a = leaf({3, -4}, {2}, opts());
  Tensor n = kiln::norm(a);
  EXPECT_EQ(n.grad_fn()->name(), "NormBackward");
  n.backward();
  expect_values(a.grad(), {2}, {0.6, -0.8});
  // p = 1: sign(x).
  Tensor b = leaf({3, -4, 0.5}, {3}, opts());
  kiln::norm(b, 1).backward();
  expect_values(b.grad(), {3}, {1, -1, 1});
  // p = 3 of [1, 2]: n = 9^(1/3); gradient x|x| / n^2.
  Tensor c = leaf({1, -2}, {2}, opts());
  kiln::norm(c, 3).backward();
  const double n3 = std::cbrt(9.0);
  expect_values(c.grad(), {2}, {1 / (n3 * n3), -4 / (n3 * n3)});
}

TEST_P(ReduceGradTest, InfinityNormSplitsAmongTiesWithTheirSigns) {
  Tensor a = leaf({1, -3, 3, 2}, {4}, opts());
  kiln::norm(a, INFINITY).backward();
  expect_values(a.grad(), {4}, {0, -0.5, 0.5, 0});
  Tensor b = leaf({1, -3, -1, 2}, {4}, opts());
  kiln::norm(b, -INFINITY).backward();
  expect_values(b.grad(), {4}, {0.5, 0, -0.5, 0});
}

TEST_P(ReduceGradTest, NormOfAZeroVectorHasAZeroGradient) {
  Tensor a = leaf({0, 0, 0, 3, 4, 0}, {2, 3}, opts());
  kiln::norm(a, 2, {1}).sum().backward();
  expect_values(a.grad(), {2, 3}, {0, 0, 0, 0.6, 0.8, 0});
  Tensor b = leaf({0, 0, 0, 3, 4, 0}, {2, 3}, opts());
  kiln::norm(b, 3, {1}).sum().backward();
  const std::vector<double> g = values(b.grad());
  EXPECT_EQ(g[0], 0);
  EXPECT_EQ(g[1], 0);
  EXPECT_EQ(g[2], 0);
  // p = 0 counts non-zeros: no gradient anywhere.
  Tensor c = leaf({0, 1, -2}, {3}, opts());
  kiln::norm(c, 0).backward();
  expect_values(c.grad(), {3}, {0, 0, 0});
}

// ---------------------------------------------------------------- logsumexp
TEST(LogSumExpGrad, Gradcheck) {
  auto lse = [](Dims dims, bool keepdim) {
    return [=](const TensorList& in) { return TensorList{kiln::logsumexp(in[0], dims, keepdim)}; };
  };
  check_gradients(lse({1}, false), {make_input({3, 4}, -3, 3)});
  check_gradients(lse({0, -1}, true), {make_input({2, 3, 4}, -3, 3)});
  check_gradients(lse({}, false), {strided_input({3, 4}, -3, 3)});
}

TEST_P(ReduceGradTest, LogSumExpValues) {
  // logsumexp([0, ln 3]) = ln 4; gradient softmax = [1/4, 3/4]. Large values must not overflow.
  Tensor a = leaf({0, std::log(3.0), 1000, 1000}, {2, 2}, opts());
  Tensor l = kiln::logsumexp(a, {1});
  EXPECT_EQ(l.grad_fn()->name(), "LogSumExpBackward");
  l.backward(make({1, 2}, {2}, opts()));
  expect_values(a.grad(), {2, 2}, {0.25, 0.75, 1, 1}, 1e-4, 1e-4);  // float32 rounding of 1000 + ln 2
}

// ---------------------------------------------------------------- recording and errors
TEST_P(ReduceGradTest, NothingIsRecordedWithoutGradOrUnderNoGrad) {
  Tensor a = make({1, 2, 3, 4}, {2, 2}, opts());
  EXPECT_EQ(kiln::prod(a).grad_fn(), nullptr);
  EXPECT_EQ(kiln::norm(a).grad_fn(), nullptr);
  a.requires_grad_();
  NoGradGuard no_grad;
  EXPECT_FALSE(kiln::var(a).requires_grad());
  EXPECT_FALSE(std::get<0>(kiln::max(a, 0)).requires_grad());
  EXPECT_FALSE(kiln::logsumexp(a, {0}).requires_grad());
}

TEST_P(ReduceGradTest, ChangingASavedInputInPlaceIsReportedAtBackward) {
  Tensor a = leaf({1, 2, 3, 4}, {4}, opts());
  Tensor h = a * 1.0;
  Tensor p = kiln::prod(h);
  {
    NoGradGuard no_grad;
    h.mul_(2.0);
  }
  expect_error([&] { p.backward(); }, {"ProdBackward", "modified in place"});
  Tensor n = kiln::norm(a * 1.0);
  Tensor s = kiln::logsumexp(n * 1.0, {0});
  s.backward();  // an untouched graph still works
  EXPECT_TRUE(a.grad().defined());
}

TEST_P(ReduceGradTest, ChangingASavedResultInPlaceIsReportedAtBackward) {
  Tensor a = leaf({1, 2, 3, 4}, {4}, opts());
  Tensor s = kiln::std(a);
  {
    NoGradGuard no_grad;
    s.add_(1.0);
  }
  expect_error([&] { s.backward(); }, {"StdBackward", "modified in place"});
}

TEST_P(ReduceGradTest, BadDimsAreReportedByTheForward) {
  Tensor a = leaf({1, 2, 3, 4}, {2, 2}, opts());
  expect_error([&] { kiln::prod(a, {2}); }, {"prod", "dim"});
  expect_error([&] { kiln::var(a, {0, 0}); }, {"var", "more than once"});
  expect_error([&] { kiln::max(a, 5); }, {"max", "dim"});
}

KILN_INSTANTIATE_BACKENDS(ReduceGradTest);

}  // namespace
}  // namespace kiln::testing
