// kiln/optim/optimizer.cpp — the optimizer base: zero_grad, state, state_dict/load_state_dict and the
// helpers the optimizers' step() share (which parameters go to the fused CUDA kernels, AMP hooks on the CPU).
#include "kiln/optim/optimizer.h"

#include <set>
#include <string_view>
#include <vector>

#include "kiln/autograd/autocast.h"  // autocast::shadow
#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/sparse_grad.h"
#include "kiln/optim/grad_groups.h"  // flat_dense, flat_layout, same_order
#include "kiln/optim/sparse_rows.h"  // state_options
#include "kiln/tensor/cuda.h"        // cuda::Graph
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::optim {

namespace {

// "state.<i>.<name>" -> (i, name); false when the key has another form.
bool parse_state_key(const std::string& key, size_t& index, std::string& name) {
  constexpr std::string_view kPrefix = "state.";
  if (key.rfind(kPrefix, 0) != 0) return false;
  const size_t dot = key.find('.', kPrefix.size());
  if (dot == std::string::npos || dot == kPrefix.size() || dot + 1 == key.size()) return false;
  index = 0;
  for (size_t i = kPrefix.size(); i < dot; ++i) {
    if (key[i] < '0' || key[i] > '9') return false;
    index = index * 10 + static_cast<size_t>(key[i] - '0');
  }
  name = key.substr(dot + 1);
  return true;
}

std::string group_key(size_t g, const std::string& option) {
  return "param_groups." + std::to_string(g) + "." + option;
}

// A fresh copy of `t` with the given dtype on the given device (never sharing memory with t).
Tensor copy_to(const Tensor& t, const TensorOptions& options) {
  Tensor out = internal::empty(t.shape(), options);
  internal::copy_(out, t);
  return out;
}

// Whether found_inf says to skip the step (read on the host).
bool found_inf_set(const Tensor& found_inf) {
  if (!found_inf.defined()) return false;
  KILN_CHECK(found_inf.numel() == 1, "Optimizer.step_with: found_inf has shape ", found_inf.shape(),
             "; expected one element");
  return internal::cast(found_inf, DType::Float64).to(Device::cpu()).item<double>() != 0.0;
}

// A CPU parameter's gradient in `math_dtype`, divided by grad_scale when defined.
Tensor cpu_grad(const Tensor& param, const Tensor& grad_scale, DType math_dtype) {
  Tensor g = param.grad();
  if (g.dtype() != math_dtype) g = internal::cast(g, math_dtype);
  if (grad_scale.defined()) {
    KILN_CHECK(grad_scale.numel() == 1, "Optimizer.step_with: grad_scale has shape ", grad_scale.shape(),
               "; expected one element");
    g = internal::div(g, internal::cast(grad_scale, DType::Float64).to(Device::cpu()).item<double>());
  }
  return g;
}

}  // namespace

void Optimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : all_params()) {
    Tensor param = p;
    autograd::clear_sparse_grad(param);  // a sparse gradient is dropped either way: it has no rows to keep at zero
    if (!param.grad().defined()) continue;
    if (set_to_none) {
      param.mutable_grad() = Tensor();
    } else {
      internal::fill_(param.mutable_grad(), 0);
    }
  }
}

void Optimizer::step_with(const Tensor& /*grad_scale*/, const Tensor& /*found_inf*/) {
  KILN_CHECK(false, name(),
             ".step_with: this optimizer does not take a gradient scale and inf flag; unscale the gradients "
             "(GradScaler::unscale_) and call step() instead");
}

std::vector<Tensor> Optimizer::all_params() const {
  std::vector<Tensor> out;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const auto& ps = params(g);
    out.insert(out.end(), ps.begin(), ps.end());
  }
  return out;
}

std::map<std::string, Tensor>& Optimizer::state(const Tensor& param) { return state_[&param.impl()]; }

const std::map<std::string, Tensor>* Optimizer::find_state(const Tensor& param) const {
  auto it = state_.find(&param.impl());
  return it == state_.end() ? nullptr : &it->second;
}

void Optimizer::wait_for_mapped_updates() const {
  for (const int device : mapped_devices_) cuda::synchronize(device);
}

