// The losses: values against PyTorch's formulas written as plain double loops (and a few by hand),
// gradients with check_gradients, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/layers/loss.h"
#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using nn::Reduction;

class LossTest : public BackendTest {};

// cross_entropy with class indices on logits (N, C, D) (D = 1 for (N, C)), target (N, D), PyTorch's semantics:
// per position nll = -w[t] log p[t] and smooth = -sum_c w[c] log p[c] (both 0 where ignored); Mean divides
// both sums by the sum of w[t] over the kept positions.
std::vector<double> ce_ref(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t n, int64_t c, int64_t d,
                           const std::vector<double>& w, int64_t ignore, double s, Reduction red) {
  std::vector<double> per;
  double nll_sum = 0, smooth_sum = 0, w_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      const int64_t target = t[i * d + j];
      double mx = -1e300;
      for (int64_t k = 0; k < c; ++k) mx = std::max(mx, x[(i * c + k) * d + j]);
      double z = 0;
      for (int64_t k = 0; k < c; ++k) z += std::exp(x[(i * c + k) * d + j] - mx);
      auto logp = [&](int64_t k) { return x[(i * c + k) * d + j] - mx - std::log(z); };
      auto wt = [&](int64_t k) { return w.empty() ? 1.0 : w[k]; };
      double nll = 0, smooth = 0, wk = 0;
      if (target != ignore) {
        nll = -wt(target) * logp(target);
        for (int64_t k = 0; k < c; ++k) smooth -= wt(k) * logp(k);
        wk = wt(target);
      }
      per.push_back((1 - s) * nll + s / static_cast<double>(c) * smooth);
      nll_sum += nll;
      smooth_sum += smooth;
      w_sum += wk;
    }
  }
  if (red == Reduction::None) return per;
  if (red == Reduction::Sum) return {(1 - s) * nll_sum + s / static_cast<double>(c) * smooth_sum};
  return {((1 - s) * nll_sum + s / static_cast<double>(c) * smooth_sum) / w_sum};
}

TEST_P(LossTest, CrossEntropyByHand) {
  // Equal logits over 2 classes: log 2 whatever the target or smoothing.
  Tensor logits = zeros({1, 2}, opts());
  Tensor target = from_vector<int64_t>({1}, {1}, dev());
  expect_values(nn::cross_entropy(logits, target), {}, {std::log(2.0)});
  expect_values(nn::cross_entropy(logits, target, {.label_smoothing = 0.3}), {}, {std::log(2.0)});
  // Weighted mean: two samples of losses log(1 + e^-1) and log(1 + e) with weights 1 and 3.
  Tensor l2 = make({1, 0, 1, 0}, {2, 2}, opts());
  Tensor t2 = from_vector<int64_t>({0, 1}, {2}, dev());
  const double a = std::log(1 + std::exp(-1.0)), b = std::log(1 + std::exp(1.0));
  expect_values(nn::cross_entropy(l2, t2, {.weight = make({1, 3}, {2}, opts())}), {}, {(a + 3 * b) / 4});
  // Large logits stay finite (log_softmax, not log(softmax)).
  expect_values(nn::cross_entropy(make({1000, 0}, {1, 2}, opts()), from_vector<int64_t>({1}, {1}, dev())), {}, {1000},
                1e-6, 1e-3);
}

TEST_P(LossTest, CrossEntropyWithClassIndicesMatchesLoopsForEveryOption) {
  const int64_t n = 4, c = 3, d = 2;
  auto xv = uniform(n * c * d, -3, 3, 1);
  std::vector<int64_t> tv = {0, 2, 1, 1, 2, 0, 1, 2};
  std::vector<double> w = {0.5, 2.0, 1.5};
  Tensor x2 = make(xv, {n * d, c}, opts());  // (8, 3): the same values read as 2-D
  Tensor x3 = make(xv, {n, c, d}, opts());
  Tensor t1 = from_vector<int64_t>(tv, {n * d}, dev()), t2 = from_vector<int64_t>(tv, {n, d}, dev());
  std::vector<double> x2_as_3d(xv.size());  // x2 laid out as (8, 3, 1)
  x2_as_3d = xv;
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (int64_t ignore : {int64_t{-100}, int64_t{2}}) {
      for (double s : {0.0, 0.2}) {
        for (bool weighted : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "reduction " << static_cast<int>(red) << " ignore " << ignore
                                            << " smoothing " << s << " weighted " << weighted);
          const std::vector<double> wv = weighted ? w : std::vector<double>{};
          nn::CrossEntropyOptions o{.weight = weighted ? make(w, {c}, opts()) : Tensor(),
                                    .ignore_index = ignore,
                                    .reduction = red,
                                    .label_smoothing = s};
          Shape s2 = red == Reduction::None ? Shape{n * d} : Shape{};
          Shape s3 = red == Reduction::None ? Shape{n, d} : Shape{};
          expect_values(nn::cross_entropy(x2, t1, o), s2, ce_ref(x2_as_3d, tv, n * d, c, 1, wv, ignore, s, red), 1e-5,
                        1e-6);
          expect_values(nn::cross_entropy(x3, t2, o), s3, ce_ref(xv, tv, n, c, d, wv, ignore, s, red), 1e-5, 1e-6);
        }
      }
    }
  }
}

