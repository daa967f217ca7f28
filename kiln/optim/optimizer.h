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
// set_lr), the GradScaler (all_params, step, step_with) and checkpoints (state_dict) use; keep it stable.
//
// Where the update runs: CUDA parameters are updated by the fused multi-tensor kernels (kiln/optim/cuda/,
// a few launches per group, grouped by device and dtype, no host synchronisation); other parameters by
// kiln ops, one parameter at a time, in float64 for float64 parameters and float32 for 16-bit ones.
// State tensors are float32 for 16-bit parameters and the parameter's dtype otherwise; "step" is a
// 1-element float32 tensor on the parameter's device (as PyTorch), so a kernel can count on the device.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln {
struct SparseRowGrad;  // kiln/autograd/sparse_grad.h
}  // namespace kiln

namespace kiln::optim {

// A flat, name-keyed form of an optimizer's state, for checkpoints (kiln/data's HDF5 writer stores it as is):
//   tensors: "state.<param index>.<name>" (e.g. "state.3.exp_avg", "state.3.step"; parameters are numbered
//            across groups in order), values: "param_groups.<g>.<option>" (e.g. "param_groups.0.lr",
//            "param_groups.0.betas.1"; flags are 0 or 1) and "param_groups.<g>.size".
// state_dict() gives the live state tensors (as PyTorch: copy them for a snapshot); load_state_dict() copies.
struct OptimizerState {
  std::map<std::string, Tensor> tensors{};  // "state.<param index>.<name>" -> the state tensor
  std::map<std::string, double> values{};   // "param_groups.<g>.<option>" and "param_groups.<g>.size"
};

// The base of the optimizers: parameter groups, step(), zero_grad(), state_dict() and load_state_dict(), as
// torch.optim.Optimizer.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Sets every parameter's .grad to none (default, as PyTorch >= 2.0) or to zeros.
  void zero_grad(bool set_to_none = true);
  // One update of every parameter that has a gradient (the others are skipped, their state untouched).
  // Runs without recording the graph.
  virtual void step() = 0;

  // For amp::GradScaler (internal): one step with every gradient divided by `grad_scale`, and no change at
  // all (parameters, states, step counts) when `found_inf` is non-zero. Both are 1-element float32 tensors
  // (or undefined: no scaling, no check). CUDA parameters read them on the device (no host sync); CPU
  // parameters read them on the host. Optimizers without support throw; see supports_step_with().
  virtual void step_with(const Tensor& grad_scale, const Tensor& found_inf);
  // True when step_with() is implemented (the base's throws).
  virtual bool supports_step_with() const { return false; }

  virtual size_t num_param_groups() const = 0;                        // the number of parameter groups
  virtual const std::vector<Tensor>& params(size_t group) const = 0;  // the parameters of a group
  virtual double lr(size_t group) const = 0;                          // the learning rate of a group
  virtual void set_lr(size_t group, double lr) = 0;                   // what the LR schedulers call
  // Every parameter of every group, in order.
  std::vector<Tensor> all_params() const;

  // The per-parameter state ("step", "exp_avg", "momentum_buffer", ...); empty before the first step.
  std::map<std::string, Tensor>& state(const Tensor& param);
  const std::map<std::string, Tensor>* find_state(const Tensor& param) const;  // null when param has none

  // The live state tensors and every group's options. Waits first for the GPUs that updated a parameter in
  // page-locked host memory through its mapping (a device-held sparse gradient, kiln/autograd/sparse_grad.h).
  virtual OptimizerState state_dict() const;
  // Throws kiln::Error naming the first mismatch (group count or sizes, a missing option, a tensor's shape)
  // and changes nothing then. Tensors are copied to each parameter's device (and state dtype).
  virtual void load_state_dict(const OptimizerState& state);

  virtual std::string name() const = 0;  // "SGD", "Adam", ... (error messages, checkpoints)

 protected:
  // Options of a group as name -> value (numbers and flags), for state_dict; and back (`values` holds every
  // name group_values gives; set_group_values validates and throws before changing anything).
  virtual std::map<std::string, double> group_values(size_t group) const = 0;
  // Sets a group's options from such a map; throws, changing nothing, on a bad value.
  virtual void set_group_values(size_t group, const std::map<std::string, double>& values) = 0;