OptimizerState Optimizer::state_dict() const {
  wait_for_mapped_updates();  // host state written by a GPU through its mapping
  OptimizerState out;
  size_t index = 0;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const auto& ps = params(g);
    out.values[group_key(g, "size")] = static_cast<double>(ps.size());
    for (const auto& [option, value] : group_values(g)) out.values[group_key(g, option)] = value;
    for (const Tensor& p : ps) {
      if (const auto* s = find_state(p)) {
        for (const auto& [name, t] : *s) out.tensors["state." + std::to_string(index) + "." + name] = t;
      }
      ++index;
    }
  }
  return out;
}

void Optimizer::load_state_dict(const OptimizerState& sd) {
  const std::string op = name() + ".load_state_dict";
  wait_for_mapped_updates();  // the state it replaces may still be written by a GPU through its mapping
  // Groups: count and sizes.
  size_t saved_groups = 0;
  while (sd.values.count(group_key(saved_groups, "size"))) ++saved_groups;
  KILN_CHECK(saved_groups == num_param_groups(), op, ": the state has ", saved_groups,
             " parameter group(s), this optimizer has ", num_param_groups(),
             "; build the optimizer with the same groups as the one that was saved");
  std::vector<Tensor> ps;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const double saved = sd.values.at(group_key(g, "size"));
    KILN_CHECK(saved == static_cast<double>(params(g).size()), op, ": parameter group ", g, " has ", saved,
               " parameter(s) in the state and ", params(g).size(), " in this optimizer");
    ps.insert(ps.end(), params(g).begin(), params(g).end());
  }
  // Options: every option this optimizer has must be there.
  std::vector<std::map<std::string, double>> new_values(num_param_groups());
  for (size_t g = 0; g < num_param_groups(); ++g) {
    for (const auto& [option, current] : group_values(g)) {
      auto it = sd.values.find(group_key(g, option));
      KILN_CHECK(it != sd.values.end(), op, ": the state has no value '", group_key(g, option),
                 "' (was it saved by another kind of optimizer than ", name(), "?)");
      new_values[g][option] = it->second;
    }
  }
  // Tensors: known parameter indices, shapes; copied to the parameter's device and state dtype.
  std::vector<std::map<std::string, Tensor>> new_state(ps.size());
  for (const auto& [key, t] : sd.tensors) {
    size_t index = 0;
    std::string sname;
    KILN_CHECK(parse_state_key(key, index, sname), op, ": unexpected tensor key '", key,
               "' (expected 'state.<param index>.<name>')");
    KILN_CHECK(index < ps.size(), op, ": '", key, "' is for parameter ", index, " but this optimizer has ", ps.size(),
               " parameters");
    KILN_CHECK(t.defined(), op, ": '", key, "' is an undefined tensor");
    new_state[index][sname] = load_state_tensor(ps[index], index, sname, t, key);
  }
  // Apply: the options (validated, restored if one group's are refused), then the state.
  std::vector<std::map<std::string, double>> old_values(num_param_groups());
  for (size_t g = 0; g < num_param_groups(); ++g) old_values[g] = group_values(g);
  try {
    for (size_t g = 0; g < num_param_groups(); ++g) set_group_values(g, new_values[g]);
  } catch (...) {
    for (size_t g = 0; g < num_param_groups(); ++g) set_group_values(g, old_values[g]);
    throw;
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    if (new_state[i].empty()) {
      state_.erase(&ps[i].impl());
    } else {
      state_[&ps[i].impl()] = std::move(new_state[i]);
    }
  }
}

Tensor Optimizer::load_state_tensor(const Tensor& p, size_t index, const std::string& name, const Tensor& t,
                                    const std::string& key) const {
  const std::string op = this->name() + ".load_state_dict";
  if (name == "step") {
    KILN_CHECK(t.numel() == 1, op, ": '", key, "' has shape ", t.shape(), "; a step count has one element");
    return copy_to(internal::reshape(t, {1}), detail::state_options(p, DType::Float32));
  }
  KILN_CHECK(t.shape() == p.shape(), op, ": '", key, "' has shape ", t.shape(), " but parameter ", index, " has shape ",
             p.shape());
  KILN_CHECK(t.is_floating_point(), op, ": '", key, "' has dtype ", t.dtype(), "; optimizer states are floating");
  return copy_to(t, detail::state_options(p, state_dtype(p)));
}

