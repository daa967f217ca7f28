// tests/optim/scheduler_test_optimizer.h — a test-only Optimizer that holds one lr per group and nothing else,
// for the LR scheduler tests (they need num_param_groups, lr and set_lr only).
//
//   LrOnlyOptimizer opt({0.1, 0.02});   // two groups
//   optim::StepLR sched(opt, 3, 0.5);
//
// It overrides every virtual of optim::Optimizer and calls none of its non-virtual members, so the tests do not
// depend on the optimizers' implementation.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.h"

namespace kiln::testing {

class LrOnlyOptimizer final : public optim::Optimizer {
 public:
  explicit LrOnlyOptimizer(std::vector<double> lrs) : lrs_(std::move(lrs)) {}

  void step() override {}
  size_t num_param_groups() const override { return lrs_.size(); }
  const std::vector<Tensor>& params(size_t group) const override {
    (void)lrs_.at(group);
    return no_params_;
  }
  double lr(size_t group) const override { return lrs_.at(group); }
  void set_lr(size_t group, double lr) override { lrs_.at(group) = lr; }
  optim::OptimizerState state_dict() const override { return {}; }
  void load_state_dict(const optim::OptimizerState& state) override { (void)state; }
  std::string name() const override { return "LrOnlyOptimizer"; }

  void add_group(double lr) { lrs_.push_back(lr); }
  const std::vector<double>& lrs() const { return lrs_; }

 protected:
  std::map<std::string, double> group_values(size_t group) const override { return {{"lr", lrs_.at(group)}}; }
  void set_group_values(size_t group, const std::map<std::string, double>& values) override {
    lrs_.at(group) = values.at("lr");
  }

 private:
  std::vector<double> lrs_;
  std::vector<Tensor> no_params_;
};

}  // namespace kiln::testing