  // ---- helpers for the optimizers' step() ----

  // Rejects undefined, non-floating and non-leaf tensors, duplicates within `params` and parameters already
  // in a group of this optimizer, naming the offending index. (Takes the name: it runs in constructors.)
  void check_new_params(const std::vector<Tensor>& params, const std::string& optimizer_name) const;
  // Throws when a group (number `group_number`, 1-based; 0: the list of groups itself) has no parameter.
  static void check_nonempty(size_t group_number, size_t size, const std::string& optimizer_name);
  // Throws when `group` is not below `count`, naming the call.
  static void check_group(size_t group, size_t count, const char* call, const std::string& optimizer_name);

  // The parameters of one group that have a gradient, split by where they are updated.
  struct CudaBucket {                   // one device and dtype: one fused call
    std::vector<Tensor> params, grads;  // contiguous (a copy where the parameter or gradient is not)
    std::vector<Tensor> originals;      // the parameters themselves (state lookup, copy-back)
    // The 16-bit shadows update_bucket writes (autocast::shadow): empty, or one per parameter, undefined where
    // none is kept; all of one dtype.
    std::vector<Tensor> shadows;
    // That dtype: the first shadow's, set when it joins the bucket (a later one of another dtype is not kept).
    std::optional<DType> shadow_dtype;
  };
  // The parameters of one group that have a gradient, split by where they are updated.
  struct StepPlan {
    std::vector<Tensor> cpu;       // updated with kiln ops, one by one
    std::vector<CudaBucket> cuda;  // CUDA ones, one bucket per device and dtype
  };
  // Sorts the parameters that have a gradient into CPU ones and CUDA buckets; throws when a gradient's shape or
  // device differs from its parameter's.
  StepPlan plan_step(const std::vector<Tensor>& params) const;
  // Writes bucket.params back into the parameters they were copied from (non-contiguous parameters), counts
  // the in-place update in each parameter's version, and marks the shadows written.
  static void finish_bucket(CudaBucket& bucket);

  // One step of every group through two hooks (what SGD, Adam, AdamW and LAMB implement): each CUDA bucket goes
  // to update_bucket (one fused launch, reading grad_scale and found_inf on the device); each CPU parameter to
  // update_param, unless found_inf is set, with `grad` (divided by grad_scale, in the math dtype; it may share
  // memory with .grad, so never write it in place), `w` (the parameter in the math dtype: the parameter itself
  // when it already is) and the step number t = 1, 2, ... being taken. The caller then copies w back into the
  // parameter and advances "step". Runs without recording the graph.
  void step_by_hooks(const Tensor& grad_scale, const Tensor& found_inf);
  // step_by_hooks' part for the parameters of `group` that hold a sparse gradient and take the unfused path
  // (update_sparse_param each): `sparse_params`, without those the fused path updated.
  void step_sparse(size_t group, const std::vector<Tensor>& sparse_params, const Tensor& grad_scale);
  // The CUDA hook: updates a bucket with one fused launch; the base version throws.
  virtual void update_bucket(size_t group, CudaBucket& bucket, const Tensor& grad_scale, const Tensor& found_inf);
  // The CPU hook: writes the parameter's new value into w; the base version throws.
  virtual void update_param(size_t group, const Tensor& param, Tensor grad, Tensor& w, double t);

