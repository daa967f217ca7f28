// nn::linear, nn::dropout, the normalisations, nn::dropout_add_layer_norm and nn::embedding: values against plain
// double loops, gradients with check_gradients, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kiln/layers/functional.h"
#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class FunctionalTest : public ExactFloat32Test {};  // float32 references: no TF32

// y[r, o] = sum_i x[r, i] * w[o, i] + b[o] over rows r of x (..., in).
std::vector<double> linear_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                               int64_t rows, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0 : b[o];
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[o * in + i];
      y[r * out + o] = acc;
    }
  }
  return y;
}

TEST_P(FunctionalTest, LinearMatchesLoopsForOneTwoAndThreeDims) {
  auto xv = uniform(2 * 2 * 3, -1, 1, 1), wv = uniform(4 * 3, -1, 1, 2), bv = uniform(4, -1, 1, 3);
  Tensor w = make(wv, {4, 3}, opts()), b = make(bv, {4}, opts());
  expect_values(nn::linear(make(xv, {4, 3}, opts()), w, b), {4, 4}, linear_ref(xv, wv, bv, 4, 3, 4));
  expect_values(nn::linear(make(xv, {2, 2, 3}, opts()), w, b), {2, 2, 4}, linear_ref(xv, wv, bv, 4, 3, 4));
  expect_values(nn::linear(make(xv, {4, 3}, opts()), w), {4, 4}, linear_ref(xv, wv, {}, 4, 3, 4));
  std::vector<double> x1(xv.begin(), xv.begin() + 3);
  expect_values(nn::linear(make(x1, {3}, opts()), w, b), {4}, linear_ref(x1, wv, bv, 1, 3, 4));
}

TEST(Functional, LinearGradients) {
  auto fn = [](const TensorList& in) { return TensorList{nn::linear(in[0], in[1], in[2])}; };
  check_gradients(fn, {make_input({3, 4}, -1, 1, 1), make_input({2, 4}, -1, 1, 2), make_input({2}, -1, 1, 3)});
  check_gradients(fn, {make_input({2, 3, 4}, -1, 1, 1), make_input({2, 4}, -1, 1, 2), make_input({2}, -1, 1, 3)});
  check_gradients([](const TensorList& in) { return TensorList{nn::linear(in[0], in[1])}; },
                  {make_input({3, 4}, -1, 1, 4), make_input({5, 4}, -1, 1, 5)});
}

TEST(Functional, LinearBadShapes) {
  expect_error([] { nn::linear(zeros({2, 3}), zeros({4, 5})); }, {"linear", "in_features = 5", "[2, 3]"});
  expect_error([] { nn::linear(zeros({2, 3}), zeros({4, 3}), zeros({5})); }, {"linear", "bias", "[4]", "[5]"});
  expect_error([] { nn::linear(zeros({2, 3}), zeros({3})); }, {"linear", "weight", "2-D"});
}

TEST_P(FunctionalTest, DropoutIsTheIdentityInEvalOrWithPZero) {
  Tensor x = make({1, 2, 3, 4}, {4}, opts());
  EXPECT_TRUE(nn::dropout(x, 0.5, /*training=*/false).is_same(x));
  EXPECT_TRUE(nn::dropout(x, 0.0, /*training=*/true).is_same(x));
}

TEST_P(FunctionalTest, DropoutZeroesAboutPAndScalesTheRest) {
  const int64_t n = 20000;
  const double p = 0.3;
  Tensor x = ones({n}, opts()).requires_grad_();
  Tensor y = nn::dropout(x, p, true);
  auto v = values(y);
  int64_t zeros_seen = 0;
  for (double e : v) {
    if (e == 0) {
      ++zeros_seen;
    } else {
      ASSERT_NEAR(e, 1 / (1 - p), 1e-6);
    }
  }
  // Binomial(n, p): std sqrt(n p (1 - p)) ~ 65; 5 std.
  EXPECT_NEAR(static_cast<double>(zeros_seen), p * n, 5 * std::sqrt(n * p * (1 - p)));
  // The gradient is the mask: 0 or 1 / (1 - p), where the output is.
  y.sum().backward();
  EXPECT_EQ(values(x.grad()), v);
}

