// kiln/optim/adam.h — Adam (L2 weight decay) and AdamW (decoupled weight decay), exactly as torch.optim.Adam
// and torch.optim.AdamW.
//
//   optim::AdamW opt(model->parameters(), {.lr = 1e-4, .betas = {0.9, 0.999}, .weight_decay = 0.01});
//   opt.zero_grad();  loss.backward();  opt.step();
//
// Per parameter with gradient g (negated when maximize), at step t = 1, 2, ...:
//   Adam:  g += weight_decay * p            AdamW:  p *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2;  v_max = max(v_max, v) (amsgrad)
//   p -= lr / (1 - beta1^t) * m / (sqrt(amsgrad ? v_max : v) / sqrt(1 - beta2^t) + eps)
// State: "step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (amsgrad).
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// Adam's options (kDecoupled false) and AdamW's (true): they differ in the name and in weight decay, which AdamW
// applies to the parameter (p *= 1 - lr * weight_decay) with 0.01 by default, and Adam adds to the gradient (L2).
template <bool kDecoupled>
struct AdamOptionsOf {
  static constexpr const char* kName = kDecoupled ? "AdamW" : "Adam";  // the optimizer's name
  double lr = 1e-3;                                                    // learning rate, >= 0
  std::array<double, 2> betas = {0.9, 0.999};                          // each in [0, 1)
  double eps = 1e-8;                                                   // added to the denominator, >= 0
  double weight_decay = kDecoupled ? 1e-2 : 0;                         // >= 0; decoupled in AdamW, L2 in Adam
  bool amsgrad = false;   // divide by the running max of v (state "max_exp_avg_sq")
  bool maximize = false;  // ascend instead of descend

  void validate() const;                         // throws kiln::Error naming the bad option
  std::map<std::string, double> values() const;  // by name, flags as 0 or 1 (state_dict)
  static AdamOptionsOf from_values(const std::map<std::string, double>& values);  // the inverse of values()
};
using AdamOptions = AdamOptionsOf<false>;  // Adam's options
using AdamWOptions = AdamOptionsOf<true>;  // AdamW's options
extern template struct AdamOptionsOf<false>;
extern template struct AdamOptionsOf<true>;

// Adam and AdamW share one implementation (adam.cpp), instantiated for both options types.
template <typename Options>
class AdamBase : public HookedOptimizer<Options> {
 public:
  using HookedOptimizer<Options>::HookedOptimizer;  // (params, options = {}) or (groups, defaults = {})

 protected:
  void update_bucket(size_t group, Optimizer::CudaBucket& bucket, const Tensor& grad_scale,
                     const Tensor& found_inf) override;
  void update_param(size_t group, const Tensor& param, Tensor grad, Tensor& w, double t) override;  // the CPU update
  // True for AdamW (weight decay scales the parameter), false for Adam.
  virtual bool decoupled_weight_decay() const = 0;
};
extern template class AdamBase<AdamOptions>;
extern template class AdamBase<AdamWOptions>;

// Adam (L2 weight decay added to the gradient), with fused multi-tensor kernels on the GPU.
class Adam : public AdamBase<AdamOptions> {
 public:
  using AdamBase::AdamBase;

 protected:
  // False: weight decay is added to the gradient.
  bool decoupled_weight_decay() const override { return false; }
};

// AdamW (decoupled weight decay), with fused multi-tensor kernels on the GPU.
class AdamW : public AdamBase<AdamWOptions> {
 public:
  using AdamBase::AdamBase;

 protected:
  // True: weight decay scales the parameter.
  bool decoupled_weight_decay() const override { return true; }
};

}  // namespace kiln::optim