TEST_P(LossTest, CrossEntropyWithProbabilitiesMatchesLoops) {
  const int64_t n = 3, c = 4;
  auto xv = uniform(n * c, -3, 3, 2);
  auto qv = uniform(n * c, 0, 1, 3);
  std::vector<double> w = {0.5, 1, 2, 1.5};
  for (double s : {0.0, 0.1}) {
    for (bool weighted : {false, true}) {
      std::vector<double> per(n);
      for (int64_t i = 0; i < n; ++i) {
        double z = 0;
        for (int64_t k = 0; k < c; ++k) z += std::exp(xv[i * c + k]);
        for (int64_t k = 0; k < c; ++k) {
          const double q = (1 - s) * qv[i * c + k] + s / c;
          per[i] -= (weighted ? w[k] : 1.0) * q * (xv[i * c + k] - std::log(z));
        }
      }
      const double total = per[0] + per[1] + per[2];
      Tensor x = make(xv, {n, c}, opts()), q = make(qv, {n, c}, opts());
      Tensor wt = weighted ? make(w, {c}, opts()) : Tensor();
      expect_values(nn::cross_entropy(x, q, {.weight = wt, .reduction = Reduction::None, .label_smoothing = s}), {n},
                    per, 1e-5, 1e-6);
      expect_values(nn::cross_entropy(x, q, {.weight = wt, .reduction = Reduction::Sum, .label_smoothing = s}), {},
                    {total}, 1e-5, 1e-6);
      expect_values(nn::cross_entropy(x, q, {.weight = wt, .label_smoothing = s}), {}, {total / n}, 1e-5, 1e-6);
    }
  }
}

TEST_P(LossTest, CrossEntropyOfAnUnbatchedSample) {
  auto xv = uniform(3, -1, 1, 4);
  Tensor t = from_vector<int64_t>({2}, {}, dev());
  expect_values(nn::cross_entropy(make(xv, {3}, opts()), t, {.reduction = Reduction::None}), {},
                ce_ref(xv, {2}, 1, 3, 1, {}, -100, 0, Reduction::None));
}

TEST_P(LossTest, NllLossMatchesLoops) {
  auto xv = uniform(12, -3, 0, 5);  // (4, 3) log-probabilities (need not be normalised)
  std::vector<int64_t> tv = {1, 0, 2, 1};
  std::vector<double> w = {1, 2, 3};
  Tensor x = make(xv, {4, 3}, opts()), t = from_vector<int64_t>(tv, {4}, dev());
  double num = 0, den = 0;
  std::vector<double> per(4);
  for (int i = 0; i < 4; ++i) {
    if (tv[i] == 1) continue;  // ignored
    per[i] = -w[tv[i]] * xv[i * 3 + tv[i]];
    num += per[i];
    den += w[tv[i]];
  }
  Tensor wt = make(w, {3}, opts());
  expect_values(nn::nll_loss(x, t, {.weight = wt, .ignore_index = 1}), {}, {num / den});
  expect_values(nn::nll_loss(x, t, {.weight = wt, .ignore_index = 1, .reduction = Reduction::Sum}), {}, {num});
  expect_values(nn::nll_loss(x, t, {.weight = wt, .ignore_index = 1, .reduction = Reduction::None}), {4}, per);
}