TEST_P(FunctionalTest, DropoutFollowsItsGenerator) {
  Tensor x = ones({64}, opts());
  Generator g1(5), g2(5);
  EXPECT_EQ(values(nn::dropout(x, 0.5, true, &g1)), values(nn::dropout(x, 0.5, true, &g2)));
}

TEST(Functional, DropoutRejectsPOutsideZeroOne) {
  expect_error([] { nn::dropout(ones({2}), 1.0, true); }, {"dropout", "[0, 1)", "1"});
  expect_error([] { nn::dropout(ones({2}), -0.1, false); }, {"dropout", "[0, 1)", "-0.1"});
  expect_error([] { nn::dropout(ones({2}, {.dtype = DType::Int64}), 0.5, true); },
               {"dropout", "floating point", "int64"});
}

// nn::dropout is one kernel now; for the same seed it gives what it gave as bernoulli, scale, multiply
// (the same output bits and gradient), and leaves the generator where that left it.
TEST_P(FunctionalTest, DropoutEqualsTheComposedDropoutForTheSameSeed) {
  const double p = 0.2;
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator gx(6), g_old(41), g_new(41);
    Tensor x = randn({4, 8, 24}, opts(dt), &gx).requires_grad_();
    Tensor mask = bernoulli(x.shape(), 1 - p, x.options(), &g_old);
    mask.mul_(1.0 / (1.0 - p));
    Tensor y_old = x.detach() * mask;
    Tensor y = nn::dropout(x, p, true, &g_new);
    EXPECT_EQ(values(y), values(y_old));
    EXPECT_EQ(g_new.state(), g_old.state());
    ASSERT_NE(y.grad_fn(), nullptr);
    EXPECT_EQ(y.grad_fn()->name(), "DropoutBackward");
    // d/dx sum(y * w) = w * mask, one rounding as the composed MulBackward's g * mask.
    Tensor w = randn(x.shape(), opts(dt), &gx);
    (y * w).sum().backward();
    EXPECT_EQ(values(x.grad()), values(w * mask));
  }
}

// gradcheck in float64 with a fresh generator per call (the same mask each time the function runs), and on
// the GPU the same gradients as on the CPU (the same seed gives the same mask there).
TEST(Functional, DropoutGradients) {
  for (double p : {0.25, 0.6}) {
    check_gradients(
        [p](const TensorList& in) {
          Generator g(13);
          return TensorList{nn::dropout(in[0], p, true, &g)};
        },
        {make_input({5, 7}, -1, 1, 2)});
  }
}

// Normalises each of `rows` consecutive runs of `len` values (biased variance), then y * w[j % wlen] + b.
std::vector<double> normalize_rows(const std::vector<double>& x, int64_t rows, int64_t len, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < len; ++j) m += x[r * len + j];
    m /= static_cast<double>(len);
    for (int64_t j = 0; j < len; ++j) v += (x[r * len + j] - m) * (x[r * len + j] - m);
    v /= static_cast<double>(len);
    for (int64_t j = 0; j < len; ++j) y[r * len + j] = (x[r * len + j] - m) / std::sqrt(v + eps);
  }
  return y;
}

TEST_P(FunctionalTest, LayerNormMatchesTheFormula) {
  // x (2, 3, 4) normalised over the last two dims (3, 4), weight and bias (3, 4).
  auto xv = uniform(24, -2, 2, 1), wv = uniform(12, 0.5, 1.5, 2), bv = uniform(12, -1, 1, 3);
  auto ref = normalize_rows(xv, 2, 12, 1e-5);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = ref[i] * wv[i % 12] + bv[i % 12];
  Tensor y = nn::layer_norm(make(xv, {2, 3, 4}, opts()), {3, 4}, make(wv, {3, 4}, opts()), make(bv, {3, 4}, opts()));
  expect_values(y, {2, 3, 4}, ref, 1e-5, 1e-5);
  // Without affine parameters, over the last dim only.
  expect_values(nn::layer_norm(make(xv, {6, 4}, opts()), {4}), {6, 4}, normalize_rows(xv, 6, 4, 1e-5), 1e-5, 1e-5);
}