  // Row-sparse gradients (kiln/autograd/sparse_grad.h). step_by_hooks first calls check_sparse_param for every
  // parameter that holds one, before any parameter changes; the base refuses, naming the optimizer, the shape and
  // the optimizers that take them (SGD, SparseAdam, RowWiseAdagrad override it). Then, on any device and through
  // kiln ops (unless found_inf is set, read on the host), update_sparse_param gets the gradient coalesced (sorted
  // unique rows, duplicates summed), divided by grad_scale, its values in the math dtype (state_dtype); it updates
  // only those rows of the parameter (and of its state) in place. The caller then advances "step".
  virtual void check_sparse_param(size_t group, const Tensor& param) const;
  // The same first pass calls this for every parameter that holds a dense gradient; the base accepts them all
  // (SparseAdam refuses them, RowWiseAdagrad refuses 0-d parameters).
  virtual void check_dense_param(size_t /*group*/, const Tensor& /*param*/) const {}
  // For check_sparse_param overrides: kiln::Error unless `weight_decay` is 0, as weight decay would change every row.
  void refuse_sparse_weight_decay(size_t group, double weight_decay, const Tensor& param) const;
  // The sparse hook (see check_sparse_param); the base version throws.
  virtual void update_sparse_param(size_t group, const Tensor& param, const SparseRowGrad& grad, double t);
  // The fused path of a sparse gradient on a GPU: for a parameter where sparse_fused is true, step_by_hooks calls
  // update_sparse_fused instead, with the gradient as accumulated (not coalesced) and grad_scale and found_inf as
  // given; it updates the rows and advances "step" on the gradient's device, without a host synchronisation (also
  // for a parameter in page-locked host memory, through its mapping). The base versions: false, and a throw. A
  // device-held gradient (on another device than its parameter) that takes the unfused path is copied to the
  // parameter's device first.
  virtual bool sparse_fused(size_t /*group*/, const Tensor& /*param*/) const { return false; }
  // The fused update itself (see sparse_fused); the base version throws.
  virtual void update_sparse_fused(size_t group, const Tensor& param, const SparseRowGrad& grad,
                                   const Tensor& grad_scale, const Tensor& found_inf);
  // load_state_dict's check and copy of one saved state tensor `name` (under `key`) of `param`: the base takes
  // "step" (one element; 1-element float32 on the parameter's device) and floating tensors of the parameter's
  // shape (copied in state_dtype to its device; page-locked for a page-locked parameter, as detail::state_options).
  // Optimizers whose state has another form (a per-row state, a list of rows) override it for those names and call it
  // for the others. Throws kiln::Error naming `key`.
  virtual Tensor load_state_tensor(const Tensor& param, size_t index, const std::string& name, const Tensor& saved,
                                   const std::string& key) const;

  // The dtype state tensors and CPU math use for a parameter: float32 for 16-bit floats, else its dtype.
  static DType state_dtype(const Tensor& param);
  // The state tensor `name` of `param`: created as zeros (param's shape, state dtype, device; page-locked for a
  // page-locked parameter, detail::state_options) when absent.
  Tensor& state_tensor(const Tensor& param, const std::string& name);
  // The "step" tensor of `param` (1-element float32 beside it, as state_tensor), created as 0 when absent.
  Tensor& step_tensor(const Tensor& param);
  // For the fused kernels' lr_device (kiln/optim/cuda/fused.h). Outside a CUDA graph capture: nullptr (the
  // kernels take the group's lr as a value). During one (cuda::Graph::capturing()): the memory of a 1-element
  // float64 tensor on `device` that every replay first fills with lr(group), so that LR schedulers keep
  // working; a replay throws if the group's other options changed since the capture.
  const double* graph_lr(size_t group, Device device);

 private:
  // Keyed by the parameter's TensorImpl: a parameter is the same tensor for the optimizer's lifetime
  // (Module::to() changes tensors in place).
  std::map<const void*, std::map<std::string, Tensor>> state_;
  // The GPUs (indices) that have updated a page-locked host parameter through its mapping: state_dict() and
  // load_state_dict() wait for them.
  std::set<int> mapped_devices_;
  // Waits for every GPU in mapped_devices_.
  void wait_for_mapped_updates() const;
  // Replay hooks of CUDA graphs hold this weakly: a replay after the optimizer is gone throws.
  std::shared_ptr<Optimizer*> alive_ = std::make_shared<Optimizer*>(this);
};

// A group of parameters with its own options.
template <typename Options>
struct ParamGroup {
  std::vector<Tensor> params{};  // the parameters, updated in place
  Options options{};             // this group's hyperparameters
};

