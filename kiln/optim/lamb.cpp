// kiln/optim/lamb.cpp — LAMB: the fused CUDA kernel for CUDA parameters, kiln ops for the others.
#include "kiln/optim/lamb.h"

#include <algorithm>
#include <cmath>

#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

#if KILN_WITH_CUDA
#include "kiln/optim/cuda/fused.h"
#endif

namespace kiln::optim {

void LAMBOptions::validate() const {
  KILN_CHECK(std::isfinite(lr) && lr >= 0, "LAMB: invalid learning rate ", lr, " (lr must be >= 0)");
  KILN_CHECK(std::isfinite(eps) && eps >= 0, "LAMB: invalid eps ", eps, " (must be >= 0)");
  for (int i = 0; i < 2; ++i) {
    KILN_CHECK(betas[i] >= 0 && betas[i] < 1, "LAMB: invalid beta parameter at index ", i, ": ", betas[i],
               " (betas must be in [0, 1))");
  }
  KILN_CHECK(std::isfinite(weight_decay) && weight_decay >= 0, "LAMB: invalid weight_decay ", weight_decay,
             " (must be >= 0)");
  KILN_CHECK(std::isfinite(max_trust_ratio) && max_trust_ratio > 0, "LAMB: invalid max_trust_ratio ", max_trust_ratio,
             " (must be > 0)");
}

std::map<std::string, double> LAMBOptions::values() const {
  return {{"lr", lr},
          {"betas.0", betas[0]},
          {"betas.1", betas[1]},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"bias_correction", bias_correction ? 1.0 : 0.0},
          {"max_trust_ratio", max_trust_ratio}};
}

LAMBOptions LAMBOptions::from_values(const std::map<std::string, double>& v) {
  return {.lr = v.at("lr"),
          .betas = {v.at("betas.0"), v.at("betas.1")},
          .eps = v.at("eps"),
          .weight_decay = v.at("weight_decay"),
          .bias_correction = v.at("bias_correction") != 0,
          .max_trust_ratio = v.at("max_trust_ratio")};
}

void LAMB::update_bucket(size_t group, CudaBucket& bucket, const Tensor& grad_scale, const Tensor& found_inf) {
#if KILN_WITH_CUDA
  const LAMBOptions& o = groups_[group].options;
  std::vector<Tensor> m, v, steps;
  for (const Tensor& p : bucket.originals) {
    m.push_back(state_tensor(p, "exp_avg"));
    v.push_back(state_tensor(p, "exp_avg_sq"));
    steps.push_back(step_tensor(p));
  }
  cuda_impl::fused_lamb(bucket.params, bucket.grads, m, v, steps,
                        {.lr = o.lr,
                         .beta1 = o.betas[0],
                         .beta2 = o.betas[1],
                         .eps = o.eps,
                         .weight_decay = o.weight_decay,
                         .bias_correction = o.bias_correction,
                         .max_trust_ratio = o.max_trust_ratio,
                         .lr_device = graph_lr(group, bucket.params[0].device())},
                        grad_scale, found_inf, bucket.shadows);
#else
  OptimizerWith::update_bucket(group, bucket, grad_scale, found_inf);
#endif
}

void LAMB::update_param(size_t group, const Tensor& p, Tensor g, Tensor& w, double t) {
  const LAMBOptions& o = groups_[group].options;
  const auto [beta1, beta2] = o.betas;
  Tensor& m = state_tensor(p, "exp_avg");
  Tensor& v = state_tensor(p, "exp_avg_sq");
  internal::mul_(m, beta1);
  internal::add_(m, g, 1 - beta1);
  internal::mul_(v, beta2);
  internal::add_(v, internal::mul(g, g), 1 - beta2);
  const double bc1 = o.bias_correction ? 1 - std::pow(beta1, t) : 1.0;
  const double bc2 = o.bias_correction ? 1 - std::pow(beta2, t) : 1.0;
  Tensor update = internal::div(internal::div(m, bc1), internal::add(internal::sqrt(internal::div(v, bc2)), o.eps));
  if (o.weight_decay != 0) update = internal::add(update, w, o.weight_decay);
  const double p_norm = internal::norm(internal::cast(w, DType::Float64)).item<double>();
  const double u_norm = internal::norm(internal::cast(update, DType::Float64)).item<double>();
  const double trust = p_norm > 0 && u_norm > 0 ? std::clamp(p_norm / u_norm, 0.0, o.max_trust_ratio) : 1.0;
  internal::add_(w, update, -o.lr * trust);
}

}  // namespace kiln::optim
