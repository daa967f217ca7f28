// The fused multi-tensor CUDA kernels (kiln/optim/cuda/fused.h) against float64 host references that follow
// PyTorch's formulas (torch.optim.SGD / Adam / AdamW, LAMB as fused.h describes, AMP unscale, L2 norm), over
// several steps, on lists of awkward sizes (1, 3, 1000, 70001, two chunk boundaries), misaligned views,
// hundreds of small tensors (several launches) and 16-bit parameters. 16-bit references round the
// parameter to its dtype after each step, as the kernel does (float32 math, one rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"  // is_available, synchronize, memory_stats
#include "support/test_support.h"

#if KILN_TEST_CUDA
#include "kiln/optim/cuda/fused.h"

namespace kiln::optim::cuda_impl {
namespace {

using kiln::testing::expect_error;
using kiln::testing::expect_values;
using kiln::testing::make;
using kiln::testing::uniform;
using kiln::testing::values;
using Vec = std::vector<double>;

const Device kGpu = Device::cuda(0);
constexpr int64_t kChunk = 65536;

class CudaFusedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};
using CudaFusedSgd = CudaFusedTest;
using CudaFusedAdam = CudaFusedTest;
using CudaFusedLamb = CudaFusedTest;
using CudaFusedAmp = CudaFusedTest;
using CudaFusedNorm = CudaFusedTest;
using CudaFusedLauncher = CudaFusedTest;

// Values as stored in dtype (the inputs both sides see).
Vec rounded(const Vec& v, DType dt) {
  if (v.empty()) return v;
  return values(make(v, {static_cast<int64_t>(v.size())}, {.dtype = dt}));
}
// A contiguous 1-D CUDA tensor with values v; misaligned: a view at element offset 1 of a longer buffer
// (contiguous, but its first element is not 16-byte aligned).
Tensor gpu(const Vec& v, DType dt, bool misaligned = false) {
  const auto n = static_cast<int64_t>(v.size());
  if (!misaligned) return make(v, {n}, {.dtype = dt, .device = kGpu});
  Vec padded(v.size() + 3, 0.0);
  std::copy(v.begin(), v.end(), padded.begin() + 1);
  return make(padded, {n + 3}, {.dtype = dt, .device = kGpu}).narrow(0, 1, n);
}
Tensor gpu_scalar(double x) { return make({x}, {1}, {.dtype = DType::Float32, .device = kGpu}); }

// Sizes that cross chunk boundaries, and which tensors are misaligned views.
const std::vector<int64_t> kAwkward = {1, 3, 1000, 70001, 2 * kChunk + 5, 17};
bool misaligned_at(size_t i) { return i % 3 == 1; }  // 3 and 2 * kChunk + 5
// 500 small tensors: several launches at every depth.
std::vector<int64_t> many_small() {
  std::vector<int64_t> s;
  for (int i = 0; i < 500; ++i) s.push_back(1 + (i * 7) % 50);
  return s;
}

double tol_rel(DType dt) { return dt == DType::BFloat16 ? 1.6e-2 : dt == DType::Float16 ? 2e-3 : 2e-5; }
double tol_abs(DType dt) { return dt == DType::BFloat16 ? 2e-3 : dt == DType::Float16 ? 2e-4 : 1e-6; }
// float32 states. With 16-bit params, a parameter that rounded to the neighbouring 16-bit value on one side
// (float32 vs float64 math straddling a rounding boundary) feeds weight_decay * p into the states: ~wd ulp.
double state_rtol(DType dt) { return dt == DType::Float32 ? 2e-5 : 1e-3; }
double state_atol(DType dt) { return dt == DType::Float32 ? 1e-7 : 1e-4; }

// Host and device copies of one list.
struct List {
  std::vector<Vec> host;
  TensorVec dev;
};
List make_list(const std::vector<int64_t>& sizes, DType dt, double lo, double hi, uint64_t seed, bool misalign) {
  List l;
  for (size_t i = 0; i < sizes.size(); ++i) {
    l.host.push_back(rounded(uniform(sizes[i], lo, hi, seed * 1000 + i), dt));
    l.dev.push_back(gpu(l.host.back(), dt, misalign && misaligned_at(i)));
  }
  return l;
}
List zeros_list(const std::vector<int64_t>& sizes) {
  List l;
  for (int64_t n : sizes) {
    l.host.emplace_back(n, 0.0);
    l.dev.push_back(internal::zeros({n}, {.dtype = DType::Float32, .device = kGpu}));
  }
  return l;
}
TensorVec step_tensors(size_t n) {
  TensorVec s;
  for (size_t i = 0; i < n; ++i) s.push_back(internal::zeros({1}, {.dtype = DType::Float32, .device = kGpu}));
  return s;
}
void expect_list(const List& l, double rtol, double atol, const std::string& what) {
  for (size_t i = 0; i < l.dev.size(); ++i) {
    SCOPED_TRACE(what + "[" + std::to_string(i) + "]");
    expect_values(l.dev[i], {static_cast<int64_t>(l.host[i].size())}, l.host[i], rtol, atol);
  }
}
void expect_steps(const TensorVec& steps, double n) {
  for (const Tensor& s : steps) EXPECT_EQ(s.item<float>(), static_cast<float>(n));
}
// Gradients of step k as both sides see them: host unscaled values, device values times `scale`.
List grads_for(const std::vector<int64_t>& sizes, DType dt, int k, double scale, bool misalign) {
  List g;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Vec v = rounded(uniform(sizes[i], -1, 1, 77 + 1000 * k + i), dt);
    Vec scaled = v;
    for (double& x : scaled) x *= scale;  // a power of two: exact
    g.host.push_back(v);
    g.dev.push_back(gpu(scaled, dt, misalign && misaligned_at(i)));
  }
  return g;
}

