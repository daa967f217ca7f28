// tests/optim/scaler_test_optimizer.h — a tiny momentum SGD for the GradScaler tests, independent of the
// library's optimizers: buf = momentum * buf + grad; p -= lr * buf. step_with() does the same on the device
// and keeps the old values where found_inf != 0 (never reading it on the host), as the real optimizers must.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/optim/optimizer.h"

namespace kiln::testing {

class TestSgd : public optim::Optimizer {
 public:
  TestSgd(std::vector<Tensor> params, double lr, double momentum)
      : params_(std::move(params)), lr_(lr), momentum_(momentum) {
    for (const Tensor& p : params_) bufs_.push_back(internal::zeros_like(p));
  }

  void step() override {
    ++steps;
    NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) continue;
      auto [buf, p] = update(i, params_[i].grad());
      bufs_[i].copy_(buf);
      params_[i].copy_(p);
    }
  }

  void step_with(const Tensor& grad_scale, const Tensor& found_inf) override {
    ++step_with_calls;
    NoGradGuard no_grad;
    const Tensor skip = internal::gt(found_inf, 0.0).reshape({});  // 0-d bool on the device
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) continue;
      Tensor g = params_[i].grad();
      if (grad_scale.defined()) g = internal::div(g, grad_scale.reshape({}));
      auto [buf, p] = update(i, g);
      bufs_[i].copy_(internal::where(skip, bufs_[i], buf));
      params_[i].copy_(internal::where(skip, params_[i], p));
    }
  }

  void zero_grads() {
    for (Tensor& p : params_) p.mutable_grad() = Tensor();
  }

  size_t num_param_groups() const override { return 1; }
  const std::vector<Tensor>& params(size_t /*group*/) const override { return params_; }
  double lr(size_t /*group*/) const override { return lr_; }
  void set_lr(size_t /*group*/, double lr) override { lr_ = lr; }
  std::string name() const override { return "TestSgd"; }

  const std::vector<Tensor>& bufs() const { return bufs_; }
  int steps = 0;            // calls of step()
  int step_with_calls = 0;  // calls of step_with()

 protected:
  std::map<std::string, double> group_values(size_t /*group*/) const override { return {{"lr", lr_}}; }
  void set_group_values(size_t /*group*/, const std::map<std::string, double>& v) override { lr_ = v.at("lr"); }

 private:
  // (new buffer, new parameter) for parameter i and gradient g.
  std::pair<Tensor, Tensor> update(size_t i, const Tensor& g) const {
    Tensor buf = internal::add(internal::mul(bufs_[i], momentum_), g);
    Tensor p = internal::sub(params_[i], internal::mul(buf, lr_));
    return {buf, p};
  }

  std::vector<Tensor> params_, bufs_;
  double lr_, momentum_;
};

}  // namespace kiln::testing