TEST(Functional, LayerNormGradients) {
  check_gradients([](const TensorList& in) { return TensorList{nn::layer_norm(in[0], {4}, in[1], in[2])}; },
                  {make_input({3, 4}, -2, 2, 1), make_input({4}, 0.5, 1.5, 2), make_input({4}, -1, 1, 3)});
  check_gradients(
      [](const TensorList& in) {
        return TensorList{nn::layer_norm(in[0], {2, 3})};
      },
      {make_input({2, 2, 3}, -2, 2, 4)});
}

TEST_P(FunctionalTest, AddLayerNormIsLayerNormOfTheSum) {
  const auto xv = uniform(6 * 8, -1, 1, 31), rv = uniform(6 * 8, -2, 2, 32), wv = uniform(8, 0.5, 1.5, 33),
             bv = uniform(8, -1, 1, 34);
  Tensor x = make(xv, {2, 3, 8}, opts()).requires_grad_(), r = make(rv, {2, 3, 8}, opts()).requires_grad_();
  Tensor w = make(wv, {8}, opts()), b = make(bv, {8}, opts());
  std::vector<double> sum(xv.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = xv[i] + rv[i];
  std::vector<double> want = normalize_rows(sum, 6, 8, 1e-5);
  for (size_t i = 0; i < want.size(); ++i) want[i] = want[i] * wv[i % 8] + bv[i % 8];
  Tensor y = nn::add_layer_norm(x, r, {8}, w, b);
  expect_values(y, {2, 3, 8}, want, 1e-5, 1e-5);
  // Both inputs get the gradient of the sum.
  y.backward(make(uniform(48, -1, 1, 35), {2, 3, 8}, opts()));
  expect_values(x.grad(), {2, 3, 8}, values(r.grad()), 1e-6, 1e-6);
  expect_error([&] { nn::add_layer_norm(x, make(rv, {6, 8}, opts()), {8}); }, {"add_layer_norm", "[2, 3, 8]", "[6, 8]"});
  expect_error([&] { nn::add_layer_norm(x, Tensor(), {8}); }, {"add_layer_norm", "defined"});
  expect_error([&] { nn::add_layer_norm(x, r, {5}); }, {"layer_norm", "normalized_shape [5]"});
}

TEST(Functional, AddLayerNormGradients) {
  check_gradients(
      [](const TensorList& in) { return TensorList{nn::add_layer_norm(in[0], in[1], {4}, in[2], in[3])}; },
      {make_input({3, 4}), make_input({3, 4}, -1, 1, 8), make_input({4}, 0.5, 1.5, 9), make_input({4}, -1, 1, 10)});
}

// nn::dropout_add_layer_norm: against a double reference of layer_norm(x * mask + residual) with the mask nn::dropout
// draws from the same generator state (on the GPU the fused kernels), and exactly the unfused dropout then
// add_layer_norm: the same output and gradients, the generator left in the same state.
TEST_P(FunctionalTest, DropoutAddLayerNormIsDropoutThenAddLayerNorm) {
  const int64_t rows = 12, d = 64;
  const double p = 0.3, eps = 1e-5;
  const auto rv = uniform(rows * d, -2, 2, 42), wv = uniform(d, 0.5, 1.5, 43), bv = uniform(d, -1, 1, 44),
             gv = uniform(rows * d, -1, 1, 45);
  for (DType x_dtype : {DType::Float32, DType::BFloat16}) {  // BFloat16: a sublayer's output onto a Float32 stream
    SCOPED_TRACE(dtype_name(x_dtype));
    const auto xv = values(make(uniform(rows * d, -1, 1, 41), {rows * d}, opts(x_dtype)));  // as stored
    auto inputs = [&] {
      return TensorList{make(xv, {2, rows / 2, d}, opts(x_dtype)).requires_grad_(),
                        make(rv, {2, rows / 2, d}, opts()).requires_grad_(), make(wv, {d}, opts()).requires_grad_(),
                        make(bv, {d}, opts()).requires_grad_()};
    };
    const TensorList a = inputs(), b = inputs();
    Generator g_fused(91), g_plain(91), g_mask(91);
    Tensor y = nn::dropout_add_layer_norm(a[0], a[1], p, true, {d}, a[2], a[3], eps, &g_fused);
    Tensor y_plain = nn::add_layer_norm(nn::dropout(b[0], p, true, &g_plain), b[1], {d}, b[2], b[3], eps);
    // The mask: what nn::dropout draws from that state for a tensor of ones (0 or 1 / (1 - p) in x's dtype).
    const auto mask = values(nn::dropout(ones({2, rows / 2, d}, opts(x_dtype)), p, true, &g_mask));
    const auto dropped = std::count(mask.begin(), mask.end(), 0.0);
    EXPECT_GT(dropped, 0);
    EXPECT_LT(dropped, rows * d / 2);
    std::vector<double> sum(xv.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = xv[i] * mask[i];
    sum = values(make(sum, {rows * d}, opts(x_dtype)));  // x * mask rounded to x's dtype, as the dropout stores it
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += rv[i];
    std::vector<double> want = normalize_rows(sum, rows, d, eps);
    for (size_t i = 0; i < want.size(); ++i) want[i] = want[i] * wv[i % d] + bv[i % d];
    expect_values(y, {2, rows / 2, d}, want, 1e-5, 1e-5);
    EXPECT_EQ(values(y), values(y_plain));
    EXPECT_EQ(g_fused.state(), g_plain.state());
    // Gradients: the residual takes the gradient of the sum, x that times the mask; both as the unfused ops give them.
    y.backward(make(gv, {2, rows / 2, d}, opts()));
    y_plain.backward(make(gv, {2, rows / 2, d}, opts()));
    ASSERT_EQ(a[0].grad().dtype(), x_dtype);
    const auto dsum = values(a[1].grad());
    std::vector<double> dx(dsum.size());
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = dsum[i] * mask[i];
    const double xtol = x_dtype == DType::Float32 ? 1e-6 : 1e-2;
    expect_values(a[0].grad(), {2, rows / 2, d}, dx, xtol, xtol);
    for (size_t k = 0; k < a.size(); ++k) {
      SCOPED_TRACE(k);
      EXPECT_EQ(values(a[k].grad()), values(b[k].grad()));
    }
  }
}

TEST_P(FunctionalTest, DropoutAddLayerNormInEvalOrWithPZeroIsAddLayerNorm) {
  const auto xv = uniform(4 * 16, -1, 1, 51), rv = uniform(4 * 16, -1, 1, 52);
  Tensor x = make(xv, {4, 16}, opts()), r = make(rv, {4, 16}, opts());
  const auto want = values(nn::add_layer_norm(x, r, {16}));
  Generator g(3);
  const GeneratorState before = g.state();
  EXPECT_EQ(values(nn::dropout_add_layer_norm(x, r, 0.4, /*training=*/false, {16}, {}, {}, 1e-5, &g)), want);
  EXPECT_EQ(values(nn::dropout_add_layer_norm(x, r, 0.0, /*training=*/true, {16}, {}, {}, 1e-5, &g)), want);
  EXPECT_EQ(g.state(), before);  // no draw
  // Training with p > 0 drops something.
  EXPECT_NE(values(nn::dropout_add_layer_norm(x, r, 0.4, true, {16}, {}, {}, 1e-5, &g)), want);
  EXPECT_NE(g.state(), before);
}

// gradcheck in float64 with a fresh generator per call (the same mask every time the function runs); on the GPU
// the same gradients as on the CPU (the same seed gives the same mask there).
TEST(Functional, DropoutAddLayerNormGradients) {
  check_gradients(
      [](const TensorList& in) {
        Generator g(29);
        return TensorList{nn::dropout_add_layer_norm(in[0], in[1], 0.4, true, {4}, in[2], in[3], 1e-5, &g)};
      },
      {make_input({5, 4}), make_input({5, 4}, -1, 1, 8), make_input({4}, 0.5, 1.5, 9), make_input({4}, -1, 1, 10)});
}

TEST(Functional, DropoutAddLayerNormBadInput) {
  Tensor x = zeros({2, 3, 8}), r = zeros({2, 3, 8});
  Generator g(5);
  const GeneratorState before = g.state();
  auto call = [&](const Tensor& xx, const Tensor& rr, double p, const Shape& shape, const Tensor& w = {}) {
    return [&, xx, rr, p, shape, w] { nn::dropout_add_layer_norm(xx, rr, p, true, shape, w, {}, 1e-5, &g); };
  };
  expect_error(call(x, r, 1.0, {8}), {"dropout_add_layer_norm", "[0, 1)", "1"});
  expect_error(call(x, r, -0.1, {8}), {"dropout_add_layer_norm", "[0, 1)", "-0.1"});
  expect_error([&] { nn::dropout_add_layer_norm(x, r, 1.5, false, {8}); }, {"dropout_add_layer_norm", "[0, 1)"});
  expect_error(call(x, zeros({6, 8}), 0.1, {8}), {"dropout_add_layer_norm", "one shape", "[2, 3, 8]", "[6, 8]"});
  expect_error(call(x, Tensor(), 0.1, {8}), {"dropout_add_layer_norm", "defined"});
  expect_error(call(x, r, 0.1, {5}), {"dropout_add_layer_norm", "normalized_shape [5]", "[2, 3, 8]"});
  expect_error(call(x, r, 0.1, {}), {"dropout_add_layer_norm", "normalized_shape"});
  expect_error(call(x, r, 0.1, {8}, ones({5})), {"dropout_add_layer_norm", "weight", "[5]", "[8]"});
  expect_error(call(zeros({2, 8}, {.dtype = DType::Int64}), zeros({2, 8}, {.dtype = DType::Int64}), 0.1, {8}),
               {"dropout_add_layer_norm", "floating point", "int64"});
  EXPECT_EQ(g.state(), before);  // a refused call draws nothing
}

TEST(Functional, LayerNormBadShapes) {
  expect_error([] { nn::layer_norm(zeros({2, 5}), {4}); }, {"layer_norm", "normalized_shape [4]", "[2, 5]"});
  expect_error([] { nn::layer_norm(zeros({2, 4}), {4}, ones({5})); }, {"layer_norm", "weight", "[5]", "[4]"});
}

TEST_P(FunctionalTest, GroupNormMatchesTheFormula) {
  // x (2, 4, 3): 2 groups of 2 channels; each group of a sample is 6 consecutive values.
  auto xv = uniform(24, -2, 2, 5), wv = uniform(4, 0.5, 1.5, 6), bv = uniform(4, -1, 1, 7);
  auto ref = normalize_rows(xv, 4, 6, 1e-5);
  for (size_t i = 0; i < ref.size(); ++i) {
    const size_t c = (i / 3) % 4;
    ref[i] = ref[i] * wv[c] + bv[c];
  }
  Tensor y = nn::group_norm(make(xv, {2, 4, 3}, opts()), 2, make(wv, {4}, opts()), make(bv, {4}, opts()));
  expect_values(y, {2, 4, 3}, ref, 1e-5, 1e-5);
}

TEST(Functional, GroupNormGradients) {
  check_gradients([](const TensorList& in) { return TensorList{nn::group_norm(in[0], 2, in[1], in[2])}; },
                  {make_input({2, 4, 3}, -2, 2, 1), make_input({4}, 0.5, 1.5, 2), make_input({4}, -1, 1, 3)});
}

TEST(Functional, GroupNormBadShapes) {
  expect_error([] { nn::group_norm(zeros({2, 6, 3}), 4); }, {"group_norm", "C = 6", "num_groups = 4", "[2, 6, 3]"});
  expect_error([] { nn::group_norm(zeros({6}), 2); }, {"group_norm", "(N, C, *)", "[6]"});
}

// x (N, C, L): per-channel mean and biased variance over N and L.
void channel_stats(const std::vector<double>& x, int64_t n, int64_t c, int64_t l, std::vector<double>& m,
                   std::vector<double>& v) {
  m.assign(static_cast<size_t>(c), 0);
  v.assign(static_cast<size_t>(c), 0);
  for (int64_t k = 0; k < c; ++k) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < l; ++j) m[k] += x[(i * c + k) * l + j];
    m[k] /= static_cast<double>(n * l);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < l; ++j) v[k] += std::pow(x[(i * c + k) * l + j] - m[k], 2);
    v[k] /= static_cast<double>(n * l);
  }
}