// ---------------------------------------------------------------- SGD

void sgd_reference(Vec& p, const Vec& g, Vec* buf, double step, const SgdHyper& h, DType dt) {
  for (size_t j = 0; j < p.size(); ++j) {
    double d = h.maximize ? -g[j] : g[j];
    if (h.weight_decay != 0) d += h.weight_decay * p[j];
    if (h.momentum != 0) {
      double& b = (*buf)[j];
      b = step == 0 ? d : h.momentum * b + (1 - h.dampening) * d;
      d = h.nesterov ? d + h.momentum * b : b;
    }
    p[j] -= h.lr * d;
  }
  p = rounded(p, dt);
}

void run_sgd(const std::vector<int64_t>& sizes, DType dt, const SgdHyper& h, int steps, double scale, bool misalign) {
  List p = make_list(sizes, dt, -1, 1, 1, misalign);
  List buf = h.momentum != 0 ? zeros_list(sizes) : List{};
  TensorVec st = step_tensors(sizes.size());
  const Tensor gs = scale != 1 ? gpu_scalar(scale) : Tensor();
  for (int k = 0; k < steps; ++k) {
    List g = grads_for(sizes, dt, k, scale, misalign);
    fused_sgd(p.dev, g.dev, buf.dev, st, h, gs, Tensor());
    for (size_t i = 0; i < sizes.size(); ++i)
      sgd_reference(p.host[i], g.host[i], h.momentum != 0 ? &buf.host[i] : nullptr, k, h, dt);
  }
  expect_list(p, tol_rel(dt), tol_abs(dt), "param");
  if (h.momentum != 0) expect_list(buf, state_rtol(dt), state_atol(dt), "momentum_buffer");
  expect_steps(st, steps);
}

TEST_F(CudaFusedSgd, MomentumDampeningWeightDecay) {
  SgdHyper h{.lr = 0.05, .momentum = 0.9, .dampening = 0.5, .weight_decay = 0.01};
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    run_sgd(kAwkward, dt, h, 3, 1, true);
  }
}