TEST_P(LossTest, RegressionLossesMatchLoops) {
  auto av = uniform(6, -2, 2, 6), bv = uniform(6, -2, 2, 7);
  Tensor a = make(av, {2, 3}, opts()), b = make(bv, {2, 3}, opts());
  std::vector<double> se(6), ae(6), sl1(6), sl0(6);
  double beta = 0.7;
  for (int i = 0; i < 6; ++i) {
    double dd = av[i] - bv[i];
    se[i] = dd * dd;
    ae[i] = std::abs(dd);
    sl1[i] = std::abs(dd) < beta ? 0.5 * dd * dd / beta : std::abs(dd) - 0.5 * beta;
  }
  auto total = [](const std::vector<double>& v) {
    double s = 0;
    for (double e : v) s += e;
    return s;
  };
  expect_values(nn::mse_loss(a, b), {}, {total(se) / 6});
  expect_values(nn::mse_loss(a, b, {.reduction = Reduction::Sum}), {}, {total(se)});
  expect_values(nn::mse_loss(a, b, {.reduction = Reduction::None}), {2, 3}, se);
  expect_values(nn::l1_loss(a, b), {}, {total(ae) / 6});
  expect_values(nn::l1_loss(a, b, {.reduction = Reduction::None}), {2, 3}, ae);
  expect_values(nn::smooth_l1_loss(a, b, {.beta = beta}), {}, {total(sl1) / 6});
  expect_values(nn::smooth_l1_loss(a, b, {.reduction = Reduction::None, .beta = beta}), {2, 3}, sl1);
  expect_values(nn::smooth_l1_loss(a, b, {.reduction = Reduction::Sum, .beta = 0}), {}, {total(ae)});
}

TEST_P(LossTest, BinaryCrossEntropyWithLogitsMatchesTheDefinition) {
  auto xv = uniform(6, -4, 4, 8), tv = uniform(6, 0, 1, 9);
  std::vector<double> pw = {0.5, 2, 3}, w = {1, 0.5, 2};
  std::vector<double> plain(6), weighted(6);
  for (int i = 0; i < 6; ++i) {
    const double p = 1 / (1 + std::exp(-xv[i]));
    plain[i] = -(tv[i] * std::log(p) + (1 - tv[i]) * std::log(1 - p));
    weighted[i] = -w[i % 3] * (pw[i % 3] * tv[i] * std::log(p) + (1 - tv[i]) * std::log(1 - p));
  }
  Tensor x = make(xv, {2, 3}, opts()), t = make(tv, {2, 3}, opts());
  expect_values(nn::binary_cross_entropy_with_logits(x, t, {.reduction = Reduction::None}), {2, 3}, plain, 1e-5, 1e-6);
  expect_values(
      nn::binary_cross_entropy_with_logits(
          x, t, {.weight = make(w, {3}, opts()), .pos_weight = make(pw, {3}, opts()), .reduction = Reduction::None}),
      {2, 3}, weighted, 1e-5, 1e-6);
  // The stable form: a logit of 200 with target 0 costs 200, not inf.
  expect_values(nn::binary_cross_entropy_with_logits(make({200, -200}, {2}, opts()), make({0, 1}, {2}, opts()),
                                                     {.reduction = Reduction::Sum}),
                {}, {400}, 1e-6, 1e-3);
}

// Every target ignored: the mean is 0 / 0 = NaN, and every gradient is 0 (PyTorch's nll_loss), on every device and
// for both the plain and the label-smoothed cross-entropy.
TEST_P(LossTest, EveryTargetIgnoredGivesNaNMeanAndZeroGradients) {
  for (double smoothing : {0.0, 0.1}) {
    SCOPED_TRACE(::testing::Message() << "label_smoothing " << smoothing);
    Tensor logits = make(uniform(12, -1, 1, 3), {3, 4}, opts()).requires_grad_();
    Tensor target = make({-100, -100, -100}, {3}, opts(DType::Int64));
    Tensor loss = nn::cross_entropy(logits, target, {.label_smoothing = smoothing});
    EXPECT_TRUE(std::isnan(loss.item<double>()));
    loss.backward();
    expect_values(logits.grad(), {3, 4}, std::vector<double>(12, 0.0), 0, 0);
  }
  Tensor log_probs = make(uniform(6, -2, -0.1, 4), {2, 3}, opts()).requires_grad_();
  Tensor loss = nn::nll_loss(log_probs, make({-100, -100}, {2}, opts(DType::Int64)));
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  loss.backward();
  expect_values(log_probs.grad(), {2, 3}, std::vector<double>(6, 0.0), 0, 0);
}