TEST_P(FunctionalTest, BatchNormTrainingUsesBatchStatisticsAndUpdatesTheRunningOnes) {
  const int64_t n = 3, c = 2, l = 4;
  auto xv = uniform(n * c * l, -2, 2, 8), wv = uniform(c, 0.5, 1.5, 9), bv = uniform(c, -1, 1, 10);
  std::vector<double> m, v;
  channel_stats(xv, n, c, l, m, v);
  std::vector<double> ref(xv.size());
  for (int64_t i = 0; i < n * c * l; ++i) {
    const int64_t k = (i / l) % c;
    ref[i] = (xv[i] - m[k]) / std::sqrt(v[k] + 1e-5) * wv[k] + bv[k];
  }
  Tensor rm = make({0.5, -0.5}, {2}, opts()), rv = make({2, 3}, {2}, opts());
  Tensor y = nn::batch_norm(make(xv, {n, c, l}, opts()), rm, rv, make(wv, {c}, opts()), make(bv, {c}, opts()),
                            /*training=*/true, /*momentum=*/0.2);
  expect_values(y, {n, c, l}, ref, 1e-5, 1e-5);
  const double unbias = static_cast<double>(n * l) / static_cast<double>(n * l - 1);
  expect_values(rm, {2}, {0.8 * 0.5 + 0.2 * m[0], 0.8 * -0.5 + 0.2 * m[1]}, 1e-5, 1e-6);
  expect_values(rv, {2}, {0.8 * 2 + 0.2 * v[0] * unbias, 0.8 * 3 + 0.2 * v[1] * unbias}, 1e-5, 1e-6);
}