TEST_F(CudaFusedSgd, FirstStepInitialisesBufferToGradient) {
  // With dampening 0.5, a buffer started at 0 and updated would hold 0.5 g; PyTorch's holds g.
  SgdHyper h{.lr = 0.1, .momentum = 0.9, .dampening = 0.5};
  List p = make_list({5}, DType::Float32, -1, 1, 3, false);
  List buf = zeros_list({5});
  TensorVec st = step_tensors(1);
  List g = grads_for({5}, DType::Float32, 0, 1, false);
  // found_inf != 0 first: nothing moves (parameter, buffer, step).
  fused_sgd(p.dev, g.dev, buf.dev, st, h, Tensor(), gpu_scalar(1));
  expect_list(p, 0, 0, "param");
  expect_list(buf, 0, 0, "momentum_buffer");
  expect_steps(st, 0);
  fused_sgd(p.dev, g.dev, buf.dev, st, h, Tensor(), Tensor());
  expect_steps(st, 1);
  expect_values(buf.dev[0], {5}, g.host[0], 1e-7, 0);
  Vec want = p.host[0];
  for (size_t j = 0; j < want.size(); ++j) want[j] -= 0.1 * g.host[0][j];
  expect_values(p.dev[0], {5}, want, 1e-6, 1e-7);
}

TEST_F(CudaFusedSgd, NesterovMaximizeGradScale) {
  SgdHyper h{.lr = 0.05, .momentum = 0.8, .weight_decay = 0.1, .nesterov = true, .maximize = true};
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    run_sgd(kAwkward, dt, h, 3, 1024, true);
  }
}

TEST_F(CudaFusedSgd, PlainManyTensorsWithAndWithoutSteps) {
  SgdHyper h{.lr = 0.1};
  run_sgd(many_small(), DType::Float32, h, 2, 1, false);
  // momentum == 0: the step counters may be left out.
  List p = make_list({10, 3}, DType::Float32, -1, 1, 5, false);
  List g = grads_for({10, 3}, DType::Float32, 0, 1, false);
  fused_sgd(p.dev, g.dev, {}, {}, h, Tensor(), Tensor());
  for (size_t i = 0; i < 2; ++i) sgd_reference(p.host[i], g.host[i], nullptr, 0, h, DType::Float32);
  expect_list(p, 1e-6, 1e-7, "param");
}

// ---------------------------------------------------------------- Adam / AdamW

void adam_reference(Vec& p, const Vec& g0, Vec& m, Vec& v, Vec* vmax, double step, const AdamHyper& h, DType dt) {
  const double t = step + 1;
  const double bc1 = 1 - std::pow(h.beta1, t), bc2 = 1 - std::pow(h.beta2, t);
  for (size_t j = 0; j < p.size(); ++j) {
    double g = h.maximize ? -g0[j] : g0[j];
    if (h.weight_decay != 0) {
      if (h.decoupled_weight_decay) p[j] *= 1 - h.lr * h.weight_decay;
      else g += h.weight_decay * p[j];
    }
    m[j] = h.beta1 * m[j] + (1 - h.beta1) * g;
    v[j] = h.beta2 * v[j] + (1 - h.beta2) * g * g;
    double vv = v[j];
    if (vmax != nullptr) vv = (*vmax)[j] = std::max((*vmax)[j], v[j]);
    p[j] -= (h.lr / bc1) * m[j] / (std::sqrt(vv) / std::sqrt(bc2) + h.eps);
  }
  p = rounded(p, dt);
}

