// Conformance of the fused activation gradients (internal::gelu_backward in both forms, internal::silu_backward,
// internal::relu_backward: g * f'(x) in one pass): values against float64 references of the derivatives written
// here from their definitions, in every floating dtype, with the tolerance of one rounding of the result;
// zero, large magnitudes, and the limits at ±inf and NaN (test_special_values.cpp has every edge); layouts,
// broadcasting, promotion, long runs, empty tensors and the errors.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace kiln::testing {
namespace {

constexpr double kPi = 3.14159265358979323846;

// The derivatives, in double, from the definitions (not from kiln's formulas).
double gelu_grad_ref(double x) {  // d/dx [x Φ(x)] = Φ(x) + x φ(x)
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * kPi);
}
double gelu_tanh_grad_ref(double x) {  // d/dx [x/2 (1 + tanh(u))], u = sqrt(2/pi) (x + 0.044715 x^3)
  const double k = std::sqrt(2.0 / kPi), u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
  const double du = k * (1.0 + 3.0 * 0.044715 * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}
double silu_grad_ref(double x) {  // d/dx [x σ(x)] = σ(x) + x σ(x) (1 - σ(x))
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s + x * s * (1.0 - s);
}
double relu_grad_ref(double y) { return y > 0 ? 1.0 : 0.0; }

struct ActivationCase {
  const char* name;
  std::function<Tensor(const Tensor& g, const Tensor& x)> op;
  double (*derivative)(double);
  // The absolute error of f' in float32, beyond one rounding: the tanh form computes 1 - t^2 with t = tanh(u)
  // within an ulp of +-1 for |x| in [3, 8], an absolute error of ~1e-7 that the factor x/2 k (1 + 3 c x^2)
  // (up to ~30) scales (as in PyTorch, whose formula this is).
  double atol = 1e-6;
};

std::vector<ActivationCase> activation_cases() {
  return {
      {"gelu", [](const Tensor& g, const Tensor& x) { return internal::gelu_backward(g, x); }, gelu_grad_ref},
      {"gelu_tanh", [](const Tensor& g, const Tensor& x) { return internal::gelu_backward(g, x, true); },
       gelu_tanh_grad_ref, 8e-6},
      {"silu", [](const Tensor& g, const Tensor& x) { return internal::silu_backward(g, x); }, silu_grad_ref},
      {"relu", [](const Tensor& g, const Tensor& y) { return internal::relu_backward(g, y); }, relu_grad_ref},
  };
}

// One rounding of a result computed in (at least) float32: half an ulp of the dtype, relative, with a small
// absolute term (the case's) for results near a zero of f' (gelu' has one at x ~ -0.75, silu' at x ~ -2.4)
// and in the tails, where float32's own error shows.
double rtol_of(DType dtype) {
  switch (dtype) {
    case DType::BFloat16: return 4e-3;  // 2^-8
    case DType::Float16: return 6e-4;   // 2^-11, and a margin
    case DType::Float32: return 1e-5;
    default: return 1e-12;
  }
}
double atol_of(DType dtype, double float32_atol = 1e-6) { return dtype == DType::Float64 ? 1e-13 : float32_atol; }

// The reference from g and x as the dtype holds them, so only the op's own error counts.
std::vector<double> reference(const ActivationCase& c, const Tensor& g, const Tensor& x) {
  const std::vector<double> vg = values(g), vx = values(x);
  std::vector<double> r(vg.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = vg[i] * c.derivative(vx[i]);
  return r;
}

void check_case(const ActivationCase& c, const Tensor& g, const Tensor& x) {
  SCOPED_TRACE(::testing::Message() << c.name << " on " << x.dtype() << " " << ::testing::PrintToString(x.shape())
                                    << " strides " << ::testing::PrintToString(x.strides()));
  const Tensor dx = c.op(g, x);
  EXPECT_EQ(dx.dtype(), x.dtype());
  EXPECT_EQ(dx.device(), x.device());
  double g_max = 1;
  for (double v : values(g)) g_max = std::max(g_max, std::abs(v));
  expect_values(dx, x.shape(), reference(c, g, x), rtol_of(x.dtype()), atol_of(x.dtype(), c.atol) * g_max);
}

// 0, both signs, the region where f' changes fastest, and magnitudes where erf, tanh and sigmoid saturate.
const std::vector<double> kInputs = {0,    -0.0, 1e-3, -1e-3, 0.25,  -0.25, 0.5,  -0.5, -0.75, 1,      -1,  1.5,
                                     -1.5, 2,    -2,   3,     -3,    4.5,   -4.5, 6,    -6,    10,     -10, 30,
                                     -30,  100,  -100, 1000,  -1000, 0.7,   -0.7, 2.25, -2.25, -0.375, 5,   -5};

class ActivationBackwardTest : public BackendTest {};

TEST_P(ActivationBackwardTest, MatchesFloat64ReferencesInEveryFloatingDtype) {
  const auto n = static_cast<int64_t>(kInputs.size());
  for (const auto& c : activation_cases()) {
    for (DType dt : kFloatTypes) {
      const Tensor x = make(kInputs, {6, n / 6}, opts(dt));
      const Tensor g = make(uniform(n, -2, 2, 3), {6, n / 6}, opts(dt));
      check_case(c, g, x);
      check_case(c, ones({6, n / 6}, opts(dt)), x);  // f'(x) itself, rounded once
    }
  }
}

// Strided, transposed and channels-last operands, and the contiguous and buffered CPU paths over runs longer
// than one block (a float32 run is mapped whole, a bfloat16 one converted block by block).
TEST_P(ActivationBackwardTest, LayoutsAndLongRuns) {
  for (const auto& c : activation_cases()) {
    for (DType dt : {DType::Float32, DType::BFloat16}) {
      const Tensor x = make(uniform(24, -5, 5, 5), {4, 6}, opts(dt));
      const Tensor g = make(uniform(24, -2, 2, 6), {4, 6}, opts(dt));
      check_case(c, non_contiguous(g), non_contiguous(x));
      check_case(c, g.transpose(0, 1), x.transpose(0, 1));
      check_case(c, g, non_contiguous(x));
      const Tensor xc = make(uniform(48, -5, 5, 7), {2, 3, 4, 2}, opts(dt)).contiguous(MemoryFormat::ChannelsLast);
      const Tensor gc = make(uniform(48, -2, 2, 8), {2, 3, 4, 2}, opts(dt)).contiguous(MemoryFormat::ChannelsLast);
      EXPECT_TRUE(c.op(gc, xc).is_contiguous(MemoryFormat::ChannelsLast)) << c.name;
      check_case(c, gc, xc);
      const int64_t n = 100003;  // over two CPU grains, not a multiple of the block or of a CUDA vector
      check_case(c, make(uniform(n, -2, 2, 9), {n}, opts(dt)), make(uniform(n, -8, 8, 10), {n}, opts(dt)));
    }
  }
}

// The limits at ±inf (kiln/tensor/README.md, "Special values"): gelu' (both forms) and silu' are 1 at +inf and 0
// at -inf, where the formulas give inf * 0 = NaN (and PyTorch gives NaN); a NaN input gives NaN; the incoming
// gradient multiplies by IEEE rules (inf * 0 = NaN, NaN * anything = NaN). ReLU's mask is y > 0: a NaN or zero
// result passes no gradient, whatever g holds (NaN and inf included); a positive one passes g as it is. The
// values sit in a vector long enough for a CPU's vectorised body and its scalar tail, at every position.
TEST_P(ActivationBackwardTest, InfAndNaN) {
  const std::vector<double> x = {kNaN, kInf, -kInf, 0, 1, 0, -1, 2, -kInf, kInf, -kInf};
  const std::vector<double> g = {1, 1, 1, kInf, kNaN, kNaN, kInf, -kInf, kInf, -2, kNaN};
  const int64_t n = static_cast<int64_t>(x.size());
  const double gelu1 = gelu_grad_ref(1), gelu2 = gelu_grad_ref(2);
  const double tanh2 = gelu_tanh_grad_ref(2), silu2 = silu_grad_ref(2);
  // gelu'(-1) < 0: inf * gelu'(-1) = -inf; silu'(-1) > 0. inf * f'(-inf) = inf * 0 = NaN.
  const std::vector<double> gelu = {kNaN, 1, 0, kInf, kNaN, kNaN, -kInf, -kInf, kNaN, -2, kNaN};
  const std::vector<double> silu = {kNaN, 1, 0, kInf, kNaN, kNaN, kInf, -kInf, kNaN, -2, kNaN};
  const std::vector<double> relu = {0, 1, 0, 0, kNaN, 0, 0, -kInf, 0, -2, 0};
  // Each value at every position of a 11 * 11 vector: x and g rotated together.
  auto rotations = [n](const std::vector<double>& v) {
    std::vector<double> out;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < n; ++i) out.push_back(v[(i + r) % n]);
    return out;
  };
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor tx = make(rotations(x), {n * n}, opts(dt)), tg = make(rotations(g), {n * n}, opts(dt));
    const double rt = rtol_of(dt), at = atol_of(dt);
    // Exact: 0, 1, -2, ±inf and NaN need no tolerance.
    expect_values(internal::gelu_backward(tg, tx), {n * n}, rotations(gelu), 0, 0);
    expect_values(internal::gelu_backward(tg, tx, true), {n * n}, rotations(gelu), 0, 0);
    expect_values(internal::silu_backward(tg, tx), {n * n}, rotations(silu), 0, 0);
    expect_values(internal::relu_backward(tg, tx), {n * n}, rotations(relu), 0, 0);
    // Finite values beside them are unaffected.
    const Tensor fx = make({1, 2, kNaN, 2}, {4}, opts(dt)), fg = make({0.5, 1, 1, -3}, {4}, opts(dt));
    expect_values(internal::gelu_backward(fg, fx), {4}, {0.5 * gelu1, gelu2, kNaN, -3 * gelu2}, rt, at);
    expect_values(internal::gelu_backward(fg, fx, true), {4}, {0.5 * gelu_tanh_grad_ref(1), tanh2, kNaN, -3 * tanh2},
                  rt, at);
    expect_values(internal::silu_backward(fg, fx), {4}, {0.5 * silu_grad_ref(1), silu2, kNaN, -3 * silu2}, rt, at);
    expect_values(internal::relu_backward(fg, fx), {4}, {0.5, 1, 0, -3}, rt, at);
  }
}

