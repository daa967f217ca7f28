// Weight initialisation (init.h), with PyTorch's formulas.
#include "kiln/layers/init.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/autograd/functions.h"  // the in-place ops and random draws
#include "kiln/autograd/grad_mode.h"  // NoGradGuard
#include "kiln/tensor/error.h"        // KILN_CHECK

namespace kiln::nn {
namespace {
thread_local int skip_init_depth = 0;  // SkipInit guards alive on this thread
}  // namespace

SkipInit::SkipInit() { ++skip_init_depth; }
SkipInit::~SkipInit() { --skip_init_depth; }
bool SkipInit::active() { return skip_init_depth > 0; }

}  // namespace kiln::nn

namespace kiln::nn::init {
namespace {

int64_t fan(const Tensor& t, FanMode mode, const char* op) {
  KILN_CHECK(t.defined() && t.dim() >= 2, op, ": fan in and fan out need a tensor with at least 2 dims, got shape ",
             t.defined() ? t.shape() : Shape{});
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const int64_t f = mode == FanMode::FanIn ? fan_in : fan_out;
  KILN_CHECK(f > 0, op, ": the fan of a tensor of shape ", t.shape(), " is 0; it has no elements to initialise");
  return f;
}

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// The standard normal's quantile function: Acklam's rational approximation (relative error 1.2e-9),
// refined by one Halley step on erfc to full double precision.
double normal_quantile(double p) {
  if (p <= 0) return -INFINITY;
  if (p >= 1) return INFINITY;
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double lo = 0.02425;
  double x;
  if (p < lo) {
    double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - lo) {
    double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double e = normal_cdf(x) - p;
  const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Conv1d:
    case Nonlinearity::Conv2d:
    case Nonlinearity::Conv3d:
    case Nonlinearity::ConvTranspose1d:
    case Nonlinearity::ConvTranspose2d:
    case Nonlinearity::ConvTranspose3d:
    case Nonlinearity::Sigmoid: return 1;
    case Nonlinearity::Tanh: return 5.0 / 3.0;
    case Nonlinearity::ReLU: return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU: {
      const double slope = param.value_or(0.01);
      return std::sqrt(2.0 / (1 + slope * slope));
    }
    case Nonlinearity::SELU: return 3.0 / 4.0;
  }
  return 1;
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  KILN_CHECK(t.defined() && t.dim() >= 2,
             "calculate_fan_in_and_fan_out: fan in and fan out need a tensor with at least 2 dims, got shape ",
             t.defined() ? t.shape() : Shape{});
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor& uniform_(Tensor& t, double a, double b, Generator* gen) {
  KILN_CHECK(a <= b, "init::uniform_: the lower bound ", a, " must not exceed the upper bound ", b);
  if (SkipInit::active()) return t;
  NoGradGuard no_grad;
  return kiln::uniform_(t, a, b, gen);
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  KILN_CHECK(std >= 0, "init::normal_: std must be >= 0, got ", std);
  if (SkipInit::active()) return t;
  NoGradGuard no_grad;
  return kiln::normal_(t, mean, std, gen);
}

Tensor& constant_(Tensor& t, Scalar value) {
  if (SkipInit::active()) return t;
  NoGradGuard no_grad;
  return kiln::fill_(t, value);
}

Tensor& zeros_(Tensor& t) { return constant_(t, 0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1); }

Tensor& kaiming_uniform_(Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(t, mode, "kaiming_uniform_")));
  const double bound = std::sqrt(3.0) * std;
  return init::uniform_(t, -bound, bound, gen);
}

Tensor& kaiming_normal_(Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity, Generator* gen) {
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(t, mode, "kaiming_normal_")));
  return init::normal_(t, 0, std, gen);
}

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  fan(t, FanMode::FanIn, "xavier_uniform_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return init::uniform_(t, -bound, bound, gen);
}

Tensor& xavier_normal_(Tensor& t, double gain, Generator* gen) {
  fan(t, FanMode::FanIn, "xavier_normal_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return init::normal_(t, 0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), gen);
}

Tensor& trunc_normal_(Tensor& t, double mean, double std, double a, double b, Generator* gen) {
  KILN_CHECK(std > 0 && a < b, "init::trunc_normal_: needs std > 0 and a < b, got std ", std, ", a ", a, ", b ", b);
  KILN_CHECK(t.is_floating_point(), "init::trunc_normal_: the tensor must be floating point, got ", t.dtype());
  if (SkipInit::active()) return t;
  NoGradGuard no_grad;
  // Uniform in the CDF range of [a, b], mapped back through the quantile function. The draw comes from the
  // tensor's device generator (same numbers on every device); the quantile is computed on the host in double.
  const double lo = normal_cdf((a - mean) / std), hi = normal_cdf((b - mean) / std);
  Tensor u = kiln::rand(t.shape(), {.dtype = DType::Float64, .device = t.device()}, gen).cpu().contiguous();
  std::vector<double> v = u.to_vector<double>();
  for (double& x : v) x = std::clamp(mean + std * normal_quantile(lo + (hi - lo) * x), a, b);
  return kiln::copy_(t, from_vector(v, t.shape()));
}

}  // namespace kiln::nn::init