void run_adam(const std::vector<int64_t>& sizes, DType dt, const AdamHyper& h, int steps, double scale, bool misalign) {
  List p = make_list(sizes, dt, -1, 1, 2, misalign);
  List m = zeros_list(sizes), v = zeros_list(sizes);
  List vmax = h.amsgrad ? zeros_list(sizes) : List{};
  TensorVec st = step_tensors(sizes.size());
  const Tensor gs = scale != 1 ? gpu_scalar(scale) : Tensor();
  for (int k = 0; k < steps; ++k) {
    List g = grads_for(sizes, dt, k, scale, misalign);
    // Make gradients shrink on later steps so that amsgrad's max differs from v.
    if (k > 0) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        for (double& x : g.host[i]) x *= 0.25;  // exact in every dtype
        g.dev[i].mul_(0.25);
      }
    }
    fused_adam(p.dev, g.dev, m.dev, v.dev, vmax.dev, st, h, gs, Tensor());
    for (size_t i = 0; i < sizes.size(); ++i)
      adam_reference(p.host[i], g.host[i], m.host[i], v.host[i], h.amsgrad ? &vmax.host[i] : nullptr, k, h, dt);
  }
  expect_list(p, tol_rel(dt), tol_abs(dt), "param");
  // With L2 weight decay the gradient reads the rounded 16-bit parameter; when kernel and reference round a
  // parameter to neighbouring 16-bit values (their float32 and float64 updates straddle a rounding boundary),
  // the moments differ by (1 - beta1) * weight_decay * one ulp of that parameter per step: allow that.
  double max_p = 0;
  for (const Vec& ph : p.host)
    for (double x : ph) max_p = std::max(max_p, std::abs(x));
  const double ulp = dt == DType::BFloat16 ? 0x1p-7 : (dt == DType::Float16 ? 0x1p-10 : 0.0);
  const double wd_slack = steps * (1 - h.beta1) * h.weight_decay * ulp * std::max(max_p, 1.0) * 2;
  expect_list(m, state_rtol(dt), state_atol(dt) + wd_slack, "exp_avg");
  expect_list(v, state_rtol(dt), dt == DType::Float32 ? 1e-9 : 1e-5, "exp_avg_sq");
  if (h.amsgrad) expect_list(vmax, state_rtol(dt), dt == DType::Float32 ? 1e-9 : 1e-5, "max_exp_avg_sq");
  expect_steps(st, steps);
}

TEST_F(CudaFusedAdam, AdamWithWeightDecay) {
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    run_adam(kAwkward, dt, {.lr = dt == DType::Float32 ? 1e-2 : 5e-2, .weight_decay = 0.1}, 4, 1, true);
  }
}

TEST_F(CudaFusedAdam, AdamWAmsgradMaximizeGradScale) {
  AdamHyper h{.lr = 2e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05};
  h.decoupled_weight_decay = true;
  h.amsgrad = true;
  h.maximize = true;
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    run_adam(kAwkward, dt, h, 4, 65536, true);
  }
}

TEST_F(CudaFusedAdam, ManySmallTensorsSeveralLaunches) {
  AdamHyper h{.lr = 1e-2};
  h.amsgrad = true;  // depth 5: the fewest tensors per launch
  run_adam(many_small(), DType::Float32, h, 3, 1, false);
}

TEST_F(CudaFusedAdam, FoundInfSkipsEverything) {
  const std::vector<int64_t> sizes = {3, 70001};
  List p = make_list(sizes, DType::Float32, -1, 1, 4, false);
  List m = make_list(sizes, DType::Float32, -1, 1, 5, false);
  List v = make_list(sizes, DType::Float32, 0, 1, 6, false);
  List vmax = make_list(sizes, DType::Float32, 0, 1, 7, false);
  TensorVec st = step_tensors(sizes.size());
  for (Tensor& s : st) s.fill_(3);
  List g = grads_for(sizes, DType::Float32, 0, 1, false);
  AdamHyper h{.weight_decay = 0.1};
  h.amsgrad = true;
  fused_adam(p.dev, g.dev, m.dev, v.dev, vmax.dev, st, h, gpu_scalar(2), gpu_scalar(1));
  expect_list(p, 0, 0, "param");
  expect_list(m, 0, 0, "exp_avg");
  expect_list(v, 0, 0, "exp_avg_sq");
  expect_list(vmax, 0, 0, "max_exp_avg_sq");
  expect_steps(st, 3);
  // found_inf == 0: the step happens.
  fused_adam(p.dev, g.dev, m.dev, v.dev, vmax.dev, st, h, Tensor(), gpu_scalar(0));
  expect_steps(st, 4);
  EXPECT_NE(values(p.dev[0])[0], p.host[0][0]);
}