// The values at 0: gelu'(0) = silu'(0) = 1/2 exactly, relu'(0) = 0 (as PyTorch).
TEST_P(ActivationBackwardTest, AtZero) {
  for (DType dt : kFloatTypes) {
    const Tensor x = make({0, -0.0}, {2}, opts(dt)), g = make({3, -5}, {2}, opts(dt));
    expect_values(internal::gelu_backward(g, x), {2}, {1.5, -2.5}, 0, 0);
    expect_values(internal::gelu_backward(g, x, true), {2}, {1.5, -2.5}, 0, 0);
    expect_values(internal::silu_backward(g, x), {2}, {1.5, -2.5}, 0, 0);
    expect_values(internal::relu_backward(g, x), {2}, {0, 0}, 0, 0);
  }
}

// Operands broadcast and promote as mul(g, x) does; 0-d and empty tensors.
TEST_P(ActivationBackwardTest, BroadcastPromotionZeroDimAndEmpty) {
  const Tensor g = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts());
  const Tensor x = make({-1, 0.5, 2}, {3}, opts());
  const Tensor dx = internal::silu_backward(g, x);
  expect_values(dx, {2, 3},
                {silu_grad_ref(-1), 2 * silu_grad_ref(0.5), 3 * silu_grad_ref(2), 4 * silu_grad_ref(-1),
                 5 * silu_grad_ref(0.5), 6 * silu_grad_ref(2)},
                rtol_of(DType::Float32), atol_of(DType::Float32));
  // A bfloat16 gradient with a float32 input computes and returns float32.
  const Tensor mixed = internal::gelu_backward(make({2}, {1}, opts(DType::BFloat16)), make({1.5}, {1}, opts()));
  EXPECT_EQ(mixed.dtype(), DType::Float32);
  expect_values(mixed, {1}, {2 * gelu_grad_ref(1.5)}, rtol_of(DType::Float32), atol_of(DType::Float32));
  expect_values(internal::relu_backward(make({7}, {}, opts()), make({2}, {}, opts())), {}, {7});
  for (const auto& c : activation_cases()) {
    const Tensor e = c.op(zeros({0, 3}, opts()), zeros({0, 3}, opts()));
    EXPECT_EQ(e.shape(), (Shape{0, 3})) << c.name;
  }
}

