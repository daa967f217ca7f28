// Conformance of the special values (kiln/tensor/README.md, "Special values"): NaN, ±inf, ±0, subnormals, huge
// finite values and the float16/bfloat16/float32/float64 extremes fed to every elementwise function computed
// with exp, log, erf or tanh (and sqrt, rsqrt, sin, cos), to the activation gradients, and to softmax,
// log_softmax and logsumexp, in every floating dtype, on every backend.
//
// The references are float64 std:: functions of the input as the dtype holds it, with the limits derived by hand
// where a formula is inf * 0 (gelu and silu at -inf, the derivatives at ±inf). A result that is NaN, ±inf or 0,
// and every result of a non-finite, zero or saturated (|x| >= 1000) input, must match exactly (the sign of a zero
// too, for a ±0 input); those are the values a vector math library tends to get wrong in its own way (Eigen 3.4's
// float exp(-inf) is 0 with AVX-512, 2.9e-39 with SSE2). Other results match within a rounding of the dtype, and
// subnormal results within two of its smallest steps. Each input list is repeated at every rotation, so that
// every value falls both in the vectorised body and in the scalar tail of a CPU loop, whatever the vector width.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace kiln::testing {
namespace {

constexpr double kPi = 3.14159265358979323846;

// ---- float64 references, from the definitions ----
// e^x / (1 + e^x) for x < 0, where 1 / (1 + e^-x) would overflow to 1 / inf = 0 before the true value underflows
// (x ~ -709 in float64). Exact 0 and 1 at -inf and +inf; NaN for NaN.
double sigmoid_ref(double x) { return x < 0 ? std::exp(x) / (1.0 + std::exp(x)) : 1.0 / (1.0 + std::exp(-x)); }
double phi_ref(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }  // the normal CDF, accurate in both tails
// gelu and silu: x times a factor that tends to 0 at -inf: the limit -0 there (the formula gives -inf * 0 = NaN).
double gelu_ref(double x) { return x == -kInf ? -0.0 : x * phi_ref(x); }
double gelu_tanh_ref(double x) {
  if (x == -kInf) return -0.0;
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}
double silu_ref(double x) { return x == -kInf ? -0.0 : x * sigmoid_ref(x); }
// The derivatives' limits: 1 at +inf, 0 at -inf.
double limit_or(double x, double v) { return x == kInf ? 1.0 : x == -kInf ? 0.0 : v; }
double gelu_grad_ref(double x) { return limit_or(x, phi_ref(x) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * kPi)); }
double gelu_tanh_grad_ref(double x) {
  // Beyond |x| = 50, 1 - tanh(u)^2 < 1e-300 (u > 4000): the derivative is its limit to float64 precision (and the
  // formula's x^2 would overflow for the largest doubles).
  if (std::isnan(x)) return x;
  if (std::abs(x) > 50) return x > 0 ? 1.0 : 0.0;
  const double k = std::sqrt(2.0 / kPi), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}
double silu_grad_ref(double x) {
  const double s = sigmoid_ref(x);
  return limit_or(x, s + x * s * (1.0 - s));
}

struct SpecialCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  // Saturated for |x| >= 1000: the result there must be exact (exp: inf or 0, tanh: ±1, gelu: x or -0, ...).
  bool saturates;
  // An absolute error allowed beyond one rounding, for formulas that lose relative accuracy where the result is
  // tiny (gelu's left tail is x (1 + erf(x/√2))/2, whose 1 + erf cancels; the derivatives near their zeros); 0
  // for the functions that are accurate in relative terms down to the subnormals.
  double float32_atol;
};

std::vector<SpecialCase> unary_cases() {
  auto f = [](double (*fn)(double)) { return std::function<double(double)>(fn); };
  return {
      {"exp", [](const Tensor& x) { return exp(x); }, f(std::exp), true, 0},
      {"expm1", [](const Tensor& x) { return expm1(x); }, f(std::expm1), true, 0},
      {"log", [](const Tensor& x) { return log(x); }, f(std::log), false, 0},
      {"log2", [](const Tensor& x) { return log2(x); }, f(std::log2), false, 0},
      {"log1p", [](const Tensor& x) { return log1p(x); }, f(std::log1p), false, 0},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, f(std::sqrt), false, 0},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1.0 / std::sqrt(x); }, false, 0},
      {"sin", [](const Tensor& x) { return sin(x); }, f(std::sin), false, 0},
      {"cos", [](const Tensor& x) { return cos(x); }, f(std::cos), false, 0},
      {"tanh", [](const Tensor& x) { return tanh(x); }, f(std::tanh), true, 0},
      {"erf", [](const Tensor& x) { return erf(x); }, f(std::erf), true, 0},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, sigmoid_ref, true, 0},
      {"silu", [](const Tensor& x) { return silu(x); }, silu_ref, true, 1e-30},
      {"gelu", [](const Tensor& x) { return gelu(x); }, gelu_ref, true, 1e-6},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }, gelu_tanh_ref, true, 1e-6},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, [](double x) { return 1.0 / x; }, false, 0},
      {"pow(x, 0.5)", [](const Tensor& x) { return pow(x, 0.5); }, [](double x) { return std::pow(x, 0.5); }, false, 0},
      {"pow(x, -1)", [](const Tensor& x) { return pow(x, -1.0); }, [](double x) { return std::pow(x, -1.0); }, false,
       0},
      {"pow(x, 3)", [](const Tensor& x) { return pow(x, 3.0); }, [](double x) { return std::pow(x, 3.0); }, false, 0},
  };
}

