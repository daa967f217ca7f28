// Weight initialisation: fans and gains as PyTorch computes them, and the statistics of large draws
// against the bound or std of PyTorch's formula.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "kiln/layers/embedding.h"  // nn::Embedding: built under SkipInit, and on a device
#include "kiln/layers/init.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

namespace init = nn::init;

class InitTest : public BackendTest {};

struct Stats {
  double mean = 0, std = 0, min = 1e300, max = -1e300;
};

Stats stats(const Tensor& t) {
  Stats s;
  auto v = values(t);
  for (double e : v) {
    s.mean += e;
    s.min = std::min(s.min, e);
    s.max = std::max(s.max, e);
  }
  s.mean /= static_cast<double>(v.size());
  for (double e : v) s.std += (e - s.mean) * (e - s.mean);
  s.std = std::sqrt(s.std / static_cast<double>(v.size()));
  return s;
}

// Uniform on [-bound, bound]: inside it, reaching near both ends, std bound / sqrt(3).
void expect_uniform(const Tensor& t, double bound) {
  Stats s = stats(t);
  const double slack = 1e-6 * bound;  // the bound rounded to float32
  EXPECT_GE(s.min, -bound - slack);
  EXPECT_LE(s.max, bound + slack);
  EXPECT_LT(s.min, -0.99 * bound);
  EXPECT_GT(s.max, 0.99 * bound);
  EXPECT_NEAR(s.mean, 0, 0.01 * bound);
  EXPECT_NEAR(s.std, bound / std::sqrt(3.0), 0.01 * bound);
}

void expect_normal(const Tensor& t, double std) {
  Stats s = stats(t);
  EXPECT_NEAR(s.mean, 0, 0.01 * std);
  EXPECT_NEAR(s.std, std, 0.01 * std);
}

TEST(Init, GainsAreTorchs) {
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::Linear), 1);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::Conv2d), 1);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::Sigmoid), 1);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::Tanh), 5.0 / 3);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::ReLU), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::LeakyReLU), std::sqrt(2.0 / (1 + 0.01 * 0.01)));
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::LeakyReLU, std::sqrt(5.0)), std::sqrt(2.0 / 6));
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::SELU), 0.75);
}

TEST(Init, FansOfLinearAndConvWeights) {
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(empty({10, 4})), std::make_pair(int64_t{4}, int64_t{10}));
  // Conv2d weight (out 8, in 4, 3, 5): receptive field 15.
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(empty({8, 4, 3, 5})), std::make_pair(int64_t{60}, int64_t{120}));
  // Conv1d weight (6, 2, 7).
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(empty({6, 2, 7})), std::make_pair(int64_t{14}, int64_t{42}));
  expect_error([] { init::calculate_fan_in_and_fan_out(empty({5})); }, {"fan", "at least 2 dims", "[5]"});
  expect_error(
      [] {
        Tensor t = empty({5});
        init::kaiming_uniform_(t);
      },
      {"kaiming_uniform_", "2 dims", "[5]"});
}

TEST_P(InitTest, KaimingDrawsFollowTorchsBoundAndStd) {
  Tensor w = empty({256, 64, 3, 3}, opts());  // fan_in 576, fan_out 2304
  init::kaiming_uniform_(w, 0, init::FanMode::FanIn, init::Nonlinearity::ReLU);
  expect_uniform(w, std::sqrt(2.0) * std::sqrt(3.0 / 576));
  init::kaiming_uniform_(w, std::sqrt(5.0));  // Linear's and Conv's default: bound 1 / sqrt(fan_in)
  expect_uniform(w, 1 / std::sqrt(576.0));
  init::kaiming_normal_(w, 0, init::FanMode::FanOut, init::Nonlinearity::ReLU);
  expect_normal(w, std::sqrt(2.0) / std::sqrt(2304.0));
}

TEST_P(InitTest, XavierDrawsFollowTorchsBoundAndStd) {
  Tensor w = empty({300, 200}, opts());
  init::xavier_uniform_(w, 2.0);
  expect_uniform(w, 2.0 * std::sqrt(6.0 / 500));
  init::xavier_normal_(w);
  expect_normal(w, std::sqrt(2.0 / 500));
}

TEST_P(InitTest, SimpleFills) {
  Tensor w = empty({200, 300}, opts());
  init::uniform_(w, -0.5, 0.5);
  expect_uniform(w, 0.5);
  init::normal_(w, 0, 3);
  expect_normal(w, 3);
  init::constant_(w, 2.5);
  EXPECT_EQ(stats(w).min, 2.5);
  EXPECT_EQ(stats(w).max, 2.5);
  init::ones_(w);
  EXPECT_EQ(stats(w).min, 1);
  init::zeros_(w);
  EXPECT_EQ(stats(w).max, 0);
}