TEST_P(FunctionalTest, BatchNormEvalUsesTheRunningStatistics) {
  auto xv = uniform(6, -2, 2, 11);  // (3, 2)
  Tensor rm = make({0.5, -0.5}, {2}, opts()), rv = make({2, 3}, {2}, opts());
  std::vector<double> ref(6);
  const double mean_of[2] = {0.5, -0.5}, var_of[2] = {2, 3};
  for (int i = 0; i < 6; ++i) ref[i] = (xv[i] - mean_of[i % 2]) / std::sqrt(var_of[i % 2] + 1e-3) * 2 + 1;
  Tensor y = nn::batch_norm(make(xv, {3, 2}, opts()), rm, rv, full({2}, 2.0, opts()), full({2}, 1.0, opts()),
                            /*training=*/false, 0.1, /*eps=*/1e-3);
  expect_values(y, {3, 2}, ref, 1e-5, 1e-5);
  expect_values(rm, {2}, {0.5, -0.5});  // unchanged
}

TEST(Functional, BatchNormTrainingGradients) {
  check_gradients(
      [](const TensorList& in) {
        // Running statistics on the inputs' device: check_gradients repeats fn on every test device.
        const TensorOptions on = {.dtype = DType::Float64, .device = in[0].device()};
        return TensorList{nn::batch_norm(in[0], zeros({3}, on), ones({3}, on), in[1], in[2], true)};
      },
      {make_input({4, 3, 2}, -2, 2, 1), make_input({3}, 0.5, 1.5, 2), make_input({3}, -1, 1, 3)});
  check_gradients([](const TensorList& in) { return TensorList{nn::batch_norm(in[0], {}, {}, {}, {}, true)}; },
                  {make_input({5, 2}, -2, 2, 4)});
}