void Optimizer::check_nonempty(size_t group_number, size_t size, const std::string& optimizer_name) {
  KILN_CHECK(group_number > 0, optimizer_name,
             ": got an empty list of parameter groups; give the model's parameters (model->parameters())");
  KILN_CHECK(size > 0, optimizer_name, ": got an empty parameter list",
             group_number > 1 ? " for parameter group " + std::to_string(group_number - 1) : std::string(),
             "; was the model built (its layers registered) before the optimizer, or did a filter on the parameter "
             "names match nothing?");
}

void Optimizer::check_group(size_t group, size_t count, const char* call, const std::string& optimizer_name) {
  KILN_CHECK(group < count, optimizer_name, ".", call, ": parameter group ", group,
             " does not exist (the optimizer has ", count, ")");
}

void Optimizer::check_new_params(const std::vector<Tensor>& params, const std::string& optimizer_name) const {
  const std::string op = optimizer_name + ".add_param_group";
  std::set<const void*> existing;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    for (const Tensor& p : this->params(g)) existing.insert(&p.impl());
  }
  std::set<const void*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    KILN_CHECK(p.defined(), op, ": parameter ", i, " is an undefined tensor");
    KILN_CHECK(p.is_floating_point(), op, ": parameter ", i, " has dtype ", p.dtype(), " and shape ", p.shape(),
               "; only floating-point tensors can be optimized");
    KILN_CHECK(p.is_leaf(), op, ": parameter ", i, " (shape ", p.shape(),
               ") is not a leaf (it is the result of a recorded op); optimize the leaf tensor, or a detach()ed copy");
    KILN_CHECK(!existing.count(&p.impl()), op, ": parameter ", i, " (shape ", p.shape(),
               ") is already in a parameter group of this optimizer; a parameter can be in one group only");
    KILN_CHECK(seen.insert(&p.impl()).second, op, ": parameter ", i, " (shape ", p.shape(),
               ") appears twice in the group");
  }
}

Optimizer::StepPlan Optimizer::plan_step(const std::vector<Tensor>& params) const {
  StepPlan plan;
  for (const Tensor& p : params) {
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    KILN_CHECK(g.device() == p.device() && g.shape() == p.shape(), name(), ".step: a parameter of shape ", p.shape(),
               " on ", p.device(), " has a gradient of shape ", g.shape(), " on ", g.device());
#if KILN_WITH_CUDA
    if (p.is_cuda()) {
      CudaBucket* bucket = nullptr;
      for (auto& b : plan.cuda) {
        if (b.originals[0].device() == p.device() && b.originals[0].dtype() == p.dtype()) bucket = &b;
      }
      if (!bucket) bucket = &plan.cuda.emplace_back();
      // A dense parameter is updated in place, its gradient (and state: state_tensor) brought to its memory
      // order, so a channels-last conv weight costs no copies; any other goes through a contiguous copy.
      bucket->originals.push_back(p);
      bucket->params.push_back(detail::flat_dense(p) ? p : internal::contiguous(p));
      const Tensor& flat = bucket->params.back();
      Tensor gc = g.dtype() == p.dtype() ? g : internal::cast(g, p.dtype());
      bucket->grads.push_back(detail::same_order(gc, flat) ? gc : internal::contiguous(gc, detail::flat_layout(p)));
      // The cast autocast regions take of p, written with it (one dtype per bucket: another one is cast anew).
      Tensor shadow = flat.is_same(p) ? autocast::shadow::buffer(p) : Tensor();
      if (shadow.defined()) {
        if (!bucket->shadow_dtype) {
          bucket->shadow_dtype = shadow.dtype();
        } else if (*bucket->shadow_dtype != shadow.dtype()) {
          shadow = Tensor();
        }
      }
      bucket->shadows.push_back(std::move(shadow));
      continue;
    }
#endif
    plan.cpu.push_back(p);
  }
  return plan;
}

void Optimizer::finish_bucket(CudaBucket& bucket) {
  for (size_t i = 0; i < bucket.params.size(); ++i) {
    if (!bucket.params[i].is_same(bucket.originals[i])) {
      internal::copy_(bucket.originals[i], bucket.params[i]);  // counts the write in the version
    } else {
      bucket.originals[i].impl().storage()->bump_version();  // updated in place by the fused kernel
    }
  }
  for (size_t i = 0; i < bucket.shadows.size(); ++i) {
    if (bucket.shadows[i].defined()) autocast::shadow::mark_written(bucket.originals[i]);
  }
}

