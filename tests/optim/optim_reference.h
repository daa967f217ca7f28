// tests/optim/optim_reference.h — independent float64 references of the optimizers (plain loops over
// std::vector<double>, written from PyTorch's documented algorithms), the shared test cases, and a harness
// that runs a kiln optimizer and the reference side by side on a quadratic loss.
//
//   run_trajectory(sgd_case, {.dtype = DType::Float64}, 1e-12, 1e-14);
//
// The loss of every case is sum_i (a_i / 2 * w_i^2 + b_i * w_i) over two parameters, p0 (2, 3) in group 0
// and p1 (4) in group 1 (same options, half the learning rate), so the gradient a * w + b depends on w.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/optim/adam.h"
#include "kiln/optim/lamb.h"
#include "kiln/optim/sgd.h"
#include "support/test_support.h"

namespace kiln::testing::optim_ref {

using Vec = std::vector<double>;
using AnyOptions = std::variant<optim::SGDOptions, optim::AdamOptions, optim::AdamWOptions, optim::LAMBOptions>;

struct RefState {
  Vec buf, m, v, vmax;
  int t = 0;
};

inline void ref_step(Vec& w, Vec g, RefState& s, const optim::SGDOptions& o) {
  const size_t n = w.size();
  for (size_t i = 0; i < n; ++i) {
    if (o.maximize) g[i] = -g[i];
    g[i] += o.weight_decay * w[i];
  }
  if (o.momentum != 0) {
    if (s.t == 0) {
      s.buf = g;
    } else {
      for (size_t i = 0; i < n; ++i) s.buf[i] = o.momentum * s.buf[i] + (1 - o.dampening) * g[i];
    }
    for (size_t i = 0; i < n; ++i) g[i] = o.nesterov ? g[i] + o.momentum * s.buf[i] : s.buf[i];
  }
  for (size_t i = 0; i < n; ++i) w[i] -= o.lr * g[i];
  ++s.t;
}

template <typename Options>
void ref_adam(Vec& w, Vec g, RefState& s, const Options& o, bool decoupled) {
  const size_t n = w.size();
  if (s.t == 0) s.m = s.v = s.vmax = Vec(n, 0.0);
  const double t = ++s.t;
  const double b1 = o.betas[0], b2 = o.betas[1];
  const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
  for (size_t i = 0; i < n; ++i) {
    double gi = o.maximize ? -g[i] : g[i];
    if (decoupled) {
      w[i] *= 1 - o.lr * o.weight_decay;
    } else {
      gi += o.weight_decay * w[i];
    }
    s.m[i] = b1 * s.m[i] + (1 - b1) * gi;
    s.v[i] = b2 * s.v[i] + (1 - b2) * gi * gi;
    s.vmax[i] = std::max(s.vmax[i], s.v[i]);
    const double second = o.amsgrad ? s.vmax[i] : s.v[i];
    w[i] -= o.lr / bc1 * s.m[i] / (std::sqrt(second) / std::sqrt(bc2) + o.eps);
  }
}
inline void ref_step(Vec& w, const Vec& g, RefState& s, const optim::AdamOptions& o) { ref_adam(w, g, s, o, false); }
inline void ref_step(Vec& w, const Vec& g, RefState& s, const optim::AdamWOptions& o) { ref_adam(w, g, s, o, true); }

inline void ref_step(Vec& w, const Vec& g, RefState& s, const optim::LAMBOptions& o) {
  const size_t n = w.size();
  if (s.t == 0) s.m = s.v = Vec(n, 0.0);
  const double t = ++s.t;
  const double b1 = o.betas[0], b2 = o.betas[1];
  const double bc1 = o.bias_correction ? 1 - std::pow(b1, t) : 1, bc2 = o.bias_correction ? 1 - std::pow(b2, t) : 1;
  Vec update(n);
  double pn = 0, un = 0;
  for (size_t i = 0; i < n; ++i) {
    s.m[i] = b1 * s.m[i] + (1 - b1) * g[i];
    s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i];
    update[i] = (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + o.eps) + o.weight_decay * w[i];
    pn += w[i] * w[i];
    un += update[i] * update[i];
  }
  pn = std::sqrt(pn), un = std::sqrt(un);
  const double trust = pn > 0 && un > 0 ? std::min(pn / un, o.max_trust_ratio) : 1.0;
  for (size_t i = 0; i < n; ++i) w[i] -= o.lr * trust * update[i];
}

template <typename Options>
struct OptimizerFor;
template <>
struct OptimizerFor<optim::SGDOptions> {
  using type = optim::SGD;
};
template <>
struct OptimizerFor<optim::AdamOptions> {
  using type = optim::Adam;
};
template <>
struct OptimizerFor<optim::AdamWOptions> {
  using type = optim::AdamW;
};
template <>
struct OptimizerFor<optim::LAMBOptions> {
  using type = optim::LAMB;
};

