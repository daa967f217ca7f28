// kiln/optim/adam.cpp — Adam and AdamW: the fused CUDA kernel for CUDA parameters, kiln ops for the others.
#include "kiln/optim/adam.h"

#include <cmath>

#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

#if KILN_WITH_CUDA
#include "kiln/optim/cuda/fused.h"
#endif

namespace kiln::optim {

template <bool kDecoupled>
void AdamOptionsOf<kDecoupled>::validate() const {
  KILN_CHECK(std::isfinite(lr) && lr >= 0, kName, ": invalid learning rate ", lr, " (lr must be >= 0)");
  KILN_CHECK(std::isfinite(eps) && eps >= 0, kName, ": invalid eps ", eps, " (must be >= 0)");
  for (int i = 0; i < 2; ++i) {
    KILN_CHECK(betas[i] >= 0 && betas[i] < 1, kName, ": invalid beta parameter at index ", i, ": ", betas[i],
               " (betas must be in [0, 1))");
  }
  KILN_CHECK(std::isfinite(weight_decay) && weight_decay >= 0, kName, ": invalid weight_decay ", weight_decay,
             " (must be >= 0)");
}

template <bool kDecoupled>
std::map<std::string, double> AdamOptionsOf<kDecoupled>::values() const {
  return {{"lr", lr},
          {"betas.0", betas[0]},
          {"betas.1", betas[1]},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"amsgrad", amsgrad ? 1.0 : 0.0},
          {"maximize", maximize ? 1.0 : 0.0}};
}

template <bool kDecoupled>
AdamOptionsOf<kDecoupled> AdamOptionsOf<kDecoupled>::from_values(const std::map<std::string, double>& v) {
  return {.lr = v.at("lr"),
          .betas = {v.at("betas.0"), v.at("betas.1")},
          .eps = v.at("eps"),
          .weight_decay = v.at("weight_decay"),
          .amsgrad = v.at("amsgrad") != 0,
          .maximize = v.at("maximize") != 0};
}

template struct AdamOptionsOf<false>;
template struct AdamOptionsOf<true>;

template <typename Options>
void AdamBase<Options>::update_bucket(size_t group, Optimizer::CudaBucket& bucket, const Tensor& grad_scale,
                                      const Tensor& found_inf) {
#if KILN_WITH_CUDA
  const Options& o = this->groups_[group].options;
  std::vector<Tensor> m, v, vmax, steps;
  for (const Tensor& p : bucket.originals) {
    m.push_back(this->state_tensor(p, "exp_avg"));
    v.push_back(this->state_tensor(p, "exp_avg_sq"));
    if (o.amsgrad) vmax.push_back(this->state_tensor(p, "max_exp_avg_sq"));
    steps.push_back(this->step_tensor(p));
  }
  cuda_impl::fused_adam(bucket.params, bucket.grads, m, v, vmax, steps,
                        {.lr = o.lr,
                         .beta1 = o.betas[0],
                         .beta2 = o.betas[1],
                         .eps = o.eps,
                         .weight_decay = o.weight_decay,
                         .decoupled_weight_decay = decoupled_weight_decay(),
                         .amsgrad = o.amsgrad,
                         .maximize = o.maximize,
                         .lr_device = this->graph_lr(group, bucket.params[0].device())},
                        grad_scale, found_inf, bucket.shadows);
#else
  OptimizerWith<Options>::update_bucket(group, bucket, grad_scale, found_inf);
#endif
}

template <typename Options>
void AdamBase<Options>::update_param(size_t group, const Tensor& p, Tensor g, Tensor& w, double t) {
  const Options& o = this->groups_[group].options;
  const auto [beta1, beta2] = o.betas;
  if (o.maximize) g = internal::neg(g);
  if (o.weight_decay != 0) {
    if (decoupled_weight_decay()) {
      internal::mul_(w, 1 - o.lr * o.weight_decay);
    } else {
      g = internal::add(g, w, o.weight_decay);
    }
  }
  Tensor& m = this->state_tensor(p, "exp_avg");
  Tensor& v = this->state_tensor(p, "exp_avg_sq");
  internal::mul_(m, beta1);
  internal::add_(m, g, 1 - beta1);
  internal::mul_(v, beta2);
  internal::add_(v, internal::mul(g, g), 1 - beta2);
  const double bias_correction1 = 1 - std::pow(beta1, t);
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(beta2, t));
  Tensor second = v;
  if (o.amsgrad) {
    Tensor& vmax = this->state_tensor(p, "max_exp_avg_sq");
    internal::copy_(vmax, internal::maximum(vmax, v));
    second = vmax;
  }
  Tensor denom = internal::add(internal::div(internal::sqrt(second), bias_correction2_sqrt), o.eps);
  internal::add_(w, internal::div(m, denom), -o.lr / bias_correction1);
}

template class AdamBase<AdamOptions>;
template class AdamBase<AdamWOptions>;

}  // namespace kiln::optim
