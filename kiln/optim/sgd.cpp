// kiln/optim/sgd.cpp — SGD: the fused CUDA kernel for CUDA parameters, kiln ops for the others.
#include "kiln/optim/sgd.h"

#include <cmath>

#include "kiln/autograd/sparse_grad.h"
#include "kiln/optim/sparse_rows.h"
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
  for (const Tensor& p : bucket.originals) state(p).erase("momentum_mask");  // a dense step touches every row
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
    state(p).erase("momentum_mask");  // a dense step touches every row: the buffer is dense from now on
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

void SGD::check_sparse_param(size_t group, const Tensor& p) const {
  refuse_sparse_weight_decay(group, groups_[group].options.weight_decay, p);
}

void SGD::update_sparse_param(size_t group, const Tensor& p, const SparseRowGrad& g, double t) {
  const SGDOptions& o = groups_[group].options;
  Tensor param = p;
  const DType math = state_dtype(p);
  Tensor rows = g.indices;                                     // (K) sorted unique
  Tensor d = o.maximize ? internal::neg(g.values) : g.values;  // (K, D...), never written in place
  if (o.momentum != 0) {
    auto& s = state(p);
    const bool fresh = t == 1 || !s.count("momentum_buffer");
    if (!fresh && !s.count("momentum_mask")) {
      // The buffer is dense (earlier steps had dense gradients): every row is in it, the update is the dense one.
      Tensor w = p.dtype() == math ? param : internal::cast(p, math);
      update_param(group, p, SparseRowGrad{rows, g.values, g.dense_shape, true}.to_dense(), w, t);
      if (!w.is_same(p)) internal::copy_(param, w);
      return;
    }
    const bool existed = s.count("momentum_buffer") != 0;
    Tensor& buf = state_tensor(p, "momentum_buffer");  // (V, D...), zeros when new
    Tensor& mask = momentum_mask(p, p.device());       // (V) Bool: the rows the momentum covers
    const Tensor listed = internal::ones({rows.numel()}, {.dtype = DType::Bool, .device = p.device()});
    if (fresh) {
      // buf = g (PyTorch clones the gradient): its rows are the union so far.
      if (existed) internal::fill_(buf, 0);  // momentum switched on again after a reset of the step count
      internal::fill_(mask, false);
      detail::write_rows_(buf, rows, d);
      detail::write_rows_(mask, rows, listed);
    } else {
      // U = rows ever touched ∪ this step's (sorted: the mask's nonzero rows); g on U (zero where g has no row).
      detail::write_rows_(mask, rows, listed);
      const std::vector<int64_t> u = detail::host_rows(internal::reshape(internal::nonzero(mask), {-1}));
      const std::vector<int64_t> at = detail::positions_in(u, detail::host_rows(rows));  // u holds every one
      const int64_t n = static_cast<int64_t>(u.size());
      const Tensor union_rows = internal::to(internal::from_vector(u, {n}), p.device());
      Shape union_shape = p.shape();
      union_shape[0] = n;
      const Tensor positions = internal::to(internal::from_vector(at, {static_cast<int64_t>(at.size())}), p.device());
      const Tensor g_u =
          internal::index_add(internal::zeros(union_shape, {.dtype = math, .device = p.device()}), 0, positions, d);
      Tensor buf_u = detail::gather_rows(buf, union_rows);  // (U, D...)
      internal::mul_(buf_u, o.momentum);
      internal::add_(buf_u, g_u, 1 - o.dampening);
      detail::write_rows_(buf, union_rows, buf_u);
      rows = union_rows;
      d = g_u;
    }
    const Tensor buf_rows = detail::gather_rows(buf, rows);
    d = o.nesterov ? internal::add(d, buf_rows, o.momentum) : buf_rows;
  }
  Tensor w = detail::gather_rows(p, rows, math);  // (K, D...) in the math dtype
  internal::add_(w, d, -o.lr);
  detail::write_rows_(param, rows, w);
}

Tensor& SGD::momentum_mask(const Tensor& p, Device device) {
  auto& s = state(p);
  if (auto it = s.find("momentum_mask"); it != s.end()) {
    if (it->second.device() != device) it->second = internal::to(it->second, device);
    return it->second;
  }
  Tensor mask = internal::zeros({p.size(0)}, {.dtype = DType::Bool, .device = device});
  if (auto it = s.find("momentum_rows"); it != s.end()) {  // a loaded state's row list (load_state_dict)
    const Tensor rows = internal::to(it->second, device);
    detail::write_rows_(mask, rows, internal::ones({rows.numel()}, {.dtype = DType::Bool, .device = device}));
    s.erase(it);
  }
  return s["momentum_mask"] = mask;
}