TEST_F(CudaFusedAdam, ArgumentErrors) {
  List p = make_list({4, 5}, DType::Float32, -1, 1, 1, false);
  List g = grads_for({4, 5}, DType::Float32, 0, 1, false);
  List m = zeros_list({4, 5}), v = zeros_list({4, 5});
  TensorVec st = step_tensors(2);
  expect_error([&] { fused_adam(p.dev, {g.dev[0]}, m.dev, v.dev, {}, st, {}, {}, {}); },
               {"fused_adam", "grads has 1 tensors, expected 2"});
  TensorVec wrong = m.dev;
  wrong[1] = internal::zeros({6}, {.device = kGpu});
  expect_error([&] { fused_adam(p.dev, g.dev, wrong, v.dev, {}, st, {}, {}, {}); },
               {"fused_adam", "exp_avgs[1] has 6 elements"});
  wrong[1] = internal::zeros({5}, {.dtype = DType::BFloat16, .device = kGpu});
  expect_error([&] { fused_adam(p.dev, g.dev, wrong, v.dev, {}, st, {}, {}, {}); }, {"exp_avgs[1]", "bfloat16"});
  wrong[1] = internal::zeros({5});
  expect_error([&] { fused_adam(p.dev, g.dev, wrong, v.dev, {}, st, {}, {}, {}); }, {"exp_avgs[1]", "cpu"});
  TensorVec nc = p.dev;
  nc[0] = internal::zeros({2, 2}, {.device = kGpu}).transpose(0, 1);
  expect_error([&] { fused_adam(nc, g.dev, m.dev, v.dev, {}, st, {}, {}, {}); },
               {"params[0]", "neither contiguous nor channels-last"});
  // Channels-last parameters are taken, with gradients and states in their order only.
  TensorVec cl = {internal::zeros({2, 3, 2, 2}, {.device = kGpu}).to(MemoryFormat::ChannelsLast)};
  TensorVec cl_grad = {internal::ones({2, 3, 2, 2}, {.device = kGpu})};
  TensorVec cl_state = {internal::zeros({2, 3, 2, 2}, {.device = kGpu}).to(MemoryFormat::ChannelsLast)};
  expect_error([&] { fused_adam(cl, cl_grad, cl_state, cl_state, {}, step_tensors(1), {}, {}, {}); },
               {"grads[0]", "not in the memory order of params[0]"});
  expect_error([&] { fused_adam(p.dev, g.dev, m.dev, v.dev, {}, step_tensors(1), {}, {}, {}); }, {"steps has 1"});
  expect_error([&] { fused_adam(p.dev, g.dev, m.dev, v.dev, {}, st, {}, internal::zeros({2}, {.device = kGpu}), {}); },
               {"grad_scale", "1-element float32"});
  TensorVec dbl = {internal::zeros({2}, {.dtype = DType::Float64, .device = kGpu})};
  expect_error([&] { fused_adam(dbl, dbl, dbl, dbl, {}, step_tensors(1), {}, {}, {}); }, {"float64"});
  fused_adam({}, {}, {}, {}, {}, {}, {}, {}, {});  // nothing to do
}

// ---------------------------------------------------------------- LAMB

void lamb_reference(Vec& p, const Vec& g, Vec& m, Vec& v, double step, const LambHyper& h, DType dt) {
  const double t = step + 1;
  const double bc1 = h.bias_correction ? 1 - std::pow(h.beta1, t) : 1;
  const double bc2 = h.bias_correction ? 1 - std::pow(h.beta2, t) : 1;
  Vec u(p.size());
  double pn = 0, un = 0;
  for (size_t j = 0; j < p.size(); ++j) {
    m[j] = h.beta1 * m[j] + (1 - h.beta1) * g[j];
    v[j] = h.beta2 * v[j] + (1 - h.beta2) * g[j] * g[j];
    u[j] = (m[j] / bc1) / (std::sqrt(v[j] / bc2) + h.eps) + h.weight_decay * p[j];
    pn += p[j] * p[j];
    un += u[j] * u[j];
  }
  pn = std::sqrt(pn);
  un = std::sqrt(un);
  const double trust = (pn > 0 && un > 0) ? std::min(pn / un, h.max_trust_ratio) : 1.0;
  for (size_t j = 0; j < p.size(); ++j) p[j] -= h.lr * trust * u[j];
  p = rounded(p, dt);
}