TEST(Functional, BatchNormBadInput) {
  expect_error(
      [] {
        nn::batch_norm(zeros({1, 3}), {}, {}, {}, {}, true);
      },
      {"batch_norm", "more than 1 value per channel", "[1, 3]"});
  expect_error(
      [] {
        nn::batch_norm(zeros({2, 3}), zeros({4}), ones({4}), {}, {}, true);
      },
      {"batch_norm", "running_mean", "[4]", "[3]"});
  expect_error([] { nn::batch_norm(zeros({2, 3}), {}, {}, {}, {}, false); }, {"batch_norm", "eval", "running_mean"});
}

TEST_P(FunctionalTest, EmbeddingPicksRowsAndThePaddingRowGetsNoGradient) {
  Tensor w = make({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}, opts()).requires_grad_();
  Tensor idx = from_vector<int64_t>({3, 0, 1, 0, 2, 3}, {2, 3}, dev());
  Tensor y = nn::embedding(idx, w, /*padding_idx=*/0);
  expect_values(y, {2, 3, 2}, {30, 31, 0, 1, 10, 11, 0, 1, 20, 21, 30, 31});
  y.sum().backward();
  // Each row's gradient counts its lookups; row 0 (padding) gets none.
  expect_values(w.grad(), {4, 2}, {0, 0, 1, 1, 1, 1, 2, 2});
  // A negative padding_idx counts from the end: row 3.
  w.mutable_grad() = Tensor();
  nn::embedding(idx, w, -1).sum().backward();
  expect_values(w.grad(), {4, 2}, {2, 2, 1, 1, 1, 1, 0, 0});
}

