// kiln/optim/sgd.cpp — SGD: the fused CUDA kernel for CUDA parameters, kiln ops for the others.
#include "kiln/optim/sgd.h"

#include <cmath>

#include "kiln/autograd/grad_mode.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/ops.h"

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

void SGD::step_with(const Tensor& grad_scale, const Tensor& found_inf) {
  NoGradGuard no_grad;
  bool skip_cpu = false, skip_read = false;  // found_inf is read on the host once, if a CPU parameter needs it
  for (auto& group : groups_) {
    const SGDOptions& o = group.options;
    StepPlan plan = plan_step(group.params);
#if KILN_WITH_CUDA
    for (auto& bucket : plan.cuda) {
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
                            .maximize = o.maximize},
                           grad_scale, found_inf);
      finish_bucket(bucket);
    }
#endif
    if (plan.cpu.empty()) continue;
    if (!skip_read) skip_cpu = found_inf_set(found_inf), skip_read = true;
    if (skip_cpu) continue;
    for (Tensor& p : plan.cpu) {
      const DType math = state_dtype(p);
      Tensor d = cpu_grad(p, grad_scale, math);  // may share the gradient: never written in place
      if (o.maximize) d = ops::neg(d);
      Tensor w = p.dtype() == math ? p : ops::cast(p, math);
      if (o.weight_decay != 0) d = ops::add(d, w, o.weight_decay);
      Tensor& step = step_tensor(p);
      const double t = step.item<float>();
      if (o.momentum != 0) {
        // A buffer made now (first step, or momentum switched on later) starts as the gradient (PyTorch).
        const bool fresh = t == 0 || !state(p).count("momentum_buffer");
        Tensor& buf = state_tensor(p, "momentum_buffer");
        if (fresh) {
          ops::copy_(buf, d);
        } else {
          ops::mul_(buf, o.momentum);
          ops::add_(buf, d, 1 - o.dampening);
        }
        d = o.nesterov ? ops::add(d, buf, o.momentum) : buf;
      }
      ops::add_(w, d, -o.lr);
      if (!w.is_same(p)) ops::copy_(p, w);
      ops::fill_(step, t + 1);
    }
  }
}

}  // namespace kiln::optim