// The typed half of an optimizer: groups of Options. `Derived` implements step() over groups().
// Options provide kName (the optimizer's name), validate() (throws on a bad value), values() and from_values()
// (state_dict).
template <typename Options>
class OptimizerWith : public Optimizer {
 public:
  // An empty parameter list (or no group, or an empty group) is an error, as in PyTorch: it is almost always a
  // model whose parameters were not registered, or a filter that matched nothing.
  OptimizerWith(std::vector<Tensor> params, Options defaults = {}) : defaults_(defaults) {
    defaults_.validate();
    add_param_group({std::move(params), defaults});
  }
  // Several groups, each with its own options; `defaults` are only kept (defaults()), not merged into the groups.
  OptimizerWith(std::vector<ParamGroup<Options>> groups, Options defaults = {}) : defaults_(defaults) {
    defaults_.validate();
    if (groups.empty()) check_nonempty(0, 0, Options::kName);
    for (auto& g : groups) add_param_group(std::move(g));
  }

  // Parameters already in another group are an error (as PyTorch), as are an empty group, non-leaf and
  // non-floating tensors and invalid options; the optimizer is unchanged then.
  void add_param_group(ParamGroup<Options> group) {
    check_nonempty(groups_.size() + 1, group.params.size(), Options::kName);
    check_new_params(group.params, Options::kName);
    group.options.validate();
    groups_.push_back(std::move(group));
  }

  // The number of groups.
  size_t num_param_groups() const override { return groups_.size(); }
  // A group's parameters; throws std::out_of_range for a bad group.
  const std::vector<Tensor>& params(size_t group) const override { return groups_.at(group).params; }
  // A group's lr; throws std::out_of_range for a bad group.
  double lr(size_t group) const override { return groups_.at(group).options.lr; }
  // Validated as the constructor validates (a NaN, infinite or negative lr is refused, the group unchanged).
  void set_lr(size_t group, double lr) override {
    check_group(group, groups_.size(), "set_lr", Options::kName);
    Options options = groups_[group].options;
    options.lr = lr;
    options.validate();
    groups_[group].options = options;
  }
  // Replaces a group's options (e.g. momentum or weight decay mid-run), validated as the constructor does.
  void set_options(size_t group, const Options& options) {
    check_group(group, groups_.size(), "set_options", Options::kName);
    options.validate();
    groups_[group].options = options;
  }
  // Options::kName: "SGD", "Adam", ...
  std::string name() const override { return Options::kName; }
  // The groups, editable (HookedOptimizer validates their options at each step).
  std::vector<ParamGroup<Options>>& groups() { return groups_; }
  // The groups.
  const std::vector<ParamGroup<Options>>& groups() const { return groups_; }
  // The options given to the constructor.
  const Options& defaults() const { return defaults_; }

 protected:
  // A group's options as Options::values() names them.
  std::map<std::string, double> group_values(size_t group) const override { return groups_.at(group).options.values(); }
  void set_group_values(size_t group, const std::map<std::string, double>& values) override {  // validated first
    Options options = Options::from_values(values);
    options.validate();
    groups_.at(group).options = options;
  }

  Options defaults_;                         // the constructor's options
  std::vector<ParamGroup<Options>> groups_;  // the parameter groups, in order
};

// An OptimizerWith whose step is step_by_hooks: the derived optimizer implements update_bucket (CUDA) and
// update_param (CPU) — SGD, Adam, AdamW, LAMB. It takes amp::GradScaler's scale and inf flag on the device.
template <typename Options>
class HookedOptimizer : public OptimizerWith<Options> {
 public:
  using OptimizerWith<Options>::OptimizerWith;
  // Options edited through groups() are validated here too (a few comparisons per group).
  void step() override {
    for (const auto& g : this->groups_) g.options.validate();
    this->step_by_hooks(Tensor(), Tensor());
  }
  void step_with(const Tensor& grad_scale, const Tensor& found_inf) override {  // step_by_hooks with both
    for (const auto& g : this->groups_) g.options.validate();
    this->step_by_hooks(grad_scale, found_inf);
  }
  // Always true: step_by_hooks takes the scale and the flag.
  bool supports_step_with() const override { return true; }
};

}  // namespace kiln::optim