// The activation gradients with g = 1 (f'(x) itself) and g = -3.
std::vector<SpecialCase> gradient_cases(const TensorOptions& o, double g) {
  auto scaled = [g](double (*fn)(double)) { return [g, fn](double x) { return g * fn(x); }; };
  auto grad = [o, g](const Tensor& x) { return full(x.shape(), g, o); };
  return {
      {"gelu_backward", [=](const Tensor& x) { return internal::gelu_backward(grad(x), x); }, scaled(gelu_grad_ref),
       true, 1e-6},
      {"gelu_backward(tanh)", [=](const Tensor& x) { return internal::gelu_backward(grad(x), x, true); },
       scaled(gelu_tanh_grad_ref), true, 8e-6},
      {"silu_backward", [=](const Tensor& x) { return internal::silu_backward(grad(x), x); }, scaled(silu_grad_ref),
       true, 1e-6},
  };
}

double largest(DType dt) {
  switch (dt) {
    case DType::Float64: return std::numeric_limits<double>::max();
    case DType::Float32: return std::numeric_limits<float>::max();
    case DType::Float16: return 65504;
    default: return 3.3895313892515355e38;  // bfloat16
  }
}
double smallest_step(DType dt) {  // the smallest positive subnormal
  switch (dt) {
    case DType::Float64: return std::numeric_limits<double>::denorm_min();
    case DType::Float32: return std::numeric_limits<float>::denorm_min();
    case DType::Float16: return 5.960464477539063e-08;  // 2^-24
    default: return 9.183549615799121e-41;              // bfloat16: 2^-133
  }
}
double smallest_normal(DType dt) {
  switch (dt) {
    case DType::Float64: return std::numeric_limits<double>::min();
    case DType::Float16: return 6.103515625e-05;  // 2^-14
    default: return std::numeric_limits<float>::min();
  }
}
double rtol_of(DType dt) {
  switch (dt) {
    case DType::Float64: return 1e-12;
    case DType::Float32: return 1e-5;
    case DType::Float16: return 1e-3;
    default: return 8e-3;
  }
}

// Special values, the dtype's extremes, the region where float exp has subnormal results (-87 to -104) and
// where double's does (-708 to -745), and where the functions saturate.
std::vector<double> special_inputs(DType dt) {
  const double sub = 3 * smallest_step(dt), big = largest(dt);
  return {kNaN,  kInf,   -kInf, 0.0,   -0.0, sub,  -sub, smallest_normal(dt),
          1e-30, -1e-30, 0.5,   -0.5,  1,    -1,   3,    -3,
          5,     -5,     10,    -10,   20,   -20,  88.8, -88.8,
          -95,   -103,   100,   -100,  710,  -710, -730, -800,
          1000,  -1000,  1e30,  -1e30, big,  -big, 1e-3, -1e-3};
}

// The list at every rotation, one after another (the list's length squared elements).
std::vector<double> every_rotation(const std::vector<double>& v) {
  std::vector<double> out;
  for (size_t r = 0; r < v.size(); ++r)
    for (size_t i = 0; i < v.size(); ++i) out.push_back(v[(i + r) % v.size()]);
  return out;
}

// The rounded reference: `exact` where the value must match bit for bit, else the tolerance.
void check_special(const SpecialCase& c, const Tensor& x, DType dt) {
  SCOPED_TRACE(::testing::Message() << c.name << " on " << dt << " " << x.device() << " strides "
                                    << ::testing::PrintToString(x.strides()));
  const Tensor y = c.op(x);
  ASSERT_EQ(y.dtype(), dt);
  const std::vector<double> in = values(x), got = values(y);
  std::vector<double> ref(in.size());
  for (size_t i = 0; i < in.size(); ++i) ref[i] = c.ref(in[i]);
  // Rounded to the dtype on the CPU (a conversion, not a function under test).
  const std::vector<double> expected = values(make(ref, {static_cast<int64_t>(ref.size())}, {.dtype = dt}));
  const double rtol = rtol_of(dt), step = smallest_step(dt);
  const double atol = 2 * step + (dt == DType::Float64 ? c.float32_atol * 1e-7 : c.float32_atol);
  int reported = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const double xi = in[i], e = expected[i], g = got[i];
    const bool exact = std::isnan(e) || std::isinf(e) || e == 0 || !std::isfinite(xi) || xi == 0 ||
                       (c.saturates && std::abs(xi) >= 1000);
    bool ok;
    if (std::isnan(e)) ok = std::isnan(g);
    else if (exact) ok = g == e && (xi != 0 || e != 0 || std::signbit(g) == std::signbit(e));
    else ok = std::abs(g - e) <= atol + rtol * std::abs(e);
    if (!ok && reported++ < 6) {
      ADD_FAILURE() << c.name << "(" << xi << ") = " << g << ", expected " << e
                    << (exact ? " exactly" : " within tolerance") << " (element " << i << ")";
    }
  }
}

