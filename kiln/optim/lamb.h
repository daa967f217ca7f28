// kiln/optim/lamb.h — LAMB (layer-wise adaptive moments, You et al. 2019) as NVIDIA's FusedLAMB (apex) without
// gradient averaging: the large-batch optimizer of BERT pretraining.
//
//   optim::LAMB opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
//   opt.zero_grad();  loss.backward();  opt.step();
//
// Per parameter (a whole tensor is one "layer") with gradient g, at step t = 1, 2, ...:
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t)   (m, v themselves without bias_correction)
//   update = m_hat / (sqrt(v_hat) + eps) + weight_decay * p
//   trust = ||p|| / ||update|| (1 where either norm is 0), clamped to [0, max_trust_ratio]
//   p -= lr * trust * update
// State: "step", "exp_avg", "exp_avg_sq". There is no torch.optim.LAMB.
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// LAMB's hyperparameters (see the update above).
struct LAMBOptions {
  static constexpr const char* kName = "LAMB";  // the optimizer's name
  double lr = 1e-3;                             // learning rate, >= 0
  std::array<double, 2> betas = {0.9, 0.999};   // each in [0, 1)
  double eps = 1e-6;                            // added to the denominator, >= 0
  double weight_decay = 0.01;                   // decoupled: part of the update the trust ratio scales
  bool bias_correction = true;                  // divide m, v by 1 - beta1^t, 1 - beta2^t
  double max_trust_ratio = 10.0;                // > 0

  void validate() const;                         // throws kiln::Error naming the bad option
  std::map<std::string, double> values() const;  // by name, flags as 0 or 1 (state_dict)
  static LAMBOptions from_values(const std::map<std::string, double>& values);  // the inverse of values()
};

// The LAMB optimizer (see above), with fused multi-tensor kernels for CUDA parameters.
class LAMB : public HookedOptimizer<LAMBOptions> {
 public:
  using HookedOptimizer::HookedOptimizer;  // (params, options = {}) or (groups, defaults = {})

 protected:
  void update_bucket(size_t group, CudaBucket& bucket, const Tensor& grad_scale, const Tensor& found_inf) override;
  void update_param(size_t group, const Tensor& param, Tensor grad, Tensor& w, double t) override;  // the CPU update
};

}  // namespace kiln::optim