TEST_P(ActivationBackwardTest, NonFloatingAndUndefinedOperandsAreErrors) {
  const Tensor i = make({1, 2}, {2}, opts(DType::Int64)), f = make({1, 2}, {2}, opts());
  expect_error([&] { internal::gelu_backward(i, i); }, {"gelu_backward", "floating-point", "int64"});
  expect_error([&] { internal::gelu_backward(f, i, true); }, {"gelu_backward", "floating-point", "int64"});
  expect_error([&] { internal::silu_backward(i, f); }, {"silu_backward", "floating-point"});
  expect_error([&] { internal::relu_backward(f, f > 0); }, {"relu_backward", "floating-point", "bool"});
  expect_error([&] { internal::relu_backward(Tensor(), f); }, {"relu_backward", "undefined"});
  expect_error([&] { internal::gelu_backward(f, make({1, 2, 3}, {3}, opts())); }, {"gelu_backward", "[2]", "[3]"});
}

// The float32 GELU (erf form) and its derivative (both backends: through the normal tail Phi(-|x|) =
// erfc(|x|/sqrt(2))/2, with one reciprocal, one exp and a polynomial; activation_constants.h) against float64 at every
// float in [-16, 16] on a grid of 2^-12 (131,073 values), including the left tail where x (1 + erf(x/sqrt(2)))/2 would
// cancel: gelu in ulps of the float64 value, gelu' absolutely (it crosses 0 at x ~ -0.75, so its relative error
// there means nothing) and in ulps where |gelu'| >= 1/64 (near its zeros Phi(x) and x phi(x) cancel). On an H100:
// gelu 8.3 ulps for |x| <= 3, 36.7 for |x| <= 8, 111.6 beyond; gelu' 1.7e-7 absolute, 40.6 ulps. The bounds leave
// a little room above those.
TEST_P(ActivationBackwardTest, FloatGeluAndItsDerivativeAgainstFloat64) {
  constexpr int64_t kSteps = 16 * 4096;
  std::vector<double> xs;
  for (int64_t i = -kSteps; i <= kSteps; ++i) xs.push_back(std::ldexp(static_cast<double>(i), -12));
  const auto n = static_cast<int64_t>(xs.size());
  const TensorOptions o = opts(DType::Float32);
  const Tensor x = make(xs, {n}, o);
  const std::vector<double> y = values(gelu(x)), d = values(internal::gelu_backward(ones({n}, o), x));
  const auto ulp = [](double v) {
    const float a = std::abs(static_cast<float>(v));
    return static_cast<double>(std::nextafter(a, std::numeric_limits<float>::infinity()) - a);
  };
  // Worst errors by region of |x|: [0, 3], (3, 8], (8, 16].
  double gelu_ulps[3] = {0, 0, 0}, grad_abs = 0, grad_ulps = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = xs[i], phi = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double g = v * phi, dg = phi + v * std::exp(-0.5 * v * v) / std::sqrt(2 * kPi);
    const int region = std::abs(v) <= 3 ? 0 : std::abs(v) <= 8 ? 1 : 2;
    if (std::abs(g) >= std::numeric_limits<float>::min()) {
      gelu_ulps[region] = std::max(gelu_ulps[region], std::abs(y[i] - g) / ulp(g));
    } else {
      EXPECT_LE(std::abs(y[i]), std::numeric_limits<float>::min()) << "x = " << v;  // 0 or subnormal
    }
    grad_abs = std::max(grad_abs, std::abs(d[i] - dg));
    if (std::abs(dg) >= 1.0 / 64) grad_ulps = std::max(grad_ulps, std::abs(d[i] - dg) / ulp(dg));
  }
  std::printf("gelu: %.1f ulps for |x| <= 3, %.1f for |x| <= 8, %.1f beyond; gelu': %.3g absolute, %.1f ulps\n",
              gelu_ulps[0], gelu_ulps[1], gelu_ulps[2], grad_abs, grad_ulps);
  EXPECT_LE(gelu_ulps[0], 10);
  EXPECT_LE(gelu_ulps[1], 48);
  EXPECT_LE(gelu_ulps[2], 160);
  EXPECT_LE(grad_abs, 2e-7);
  EXPECT_LE(grad_ulps, 48);
}

KILN_INSTANTIATE_BACKENDS(ActivationBackwardTest);

}  // namespace
}  // namespace kiln::testing