void Optimizer::step_by_hooks(const Tensor& grad_scale, const Tensor& found_inf) {
  NoGradGuard no_grad;
  // Every gradient is checked first, so that a refused one changes nothing.
  // Per group: the parameters holding a sparse gradient, by the path that updates them (unfused, fused).
  std::vector<std::vector<Tensor>> sparse_params(num_param_groups()), sparse_fused_params(num_param_groups());
  for (size_t group = 0; group < num_param_groups(); ++group) {
    for (const Tensor& p : params(group)) {
      if (p.grad().defined()) check_dense_param(group, p);
      if (!autograd::has_sparse_grad(p)) continue;
      check_sparse_param(group, p);
      (sparse_fused(group, p) ? sparse_fused_params : sparse_params)[group].push_back(p);
    }
  }
  bool skip_cpu = false, skip_read = false;  // found_inf is read on the host once, if a CPU parameter needs it
  for (size_t group = 0; group < num_param_groups(); ++group) {
    StepPlan plan = plan_step(params(group));
    for (auto& bucket : plan.cuda) {
      update_bucket(group, bucket, grad_scale, found_inf);
      finish_bucket(bucket);
    }
    for (const Tensor& p : sparse_fused_params[group]) {
      const SparseRowGrad& g = *autograd::sparse_grad(p);
      if (p.is_cpu()) mapped_devices_.insert(g.values.device().index());  // updated through the mapping
      update_sparse_fused(group, p, g, grad_scale, found_inf);
    }
    if (plan.cpu.empty() && sparse_params[group].empty()) continue;
    if (!skip_read) skip_cpu = found_inf_set(found_inf), skip_read = true;
    if (skip_cpu) continue;
    for (Tensor& p : plan.cpu) {
      const DType math = state_dtype(p);
      Tensor w = p.dtype() == math ? p : internal::cast(p, math);
      Tensor& step = step_tensor(p);
      const double t = static_cast<double>(step.item<float>()) + 1;
      update_param(group, p, cpu_grad(p, grad_scale, math), w, t);
      if (!w.is_same(p)) internal::copy_(p, w);
      internal::fill_(step, t);
    }
    if (!sparse_params[group].empty()) step_sparse(group, sparse_params[group], grad_scale);
  }
}

void Optimizer::step_sparse(size_t group, const std::vector<Tensor>& sparse_params, const Tensor& grad_scale) {
  for (const Tensor& p : sparse_params) {
    const SparseRowGrad* sparse = autograd::sparse_grad(p);
    SparseRowGrad g = sparse->coalesce();   // (K) sorted unique rows, (K, D...) summed values
    if (g.values.device() != p.device()) {  // device-held (sparse_grad.h), without a fused update: to the parameter
      g.indices = internal::to(g.indices, p.device());
      g.values = internal::to(g.values, p.device());
    }
    const DType math = state_dtype(p);
    if (g.values.dtype() != math) g.values = internal::cast(g.values, math);
    if (grad_scale.defined()) {
      KILN_CHECK(grad_scale.numel() == 1, "Optimizer.step_with: grad_scale has shape ", grad_scale.shape(),
                 "; expected one element");
      g.values = internal::div(g.values, internal::cast(grad_scale, DType::Float64).to(Device::cpu()).item<double>());
    }
    Tensor& step = step_tensor(p);
    const double t = static_cast<double>(step.item<float>()) + 1;
    update_sparse_param(group, p, g, t);
    internal::fill_(step, t);
  }
}

void Optimizer::check_sparse_param(size_t /*group*/, const Tensor& param) const {
  KILN_CHECK(false, name(), ".step: a parameter of shape ", param.shape(),
             " has a sparse gradient (an nn::Embedding with {.sparse = true}?), which ", name(),
             " does not take; use optim::SGD (without weight decay), optim::SparseAdam or optim::RowWiseAdagrad for "
             "it (in a second optimizer for the embedding tables), or make the embedding dense");
}