class SpecialValuesTest : public BackendTest {};

TEST_P(SpecialValuesTest, UnaryFunctionsAtTheEdgesInEveryFloatingDtype) {
  for (DType dt : kFloatTypes) {
    const std::vector<double> in = every_rotation(special_inputs(dt));
    const Tensor x = make(in, {static_cast<int64_t>(in.size())}, opts(dt));
    for (const auto& c : unary_cases()) {
      check_special(c, x, dt);
      if (dt == DType::Float32) check_special(c, non_contiguous(x), dt);  // the CPU's buffered path
    }
  }
}

TEST_P(SpecialValuesTest, ActivationGradientsAtTheEdgesInEveryFloatingDtype) {
  for (DType dt : kFloatTypes) {
    const std::vector<double> in = every_rotation(special_inputs(dt));
    const Tensor x = make(in, {static_cast<int64_t>(in.size())}, opts(dt));
    for (double g : {1.0, -3.0}) {
      for (const auto& c : gradient_cases(opts(dt), g)) {
        check_special(c, x, dt);
        if (dt == DType::Float32) check_special(c, non_contiguous(x), dt);
      }
    }
  }
}

// In place, each element is read before it is written: the edges are decided on the input, not on the output.
TEST_P(SpecialValuesTest, InPlaceFormsDecideTheEdgesOnTheirInput) {
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    const std::vector<double> in = every_rotation(special_inputs(dt));
    const int64_t n = static_cast<int64_t>(in.size());
    Tensor x = make(in, {n}, opts(dt));
    const std::vector<double> held = values(x);
    {
      NoGradGuard no_grad;
      x.exp_();
    }
    std::vector<double> ref;
    for (double v : held) ref.push_back(std::exp(v));
    const std::vector<double> expected = values(make(ref, {n}, {.dtype = dt}));
    const std::vector<double> got = values(x);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(expected[i]) || std::isinf(expected[i]) || expected[i] == 0) {
        EXPECT_TRUE(got[i] == expected[i] || (std::isnan(got[i]) && std::isnan(expected[i])))
            << "exp_(" << held[i] << ") = " << got[i] << " on " << dt;
      }
    }
  }
}

// softmax and log_softmax: a -inf logit (a masked position) has probability exactly 0 and log-probability
// exactly -inf, and logits far below the max give exact subnormal or zero probabilities; logsumexp ignores -inf.
TEST_P(SpecialValuesTest, SoftmaxAndLogsumexpWithInfiniteLogits) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    // 37 elements per row: a vectorised body and a scalar tail for every vector width.
    const std::vector<double> pattern = {-kInf, 0, -kInf, -100, 1, -kInf, -1000, 0.5};
    std::vector<double> row;
    for (int i = 0; i < 37; ++i) row.push_back(pattern[i % pattern.size()]);
    const Tensor x = make(row, {1, 37}, opts(dt));
    const std::vector<double> held = values(x);
    double m = -kInf, s = 0;
    for (double v : held) m = std::max(m, v);
    for (double v : held) s += std::exp(v - m);
    std::vector<double> p, lp;
    for (double v : held) {
      p.push_back(std::exp(v - m) / s);
      lp.push_back(v - m - std::log(s));
    }
    const std::vector<double> ep = values(make(p, {37}, {.dtype = dt}));
    const std::vector<double> got_p = values(x.softmax(1)), got_lp = values(x.log_softmax(1));
    const double step = smallest_step(dt), rtol = rtol_of(dt);
    for (size_t i = 0; i < held.size(); ++i) {
      if (ep[i] == 0) EXPECT_EQ(got_p[i], 0.0) << "softmax at logit " << held[i] << " (element " << i << ")";
      else EXPECT_NEAR(got_p[i], ep[i], 2 * step + 2 * rtol * ep[i]) << "softmax at logit " << held[i];
      if (held[i] == -kInf) EXPECT_EQ(got_lp[i], -kInf) << "log_softmax at -inf (element " << i << ")";
      else EXPECT_NEAR(got_lp[i], lp[i], 2 * rtol * std::abs(lp[i]) + 1e-6) << "log_softmax at " << held[i];
    }
    const std::vector<double> lse = values(logsumexp(x, {1}));
    EXPECT_NEAR(lse[0], m + std::log(s), 2 * rtol * std::abs(m + std::log(s)) + 1e-6);
    // Only -inf and 0: exactly log(1) = 0; all -inf: -inf.
    EXPECT_EQ(values(logsumexp(make({-kInf, 0, -kInf, -kInf, -kInf}, {5}, opts(dt)), {0}))[0], 0.0);
    EXPECT_EQ(values(logsumexp(make({-kInf, -kInf, -kInf}, {3}, opts(dt)), {0}))[0], -kInf);
  }
}

KILN_INSTANTIATE_BACKENDS(SpecialValuesTest);

}  // namespace
}  // namespace kiln::testing