TEST(Loss, Gradients) {
  Tensor idx = from_vector<int64_t>({0, 2, 1, 2, 1, 0}, {3, 2});
  Tensor w = make({0.5, 2, 1.5}, {3}, {.dtype = DType::Float64});
  check_gradients(
      [](const TensorList& in) {
        return TensorList{
            nn::cross_entropy(in[0], in[1], {.weight = in[2], .ignore_index = 1, .label_smoothing = 0.1})};
      },
      {make_input({3, 3, 2}, -2, 2, 1), idx, w});
  check_gradients(
      [](const TensorList& in) {
        return TensorList{nn::cross_entropy(in[0], in[1], {.reduction = Reduction::None, .label_smoothing = 0.2})};
      },
      {make_input({6, 3}, -2, 2, 2), reshape(idx, {6})});
  check_gradients(  // probability targets: gradients reach the targets too
      [](const TensorList& in) { return TensorList{nn::cross_entropy(in[0], in[1], {.weight = in[2]})}; },
      {make_input({2, 3}, -2, 2, 3), make_input({2, 3}, 0, 1, 4), w});
  check_gradients([](const TensorList& in) { return TensorList{nn::nll_loss(in[0], in[1], {.weight = in[2]})}; },
                  {make_input({6, 3}, -3, 0, 5), reshape(idx, {6}), w});
  check_gradients([](const TensorList& in) { return TensorList{nn::mse_loss(in[0], in[1])}; },
                  {make_input({2, 3}, -1, 1, 6), make_input({2, 3}, -1, 1, 7)});
  check_gradients([](const TensorList& in) { return TensorList{nn::l1_loss(in[0], in[1])}; },
                  {make_input({2, 3}, -1, 1, 8), make_input({2, 3}, 2, 3, 9)});
  check_gradients(  // |d| in [0.5, 1.5] and [2, 3] with beta 1 covers both branches
      [](const TensorList& in) { return TensorList{nn::smooth_l1_loss(in[0], in[1], {.beta = 1.0})}; },
      {make_input({2, 3}, -1.5, 1.5, 10), make_input({2, 3}, 0, 0.01, 11)});
  check_gradients(
      [](const TensorList& in) {
        return TensorList{nn::binary_cross_entropy_with_logits(in[0], in[1], {.weight = in[2], .pos_weight = in[3]})};
      },
      {make_input({2, 3}, -3, 3, 12), make_input({2, 3}, 0, 1, 13), make({1, 0.5, 2}, {3}, {.dtype = DType::Float64}),
       make({0.5, 2, 3}, {3}, {.dtype = DType::Float64})});
}

TEST(Loss, BadInput) {
  Tensor logits = zeros({4, 3});
  expect_error(
      [&] {
        nn::cross_entropy(logits, from_vector<int64_t>({0, 1, 2}, {3}));
      },
      {"cross_entropy", "[4, 3]", "(N, d1, ...)", "[3]"});
  expect_error(
      [&] {
        nn::cross_entropy(logits, from_vector<int64_t>({0, 1, 3, 0}, {4}));
      },
      {"cross_entropy", "[0, 3)", "ignore_index"});
  expect_error([&] { nn::cross_entropy(logits, zeros({4, 2})); }, {"cross_entropy", "probability", "[4, 3]", "[4, 2]"});
  expect_error(
      [&] {
        nn::cross_entropy(logits, from_vector<int64_t>({0, 1, 2, 0}, {4}), {.weight = ones({2})});
      },
      {"cross_entropy", "weight", "[3]", "[2]"});
  expect_error(
      [&] {
        nn::cross_entropy(logits, from_vector<int64_t>({0, 1, 2, 0}, {4}), {.label_smoothing = 1.5});
      },
      {"cross_entropy", "label_smoothing", "1.5"});
  expect_error([] { nn::mse_loss(zeros({2, 3}), zeros({3})); }, {"mse_loss", "[2, 3]", "[3]"});
  expect_error([] { nn::smooth_l1_loss(zeros({2}), zeros({2}), {.beta = -1}); }, {"smooth_l1_loss", "beta"});
  expect_error(
      [] {
        nn::binary_cross_entropy_with_logits(zeros({2, 3}), zeros({2, 2}));
      },
      {"binary_cross_entropy_with_logits", "[2, 3]", "[2, 2]"});
}

KILN_INSTANTIATE_BACKENDS(LossTest);

}  // namespace
}  // namespace kiln::testing
