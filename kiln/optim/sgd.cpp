// kiln/optim/sgd.cpp — SGD: the fused CUDA kernel for CUDA parameters, kiln ops for the others.
#include "kiln/optim/sgd.h"

#include <cmath>

#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

#if KILN_WITH_CUDA
#include "kiln/optim/cuda/fused.h"
#endif

namespace kiln::optim {

void SGDOptions::validate() const {
  KILN_CHECK(std::isfinite(lr) && lr >= 0, "SGD: invalid learning rate ", lr, " (lr must be >= 0)");
  KILN_CHECK(std::isfinite(momentum) && momentum >= 0, "SGD: invalid momentum ", momentum, " (must be >= 0)");
  KILN_CHECK(std::isfinite(dampening), "SGD: invalid dampening ", dampening);
  KILN_CHECK(std::isfinite(weight_decay) && weight_decay >= 0, "SGD: invalid weight_decay ", weight_decay,
             " (must be >= 0)");
  KILN_CHECK(!nesterov || (momentum > 0 && dampening == 0),
             "SGD: nesterov momentum requires momentum > 0 and dampening == 0 (got momentum ", momentum, ", dampening ",
             dampening, ")");
}

std::map<std::string, double> SGDOptions::values() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0},
          {"maximize", maximize ? 1.0 : 0.0}};
}

SGDOptions SGDOptions::from_values(const std::map<std::string, double>& v) {
  return {.lr = v.at("lr"),
          .momentum = v.at("momentum"),
          .dampening = v.at("dampening"),
          .weight_decay = v.at("weight_decay"),
          .nesterov = v.at("nesterov") != 0,
          .maximize = v.at("maximize") != 0};
}

void SGD::update_bucket(size_t group, CudaBucket& bucket, const Tensor& grad_scale, const Tensor& found_inf) {
#if KILN_WITH_CUDA
  const SGDOptions& o = groups_[group].options;
  std::vector<Tensor> bufs, steps;
  for (const Tensor& p : bucket.originals) {
    if (o.momentum != 0) bufs.push_back(state_tensor(p, "momentum_buffer"));
    steps.push_back(step_tensor(p));
  }
  cuda_impl::fused_sgd(bucket.params, bucket.grads, bufs, steps,
                       {.lr = o.lr,
                        .momentum = o.momentum,
                        .dampening = o.dampening,
                        .weight_decay = o.weight_decay,
                        .nesterov = o.nesterov,
                        .maximize = o.maximize,
                        .lr_device = graph_lr(group, bucket.params[0].device())},
                       grad_scale, found_inf, bucket.shadows);
#else
  OptimizerWith::update_bucket(group, bucket, grad_scale, found_inf);
#endif
}

void SGD::update_param(size_t group, const Tensor& p, Tensor d, Tensor& w, double t) {
  const SGDOptions& o = groups_[group].options;
  if (o.maximize) d = internal::neg(d);
  if (o.weight_decay != 0) d = internal::add(d, w, o.weight_decay);
  if (o.momentum != 0) {
    // A buffer made now (first step, or momentum switched on later) starts as the gradient (PyTorch).
    const bool fresh = t == 1 || !state(p).count("momentum_buffer");
    Tensor& buf = state_tensor(p, "momentum_buffer");
    if (fresh) {
      internal::copy_(buf, d);
    } else {
      internal::mul_(buf, o.momentum);
      internal::add_(buf, d, 1 - o.dampening);
    }
    d = o.nesterov ? internal::add(d, buf, o.momentum) : buf;
  }
  internal::add_(w, d, -o.lr);
}

}  // namespace kiln::optim