void Optimizer::refuse_sparse_weight_decay(size_t group, double weight_decay, const Tensor& param) const {
  KILN_CHECK(weight_decay == 0, name(), ".step: a parameter of shape ", param.shape(),
             " has a sparse gradient but its parameter group ", group, " has weight_decay ", weight_decay,
             "; weight decay would change every row, so it is refused with sparse gradients (as torch.optim does): "
             "put the embedding tables in a parameter group with weight_decay = 0");
}

void Optimizer::update_sparse_param(size_t /*group*/, const Tensor& /*param*/, const SparseRowGrad& /*grad*/,
                                    double /*t*/) {
  KILN_CHECK(false, name(), ": step_by_hooks needs update_sparse_param for sparse gradients");
}

void Optimizer::update_sparse_fused(size_t /*group*/, const Tensor& /*param*/, const SparseRowGrad& /*grad*/,
                                    const Tensor& /*grad_scale*/, const Tensor& /*found_inf*/) {
  KILN_CHECK(false, name(), ": step_by_hooks needs update_sparse_fused where sparse_fused is true");
}

void Optimizer::update_bucket(size_t /*group*/, CudaBucket& /*bucket*/, const Tensor& /*grad_scale*/,
                              const Tensor& /*found_inf*/) {
  KILN_CHECK(false, name(), ": step_by_hooks needs update_bucket for CUDA parameters");
}

void Optimizer::update_param(size_t /*group*/, const Tensor& /*param*/, Tensor /*grad*/, Tensor& /*w*/, double /*t*/) {
  KILN_CHECK(false, name(), ": step_by_hooks needs update_param for CPU parameters");
}

DType Optimizer::state_dtype(const Tensor& param) {
  const DType d = param.dtype();
  return d == DType::Float16 || d == DType::BFloat16 ? DType::Float32 : d;
}

// In the parameter's flat_layout, which the fused update needs (states loaded from a checkpoint, or made
// before the parameter changed layout, are brought to it here, once).
Tensor& Optimizer::state_tensor(const Tensor& param, const std::string& name) {
  auto& s = state(param);
  const MemoryFormat layout = detail::flat_layout(param);
  auto it = s.find(name);
  if (it != s.end()) {
    Tensor& t = it->second;
    if (!t.is_contiguous(layout)) t = internal::contiguous(t, layout);
    detail::pin_like(param, t);
    return t;
  }
  TensorOptions options = detail::state_options(param, state_dtype(param));
  options.memory_format = layout;
  return s[name] = internal::zeros(param.shape(), options);
}

Tensor& Optimizer::step_tensor(const Tensor& param) {
  auto& s = state(param);
  auto it = s.find("step");
  if (it != s.end()) return detail::pin_like(param, it->second);
  return s["step"] = internal::zeros({1}, detail::state_options(param, DType::Float32));
}

const double* Optimizer::graph_lr(size_t group, Device device) {
  if (!device.is_cuda() || !cuda::Graph::capturing()) return nullptr;
  // Written by the hook before each replay: memory that no kernel of the graph writes (Graph::replay_input).
  Tensor lr_tensor = cuda::Graph::replay_input({1}, {.dtype = DType::Float64, .device = device});
  std::map<std::string, double> captured = group_values(group);
  captured.erase("lr");
  std::weak_ptr<Optimizer*> alive = alive_;
  cuda::Graph::on_replay([alive, group, lr_tensor, captured]() mutable {
    const std::shared_ptr<Optimizer*> self = alive.lock();
    KILN_CHECK(self != nullptr, "cuda::Graph::replay: an optimizer whose step was captured in this graph no longer ",
               "exists; keep it alive as long as the graph, or capture the step again");
    Optimizer& opt = **self;
    std::map<std::string, double> now = opt.group_values(group);
    for (const auto& [key, value] : captured) {
      KILN_CHECK(now.at(key) == value, "cuda::Graph::replay: option '", key, "' of ", opt.name(), " group ", group,
                 " changed from ", value, " to ", now.at(key), " after the step was captured; only the learning rate ",
                 "follows changes in a CUDA graph: capture the step again after changing other options");
    }
    lr_tensor.fill_(opt.lr(group));
  });
  return lr_tensor.data_ptr<double>();
}

}  // namespace kiln::optim