// Group 0 holds p0 with `o`, group 1 holds p1 with o and half its learning rate.
inline std::unique_ptr<optim::Optimizer> make_optimizer(const AnyOptions& options, const Tensor& p0, const Tensor& p1) {
  return std::visit(
      [&](const auto& o) -> std::unique_ptr<optim::Optimizer> {
        using O = std::decay_t<decltype(o)>;
        O half = o;
        half.lr *= 0.5;
        std::vector<optim::ParamGroup<O>> groups{{{p0}, o}, {{p1}, half}};
        return std::make_unique<typename OptimizerFor<O>::type>(std::move(groups), o);
      },
      options);
}

struct Case {
  std::string name;
  AnyOptions options;
};

// The cases torch.optim has too (tests/golden/make_golden_optim.py has the same table).
inline std::vector<Case> torch_cases() {
  using namespace optim;
  return {
      {"sgd_plain", SGDOptions{.lr = 0.1}},
      {"sgd_momentum", SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}},
      {"sgd_nesterov", SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}},
      {"sgd_maximize", SGDOptions{.lr = 0.05, .momentum = 0.5, .maximize = true}},
      {"adam", AdamOptions{.lr = 0.01}},
      {"adam_wd_amsgrad",
       AdamOptions{.lr = 0.01, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 0.1, .amsgrad = true}},
      {"adam_maximize", AdamOptions{.lr = 0.01, .weight_decay = 0.05, .maximize = true}},
      {"adamw", AdamWOptions{.lr = 0.01, .weight_decay = 0.1}},
      {"adamw_amsgrad", AdamWOptions{.lr = 0.02, .betas = {0.85, 0.95}, .weight_decay = 0.05, .amsgrad = true}},
  };
}

inline std::vector<Case> lamb_cases() {
  using namespace optim;
  return {
      {"lamb", LAMBOptions{.lr = 0.01}},
      {"lamb_no_bias_correction",
       LAMBOptions{.lr = 0.02, .betas = {0.8, 0.9}, .weight_decay = 0.1, .bias_correction = false}},
      // A trust ratio cap below ||p|| / ||update||: the clamp is active.
      {"lamb_clamped", LAMBOptions{.lr = 0.01, .weight_decay = 0, .max_trust_ratio = 0.3}},
  };
}

inline std::vector<Case> all_cases() {
  auto cases = torch_cases();
  for (auto& c : lamb_cases()) cases.push_back(c);
  return cases;
}

// The problem every case runs: initial values and quadratic coefficients of p0 (2, 3) and p1 (4).
struct Problem {
  std::vector<Shape> shapes = {{2, 3}, {4}};
  std::vector<Vec> init, a, b;
  Problem() {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const int64_t n = kiln::numel(shapes[i]);
      init.push_back(uniform(n, -1, 1, 11 + i));
      a.push_back(uniform(n, 0.5, 2, 21 + i));
      b.push_back(uniform(n, -1, 1, 31 + i));
    }
  }
  Vec grad(size_t i, const Vec& w) const {
    Vec g(w.size());
    for (size_t k = 0; k < w.size(); ++k) g[k] = a[i][k] * w[k] + b[i][k];
    return g;
  }
  // Sets p.grad to a * p + b, computed on the host from p's current values, in p's dtype and device.
  void set_grad(size_t i, Tensor& p) const { p.mutable_grad() = make(grad(i, values(p)), p.shape(), p.options()); }
};

inline void ref_step_any(Vec& w, const Vec& g, RefState& s, const AnyOptions& options, double lr_factor) {
  std::visit(
      [&](auto o) {
        o.lr *= lr_factor;
        ref_step(w, g, s, o);
      },
      options);
}

// Runs `steps` steps of the case with kiln (params made with `topts`) and the reference, comparing the
// parameters after every step. `prepare` may change the parameters first (e.g. make one non-contiguous).
inline void run_trajectory(const Case& c, const TensorOptions& topts, double rtol, double atol, int steps = 5) {
  SCOPED_TRACE(c.name + " " + std::string(dtype_name(topts.dtype.value_or(DType::Float32))) + " on " +
               topts.device.str());
  Problem pb;
  std::vector<Tensor> ps;
  std::vector<Vec> ref = pb.init;
  std::vector<RefState> rs(2);
  for (size_t i = 0; i < 2; ++i) ps.push_back(make(pb.init[i], pb.shapes[i], topts).requires_grad_());
  auto opt = make_optimizer(c.options, ps[0], ps[1]);
  for (int k = 0; k < steps; ++k) {
    for (size_t i = 0; i < 2; ++i) {
      pb.set_grad(i, ps[i]);
      ref_step_any(ref[i], pb.grad(i, ref[i]), rs[i], c.options, i == 0 ? 1.0 : 0.5);
    }
    opt->step();
    for (size_t i = 0; i < 2; ++i) {
      SCOPED_TRACE("step " + std::to_string(k + 1) + ", parameter " + std::to_string(i));
      expect_values(ps[i], pb.shapes[i], ref[i], rtol, atol);
    }
  }
}

}  // namespace kiln::testing::optim_ref