TEST(Functional, EmbeddingGradients) {
  Tensor idx = from_vector<int64_t>({2, 0, 2, 1}, {2, 2});
  check_gradients([idx](const TensorList& in) { return TensorList{nn::embedding(idx.to(in[0].device()), in[0])}; },
                  {make_input({3, 2}, -1, 1, 1)});
}

TEST(Functional, EmbeddingBadInput) {
  expect_error([] { nn::embedding(zeros({2}), zeros({3, 2})); }, {"embedding", "Int64", "float32"});
  expect_error(
      [] {
        nn::embedding(zeros({2}, {.dtype = DType::Int64}), zeros({3, 2}), 3);
      },
      {"embedding", "padding_idx 3", "3 embeddings"});
}

// A bfloat16 input with float32 parameters and running statistics: float32 math, the input's dtype out (as PyTorch
// and the GPU kernel), on every device; values against the float32 computation rounded once.
TEST_P(FunctionalTest, BatchNormOfBFloat16InputWithFloat32ParametersKeepsBFloat16) {
  const auto xv = values(make(uniform(24, -2, 2, 31), {24}, {.dtype = DType::BFloat16}));
  Tensor x = make(xv, {4, 3, 2}, opts(DType::BFloat16));
  Tensor w = make({1.5, 0.5, 1.0}, {3}, opts()), b = make({0.1, -0.2, 0.3}, {3}, opts());
  Tensor rm = zeros({3}, opts()), rv = ones({3}, opts());
  Tensor y = nn::batch_norm(x, rm, rv, w, b, /*training=*/true);
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  EXPECT_EQ(rm.dtype(), DType::Float32);
  Tensor y32 = nn::batch_norm(x.to(DType::Float32), zeros({3}, opts()), ones({3}, opts()), w, b, true);
  expect_values(y, {4, 3, 2}, values(y32.to(DType::BFloat16)), 1e-2, 1e-2);
}

KILN_INSTANTIATE_BACKENDS(FunctionalTest);

}  // namespace
}  // namespace kiln::testing