TEST_P(InitTest, TruncNormalStaysInItsBoundsWithTheTruncatedMoments) {
  const double mean = 0.5, sd = 1, a = 0, b = 2;
  Tensor w = empty({400, 300}, opts());
  init::trunc_normal_(w, mean, sd, a, b);
  // Moments of N(mean, sd^2) truncated to [a, b].
  auto phi = [](double x) { return std::exp(-x * x / 2) / std::sqrt(2 * M_PI); };
  auto cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  const double al = (a - mean) / sd, be = (b - mean) / sd, z = cdf(be) - cdf(al);
  const double t_mean = mean + sd * (phi(al) - phi(be)) / z;
  const double t_var = sd * sd * (1 + (al * phi(al) - be * phi(be)) / z - std::pow((phi(al) - phi(be)) / z, 2));
  Stats s = stats(w);
  EXPECT_GE(s.min, a);
  EXPECT_LE(s.max, b);
  EXPECT_NEAR(s.mean, t_mean, 0.01);
  EXPECT_NEAR(s.std, std::sqrt(t_var), 0.01);
  // The usual small-std use: practically a plain normal.
  init::trunc_normal_(w, 0, 0.02);
  expect_normal(w, 0.02);
}

TEST_P(InitTest, ParametersAreFilledInPlaceWithoutHistoryAndGeneratorsReplay) {
  Tensor w = empty({4, 5}, opts()).requires_grad_();
  Tensor alias = w;
  Generator g1(3), g2(3);
  init::kaiming_normal_(w, 0, init::FanMode::FanIn, init::Nonlinearity::ReLU, &g1);
  EXPECT_TRUE(w.is_leaf());
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(w.grad_fn(), nullptr);
  Tensor v = empty({4, 5}, opts());
  init::kaiming_normal_(v, 0, init::FanMode::FanIn, init::Nonlinearity::ReLU, &g2);
  EXPECT_EQ(values(alias), values(v));
  Generator g3(9), g4(9);
  init::trunc_normal_(w, 0, 1, -2, 2, &g3);
  init::trunc_normal_(v, 0, 1, -2, 2, &g4);
  EXPECT_EQ(values(w), values(v));
}

TEST_P(InitTest, UnderSkipInitNothingIsWrittenOrDrawnAndArgumentsAreStillChecked) {
  Tensor w = full({4, 6}, 7.0, opts());
  {
    nn::SkipInit skip;
    {
      nn::SkipInit nested;
      EXPECT_TRUE(nn::SkipInit::active());
    }
    EXPECT_TRUE(nn::SkipInit::active());  // the outer guard still skips
    Generator g(1);
    init::uniform_(w, -1, 1, &g);
    init::normal_(w, 0, 1, &g);
    init::zeros_(w);
    init::ones_(w);
    init::kaiming_uniform_(w, 0, init::FanMode::FanIn, init::Nonlinearity::ReLU, &g);
    init::xavier_normal_(w, 1, &g);
    init::trunc_normal_(w, 0, 1, -2, 2, &g);
    EXPECT_EQ(values(w), std::vector<double>(24, 7.0));
    // g drew nothing: its next number is its first.
    Generator fresh(1);
    EXPECT_EQ(values(rand({3}, opts(), &g)), values(rand({3}, opts(), &fresh)));
    EXPECT_THROW(init::uniform_(w, 1, -1), Error);  // bad arguments are still refused
    EXPECT_THROW(init::normal_(w, 0, -1), Error);
    // Another thread initialises as usual.
    bool other_thread_active = true;
    std::thread([&] { other_thread_active = nn::SkipInit::active(); }).join();
    EXPECT_FALSE(other_thread_active);
  }
  EXPECT_FALSE(nn::SkipInit::active());
  Generator g(1), h(1);
  init::normal_(w, 0, 1, &g);
  EXPECT_EQ(values(w), values(normal({4, 6}, 0, 1, opts(), &h)));
}

TEST_P(InitTest, AModuleBuiltUnderSkipInitLeavesTheDefaultGeneratorWhereItWas) {
  manual_seed(11);
  const std::vector<double> expected = values(rand({5}, opts()));
  manual_seed(11);
  {
    nn::SkipInit skip;
    nn::Embedding table(1000, 8, {.padding_idx = 3, .device = GetParam()});
    EXPECT_EQ(table.weight.device(), GetParam());
    EXPECT_EQ(table.weight.shape(), (Shape{1000, 8}));
  }
  EXPECT_EQ(values(rand({5}, opts())), expected);
}

TEST_P(InitTest, AnEmbeddingMadeOnADeviceDrawsTheNumbersOfOneMadeOnTheHost) {
  manual_seed(5);
  nn::Embedding host(300, 4, {.padding_idx = 2});
  Generator g(8), h(8);
  host.reset_parameters(&g);
  nn::Embedding there(300, 4, {.padding_idx = 2, .device = GetParam()});
  EXPECT_EQ(there.weight.device(), GetParam());
  there.reset_parameters(&h);
  EXPECT_EQ(values(there.weight), values(host.weight));
  EXPECT_EQ(values(there.weight.select(0, 2)), std::vector<double>(4, 0.0));  // the padding row
}

KILN_INSTANTIATE_BACKENDS(InitTest);

}  // namespace
}  // namespace kiln::testing
