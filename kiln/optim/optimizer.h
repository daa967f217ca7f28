// kiln/optim/optimizer.h — the optimizer base: parameter groups with typed options, per-parameter state,
// zero_grad(), step(), and a state_dict that checkpoints save.
//
//   optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-5});
//   opt.add_param_group({.params = head->parameters(), .options = optim::SGDOptions{.lr = 0.01}});
//   for (...) { opt.zero_grad(); loss.backward(); opt.step(); }
//   opt.set_lr(0, 0.05);                                   // what the LR schedulers do, per group
//   auto sd = opt.state_dict();  opt2.load_state_dict(sd);  // exact resume
//
// Each optimizer (sgd.h, adam.h, lamb.h) is an OptimizerWith<Options>: a group holds its parameters and its
// own copy of the options. The non-template Optimizer interface is what LR schedulers (num_param_groups, lr,
// set_lr), the GradScaler (all_params, step) and checkpoints (state_dict) use; keep it stable.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::optim {

// A flat, name-keyed form of an optimizer's state, for checkpoints (kiln/data's HDF5 writer stores it as is):
//   tensors: "state.<param index>.<name>" (e.g. "state.3.exp_avg"; parameters are numbered across groups in
//            order), values: "param_groups.<g>.<option>" (e.g. "param_groups.0.lr") and "param_groups.<g>.size".
struct OptimizerState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> values;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Sets every parameter's .grad to none (default, as PyTorch >= 2.0) or to zeros.
  void zero_grad(bool set_to_none = true);
  // One update of every parameter that has a gradient. Runs without recording the graph.
  virtual void step() = 0;
  // [wip/amp: minimal declaration so amp::GradScaler compiles before the optim helper's merge; the optim
  //  helper's declaration (same signature) replaces it.] step() for AMP without a host sync: `grad_scale`
  //  (undefined: the gradients are already unscaled, which is what GradScaler passes) divides the gradients,
  //  and the whole update (parameters, state, step counts) is a no-op when `found_inf` (a 1-element float32
  //  tensor on the gradients' device) is non-zero.
  virtual void step_with(const Tensor& grad_scale, const Tensor& found_inf);

  virtual size_t num_param_groups() const = 0;
  virtual const std::vector<Tensor>& params(size_t group) const = 0;
  virtual double lr(size_t group) const = 0;
  virtual void set_lr(size_t group, double lr) = 0;
  // Every parameter of every group, in order.
  std::vector<Tensor> all_params() const;

  // The per-parameter state ("step", "exp_avg", "momentum_buffer", ...); empty before the first step.
  std::map<std::string, Tensor>& state(const Tensor& param);
  const std::map<std::string, Tensor>* find_state(const Tensor& param) const;

  virtual OptimizerState state_dict() const;
  // Throws kiln::Error naming the first mismatch (group count or sizes, a tensor's shape) and changes nothing then.
  virtual void load_state_dict(const OptimizerState& state);

  virtual std::string name() const = 0;  // "SGD", "Adam", ... (error messages, checkpoints)

 protected:
  // Options of a group as name -> value (numbers and flags), for state_dict; and back.
  virtual std::map<std::string, double> group_values(size_t group) const = 0;
  virtual void set_group_values(size_t group, const std::map<std::string, double>& values) = 0;

 private:
  // Keyed by the parameter's TensorImpl: a parameter is the same tensor for the optimizer's lifetime
  // (Module::to() changes tensors in place).
  std::map<const void*, std::map<std::string, Tensor>> state_;
};

// A group of parameters with its own options.
template <typename Options>
struct ParamGroup {
  std::vector<Tensor> params;
  Options options;
};

// The typed half of an optimizer: groups of Options. `Derived` implements step() over groups().
template <typename Options>
class OptimizerWith : public Optimizer {
 public:
  OptimizerWith(std::vector<Tensor> params, Options defaults) : defaults_(defaults) {
    add_param_group({std::move(params), defaults});
  }
  OptimizerWith(std::vector<ParamGroup<Options>> groups, Options defaults) : defaults_(defaults) {
    for (auto& g : groups) add_param_group(std::move(g));
  }

  // Parameters already in another group are an error (as PyTorch).
  void add_param_group(ParamGroup<Options> group);

  size_t num_param_groups() const override { return groups_.size(); }
  const std::vector<Tensor>& params(size_t group) const override { return groups_.at(group).params; }
  double lr(size_t group) const override { return groups_.at(group).options.lr; }
  void set_lr(size_t group, double lr) override { groups_.at(group).options.lr = lr; }
  std::vector<ParamGroup<Options>>& groups() { return groups_; }
  const std::vector<ParamGroup<Options>>& groups() const { return groups_; }
  const Options& defaults() const { return defaults_; }

 protected:
  Options defaults_;
  std::vector<ParamGroup<Options>> groups_;
};

}  // namespace kiln::optim