void SGD::load_state_dict(const OptimizerState& saved) {
  HookedOptimizer::load_state_dict(saved);
  // The saved row lists become masks at once: the live state has one form (which a hybrid table's rebalance carries
  // as per-row state).
  for (size_t g = 0; g < num_param_groups(); ++g) {
    for (const Tensor& p : params(g)) {
      const auto* s = find_state(p);
      if (s != nullptr && s->count("momentum_rows") != 0) (void)momentum_mask(p, p.device());
    }
  }
}

OptimizerState SGD::state_dict() const {
  OptimizerState out = HookedOptimizer::state_dict();
  // The mask a step keeps goes out as the sorted rows it covers ("momentum_rows"), on the CPU.
  std::vector<std::string> masks;
  for (const auto& [key, t] : out.tensors)
    if (key.ends_with(".momentum_mask")) masks.push_back(key);
  for (const std::string& key : masks) {
    const Tensor mask = internal::to(out.tensors.at(key), Device::cpu());
    out.tensors.erase(key);
    out.tensors[key.substr(0, key.size() - std::string("mask").size()) + "rows"] =
        internal::contiguous(internal::reshape(internal::nonzero(mask), {-1}));
  }
  return out;
}

bool SGD::sparse_fused(size_t /*group*/, const Tensor& p) const {
  return detail::sparse_fusable(p, *autograd::sparse_grad(p));
}

void SGD::update_sparse_fused(size_t group, const Tensor& p, const SparseRowGrad& g, const Tensor& grad_scale,
                              const Tensor& found_inf) {
  const SGDOptions& o = groups_[group].options;
  if (o.momentum == 0) {
    detail::fused_sparse_step(p, g, {}, step_tensor(p),
                              {.rule = detail::SparseRule::Sgd, .lr = o.lr, .maximize = o.maximize}, grad_scale,
                              found_inf);
    return;
  }
  auto& s = state(p);
  const bool fresh = !s.count("momentum_buffer");  // (a step count of 0 makes it a first step too, on the device)
  // A buffer without a mask is dense (earlier steps had dense gradients): it covers every row.
  const bool dense = !fresh && !s.count("momentum_mask");
  Tensor& buf = state_tensor(p, "momentum_buffer");
  Tensor& mask = momentum_mask(p, g.values.device());  // on the GPU, also for a page-locked parameter
  if (dense) internal::fill_(mask, true);
  detail::fused_sparse_step(p, g, {buf, mask}, step_tensor(p),
                            {.rule = detail::SparseRule::SgdMomentum,
                             .lr = o.lr,
                             .maximize = o.maximize,
                             .momentum = o.momentum,
                             .dampening = o.dampening,
                             .nesterov = o.nesterov,
                             .fresh = fresh},
                            grad_scale, found_inf);
}

Tensor SGD::load_state_tensor(const Tensor& p, size_t index, const std::string& name, const Tensor& saved,
                              const std::string& key) const {
  if (name == "momentum_mask") {
    KILN_CHECK(p.dim() >= 1 && saved.shape() == Shape{p.size(0)} && saved.dtype() == DType::Bool,
               "SGD.load_state_dict: '", key, "' has shape ", saved.shape(), " and dtype ", saved.dtype(),
               "; a momentum mask is (", p.dim() >= 1 ? p.size(0) : 0, ") Bool, one flag per row of parameter ", index);
    return internal::to(saved, p.device());
  }
  if (name != "momentum_rows") return Optimizer::load_state_tensor(p, index, name, saved, key);
  KILN_CHECK(saved.dim() == 1 && saved.dtype() == DType::Int64, "SGD.load_state_dict: '", key, "' has shape ",
             saved.shape(), " and dtype ", saved.dtype(), "; a row list is 1-D Int64");
  const std::vector<int64_t> rows = detail::host_rows(saved);
  for (size_t i = 0; i < rows.size(); ++i) {
    KILN_CHECK(rows[i] >= 0 && rows[i] < p.size(0) && (i == 0 || rows[i - 1] < rows[i]), "SGD.load_state_dict: '", key,
               "' holds row ", rows[i], " at position ", i, "; expected sorted, unique rows in [0, ", p.size(0),
               ") (parameter ", index, " has shape ", p.shape(), ")");
  }
  return internal::to(internal::from_vector(rows, {static_cast<int64_t>(rows.size())}), p.device());
}

}  // namespace kiln::optim