void run_lamb(const std::vector<int64_t>& sizes, DType dt, const LambHyper& h, int steps, double scale, bool misalign,
              const std::vector<double>& param_scales = {}) {
  List p = make_list(sizes, dt, -1, 1, 8, misalign);
  // Per-tensor multipliers of the initial parameters: 0 (a zero norm), large (a clamped trust ratio).
  for (size_t i = 0; i < param_scales.size(); ++i) {
    for (double& x : p.host[i]) x *= param_scales[i];
    p.host[i] = rounded(p.host[i], dt);
    p.dev[i] = gpu(p.host[i], dt, misalign && misaligned_at(i));
  }
  List m = zeros_list(sizes), v = zeros_list(sizes);
  TensorVec st = step_tensors(sizes.size());
  const Tensor gs = scale != 1 ? gpu_scalar(scale) : Tensor();
  for (int k = 0; k < steps; ++k) {
    List g = grads_for(sizes, dt, k, scale, misalign);
    fused_lamb(p.dev, g.dev, m.dev, v.dev, st, h, gs, Tensor());
    for (size_t i = 0; i < sizes.size(); ++i) lamb_reference(p.host[i], g.host[i], m.host[i], v.host[i], k, h, dt);
  }
  expect_list(p, tol_rel(dt), tol_abs(dt), "param");
  expect_list(m, 2e-5, 1e-7, "exp_avg");
  expect_list(v, 2e-5, 1e-9, "exp_avg_sq");
  expect_steps(st, steps);
}

TEST_F(CudaFusedLamb, TrustRatioZeroNormsAndClamp) {
  // Tensor 0 starts at zero (||p|| = 0: trust 1), tensor 3 is large (trust ratio clamped to max), the
  // 2-chunk tensor's norms come from several chunk partials.
  LambHyper h{.lr = 1e-2, .weight_decay = 0.01, .max_trust_ratio = 10};
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    run_lamb(kAwkward, dt, h, 3, 1, true, {0, 1, 1, 100, 1, 1});
  }
}

TEST_F(CudaFusedLamb, NoBiasCorrectionGradScaleManyTensors) {
  LambHyper h{.lr = 5e-3, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-4, .weight_decay = 0.0};
  h.bias_correction = false;
  run_lamb(many_small(), DType::Float32, h, 2, 256, false);
  run_lamb(kAwkward, DType::Float16, {.lr = 2e-2}, 2, 8, true);
}

TEST_F(CudaFusedLamb, ZeroUpdateNormAndFoundInf) {
  // Zero gradients and states with no weight decay: ||u|| = 0, trust 1, p unchanged.
  List p = make_list({1000, 3}, DType::Float32, -1, 1, 9, false);
  List g = zeros_list({1000, 3});
  List m = zeros_list({1000, 3}), v = zeros_list({1000, 3});
  TensorVec st = step_tensors(2);
  fused_lamb(p.dev, g.dev, m.dev, v.dev, st, {}, Tensor(), Tensor());
  expect_list(p, 0, 0, "param");
  expect_steps(st, 1);
  // found_inf: nothing moves, not even the steps.
  List g2 = grads_for({1000, 3}, DType::Float32, 0, 1, false);
  fused_lamb(p.dev, g2.dev, m.dev, v.dev, st, {}, Tensor(), gpu_scalar(1));
  expect_list(p, 0, 0, "param");
  expect_list(m, 0, 0, "exp_avg");
  expect_steps(st, 1);
}

TEST_F(CudaFusedLamb, Deterministic) {
  auto once = [] {
    List p = make_list({2 * kChunk + 5, 1000}, DType::Float32, -1, 1, 10, false);
    List g = grads_for({2 * kChunk + 5, 1000}, DType::Float32, 0, 1, false);
    List m = zeros_list({2 * kChunk + 5, 1000}), v = zeros_list({2 * kChunk + 5, 1000});
    fused_lamb(p.dev, g.dev, m.dev, v.dev, step_tensors(2), {.weight_decay = 0.1}, Tensor(), Tensor());
    return values(p.dev[0]);
  };
  const Vec a = once(), b = once();
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(double)));
}

// ---------------------------------------------------------------- AMP unscale + check

TEST_F(CudaFusedAmp, UnscaleAndCheckFindsInfAndNaNAmongMany) {
  // 40 tensors of mixed dtypes and sizes; tensor 17 holds an inf in its first chunk and a NaN in its second.
  std::vector<int64_t> sizes;
  for (int i = 0; i < 40; ++i) sizes.push_back(i == 17 ? 70001 : 1 + (i * 37) % 3000);
  const DType dts[] = {DType::Float32, DType::BFloat16, DType::Float16};
  std::vector<Vec> host;
  TensorVec grads;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Vec v = rounded(uniform(sizes[i], -100, 100, 300 + i), dts[i % 3]);
    if (i == 17) {
      v[5] = std::numeric_limits<double>::infinity();
      v[70000] = std::numeric_limits<double>::quiet_NaN();
    }
    host.push_back(v);
    grads.push_back(gpu(v, dts[i % 3], i % 4 == 1));
  }
  const Tensor found = gpu_scalar(0), inv = gpu_scalar(0.125);
  fused_unscale_and_check(grads, found, inv);
  EXPECT_EQ(found.item<float>(), 1.f);
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE("grad " + std::to_string(i));
    Vec want = host[i];
    for (double& x : want) x *= 0.125;                   // exact
    expect_values(grads[i], {sizes[i]}, want, 0, 1e-7);  // exact but for float16 subnormals
  }
}

TEST_F(CudaFusedAmp, FiniteLeavesFoundInfAndNeverResets) {
  List g = make_list(kAwkward, DType::Float32, -1, 1, 11, true);
  const Tensor found = gpu_scalar(0), inv = gpu_scalar(1.0 / 3);
  fused_unscale_and_check(g.dev, found, inv);
  EXPECT_EQ(found.item<float>(), 0.f);
  for (auto& h : g.host)
    for (double& x : h) x = static_cast<float>(x) * static_cast<float>(1.0 / 3);
  expect_list(g, 1e-7, 0, "grad");
  // An inf only in the last chunk of the last tensor; and a set flag stays set.
  Vec v(2 * kChunk + 5, 1.0);
  v.back() = -std::numeric_limits<double>::infinity();
  fused_unscale_and_check({gpu(v, DType::BFloat16)}, found, inv);
  EXPECT_EQ(found.item<float>(), 1.f);
  fused_unscale_and_check({gpu({1, 2}, DType::Float32)}, found, inv);
  EXPECT_EQ(found.item<float>(), 1.f);
}

// ---------------------------------------------------------------- L2 norm, scale

TEST_F(CudaFusedNorm, L2NormOfManyTensorsMatchesFloat64AndIsDeterministic) {
  std::vector<int64_t> sizes = many_small();
  sizes.insert(sizes.end(), kAwkward.begin(), kAwkward.end());
  sizes.push_back(0);  // no elements: no chunk
  TensorVec ts;
  double sum = 0;
  const DType dts[] = {DType::Float32, DType::BFloat16, DType::Float16};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const DType dt = dts[(i / 7) % 3];
    Vec v = rounded(uniform(sizes[i], -2, 2, 500 + i), dt);
    for (double x : v) sum += x * x;
    ts.push_back(gpu(v, dt, i % 5 == 2));
  }
  const Tensor n1 = fused_l2_norm(ts);
  EXPECT_EQ(n1.numel(), 1);
  EXPECT_EQ(n1.dtype(), DType::Float32);
  EXPECT_TRUE(n1.is_cuda());
  EXPECT_NEAR(n1.item<float>(), std::sqrt(sum), 1e-5 * std::sqrt(sum));
  const float a = n1.item<float>(), b = fused_l2_norm(ts).item<float>();
  EXPECT_EQ(0, std::memcmp(&a, &b, sizeof(float)));
  // Only empty tensors: 0.
  EXPECT_EQ(fused_l2_norm({internal::zeros({0}, {.device = kGpu})}).item<float>(), 0.f);
  // A single element.
  EXPECT_EQ(fused_l2_norm({gpu({-3}, DType::Float32)}).item<float>(), 3.f);
}

TEST_F(CudaFusedNorm, ScaleMixedDtypes) {
  std::vector<int64_t> sizes = kAwkward;
  TensorVec ts;
  std::vector<Vec> host;
  const DType dts[] = {DType::Float32, DType::BFloat16, DType::Float16};
  for (size_t i = 0; i < sizes.size(); ++i) {
    host.push_back(rounded(uniform(sizes[i], -2, 2, 600 + i), dts[i % 3]));
    ts.push_back(gpu(host.back(), dts[i % 3], misaligned_at(i)));
  }
  fused_scale(ts, gpu_scalar(0.37));
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    Vec want = host[i];
    for (double& x : want) x *= static_cast<double>(0.37f);
    const DType dt = dts[i % 3];
    // One rounding of float32 math: within half an ulp of dtype (plus float32 rounding).
    expect_values(ts[i], {sizes[i]}, want, dt == DType::Float32 ? 1e-7 : dt == DType::BFloat16 ? 8e-3 : 1e-3, 1e-7);
  }
}

TEST_F(CudaFusedLauncher, TensorSpanningTwoLaunchesAndNoNewMallocsAfterWarmUp) {
  // 321 chunks of one tensor between two small ones: the first launch fills its 320 blocks mid-tensor and
  // the tensor continues in the next launch.
  const std::vector<int64_t> sizes = {100, 321 * kChunk + 7, 5};
  TensorVec ts;
  std::vector<Vec> host;
  double sum = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    host.push_back(rounded(uniform(sizes[i], -1, 1, 700 + i), DType::Float32));
    for (double x : host.back()) sum += x * x;
    ts.push_back(gpu(host.back(), DType::Float32));
  }
  const float norm = fused_l2_norm(ts).item<float>();
  EXPECT_NEAR(norm, std::sqrt(sum), 1e-5 * std::sqrt(sum));
  fused_scale(ts, gpu_scalar(2));
  for (size_t i = 0; i < sizes.size(); ++i) {
    Vec want = host[i];
    for (double& x : want) x *= 2;
    expect_values(ts[i], {sizes[i]}, want, 0, 0);
  }

  // Warm up every entry point, then repeat: the caching allocator serves every temporary.
  const std::vector<int64_t> small = {1000, 70001, 3};
  List p = make_list(small, DType::BFloat16, -1, 1, 12, false);
  List g = grads_for(small, DType::BFloat16, 0, 1, false);
  List m = zeros_list(small), v = zeros_list(small), vx = zeros_list(small), b = zeros_list(small);
  TensorVec st = step_tensors(small.size());
  const Tensor gs = gpu_scalar(1), fi = gpu_scalar(0), inv = gpu_scalar(1);
  AdamHyper ah;
  ah.amsgrad = true;
  auto all = [&] {
    fused_sgd(p.dev, g.dev, b.dev, st, {.lr = 0.1, .momentum = 0.9}, gs, fi);
    fused_adam(p.dev, g.dev, m.dev, v.dev, vx.dev, st, ah, gs, fi);
    fused_lamb(p.dev, g.dev, m.dev, v.dev, st, {}, gs, fi);
    fused_unscale_and_check(g.dev, fi, inv);
    fused_scale(g.dev, inv);
    (void)fused_l2_norm(g.dev);
  };
  all();
  cuda::synchronize();
  const int64_t mallocs = cuda::memory_stats().num_device_mallocs;
  for (int k = 0; k < 3; ++k) all();
  cuda::synchronize();
  EXPECT_EQ(cuda::memory_stats().num_device_mallocs, mallocs);
  expect_steps(st, 4 * 3);  // 4 rounds of sgd, adam and lamb
}

}  // namespace
}  // namespace kiln::optim::cuda_impl

#else  // a build without CUDA: the suite exists and says why it does not run

TEST(CudaFused, NeedsACudaBuild) { GTEST_SKIP() << "kiln was built without CUDA (KILN_CUDA=OFF)"; }

#endif
