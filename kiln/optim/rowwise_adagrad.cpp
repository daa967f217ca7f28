// kiln/optim/rowwise_adagrad.cpp — row-wise Adagrad through kiln ops: dense gradients update every row, sparse ones
// their coalesced rows only.
#include "kiln/optim/rowwise_adagrad.h"

#include <cmath>
#include <vector>

#include "kiln/autograd/sparse_grad.h"
#include "kiln/optim/sparse_rows.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::optim {

namespace {

// The mean of g^2 over each row: (K, D...) -> (K); a 1-D g's rows are its elements.
Tensor row_mean_square(const Tensor& g) {
  const Tensor sq = internal::mul(g, g);
  if (g.dim() == 1) return sq;
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < g.dim(); ++d) dims.push_back(d);
  return internal::mean(sq, dims);
}

// rows -= lr * g / (sqrt(sums) + eps), sums (K) the rows' accumulators, in place on `rows` (K, D...).
void apply_rows(Tensor& rows, const Tensor& g, const Tensor& sums, double lr, double eps) {
  const Tensor denom = detail::per_row(internal::add(internal::sqrt(sums), eps), g.dim());  // (K, 1, ...)
  internal::add_(rows, internal::div(g, denom), -lr);
}

}  // namespace

void RowWiseAdagradOptions::validate() const {
  KILN_CHECK(std::isfinite(lr) && lr >= 0, kName, ": invalid learning rate ", lr, " (lr must be >= 0)");
  KILN_CHECK(std::isfinite(eps) && eps >= 0, kName, ": invalid eps ", eps, " (must be >= 0)");
  KILN_CHECK(std::isfinite(weight_decay) && weight_decay >= 0, kName, ": invalid weight_decay ", weight_decay,
             " (must be >= 0)");
}

std::map<std::string, double> RowWiseAdagradOptions::values() const {
  return {{"lr", lr}, {"eps", eps}, {"weight_decay", weight_decay}, {"maximize", maximize ? 1.0 : 0.0}};
}

RowWiseAdagradOptions RowWiseAdagradOptions::from_values(const std::map<std::string, double>& v) {
  return {
      .lr = v.at("lr"), .eps = v.at("eps"), .weight_decay = v.at("weight_decay"), .maximize = v.at("maximize") != 0};
}

void RowWiseAdagrad::check_dense_param(size_t group, const Tensor& p) const {
  KILN_CHECK(p.dim() >= 1, "RowWiseAdagrad.step: the parameter in parameter group ", group,
             " is 0-d (a scalar); row-wise Adagrad keeps one accumulator per row of a parameter with at least one "
             "dim: use optim::Adam or SGD for scalars");
}

Tensor& RowWiseAdagrad::row_sums(const Tensor& p) {
  auto& s = state(p);
  auto it = s.find("sum");
  if (it != s.end()) return detail::pin_like(p, it->second);
  return s["sum"] = internal::zeros({p.size(0)}, detail::state_options(p, state_dtype(p)));
}

void RowWiseAdagrad::update_param(size_t group, const Tensor& p, Tensor g, Tensor& w, double /*t*/) {
  const RowWiseAdagradOptions& o = groups_[group].options;
  if (o.maximize) g = internal::neg(g);
  if (o.weight_decay != 0) g = internal::add(g, w, o.weight_decay);
  Tensor& sums = row_sums(p);  // (V)
  internal::add_(sums, row_mean_square(g));
  apply_rows(w, g, sums, o.lr, o.eps);
}

void RowWiseAdagrad::update_bucket(size_t group, CudaBucket& bucket, const Tensor& grad_scale,
                                   const Tensor& found_inf) {
  // No fused kernel yet: the CPU update through kiln ops, on the device. The flag is read on the host (a sync).
  if (found_inf.defined() && internal::cast(found_inf, DType::Float64).to(Device::cpu()).item<double>() != 0.0) {
    bucket.shadows.clear();  // nothing written
    return;
  }
  for (size_t i = 0; i < bucket.params.size(); ++i) {
    const Tensor& p = bucket.originals[i];
    const DType math = state_dtype(p);
    Tensor g = bucket.grads[i].dtype() == math ? bucket.grads[i] : internal::cast(bucket.grads[i], math);
    if (grad_scale.defined()) g = internal::div(g, internal::reshape(internal::to(grad_scale, p.device(), math), {}));
    Tensor& flat = bucket.params[i];
    Tensor w = flat.dtype() == math ? flat : internal::cast(flat, math);
    Tensor& step = step_tensor(p);
    const double t = static_cast<double>(step.item<float>()) + 1;
    update_param(group, p, g, w, t);
    if (!w.is_same(flat)) internal::copy_(flat, w);
    internal::fill_(step, t);
  }
  bucket.shadows.clear();  // the 16-bit shadows were not written: finish_bucket must not mark them so
}

void RowWiseAdagrad::check_sparse_param(size_t group, const Tensor& p) const {
  refuse_sparse_weight_decay(group, groups_[group].options.weight_decay, p);
}

void RowWiseAdagrad::update_sparse_param(size_t group, const Tensor& p, const SparseRowGrad& g, double /*t*/) {
  const RowWiseAdagradOptions& o = groups_[group].options;
  Tensor param = p;
  const Tensor& rows = g.indices;                                                                  // (K) sorted unique
  const Tensor grad = o.maximize ? internal::neg(g.values) : g.values;                             // (K, D...)
  Tensor& sums = row_sums(p);                                                                      // (V)
  const Tensor sums_rows = internal::add(detail::gather_rows(sums, rows), row_mean_square(grad));  // (K)
  detail::write_rows_(sums, rows, sums_rows);
  Tensor w = detail::gather_rows(p, rows, state_dtype(p));
  apply_rows(w, grad, sums_rows, o.lr, o.eps);
  detail::write_rows_(param, rows, w);
}

Tensor RowWiseAdagrad::load_state_tensor(const Tensor& p, size_t index, const std::string& name, const Tensor& saved,
                                         const std::string& key) const {
  if (name != "sum") return Optimizer::load_state_tensor(p, index, name, saved, key);
  KILN_CHECK(p.dim() >= 1 && saved.shape() == Shape{p.size(0)}, "RowWiseAdagrad.load_state_dict: '", key,
             "' has shape ", saved.shape(), " but parameter ", index, " of shape ", p.shape(),
             " needs one number per row (", p.dim() >= 1 ? p.size(0) : 0, ")");
  KILN_CHECK(saved.is_floating_point(), "RowWiseAdagrad.load_state_dict: '", key, "' has dtype ", saved.dtype(),
             "; optimizer states are floating");
  Tensor out = internal::empty(saved.shape(), detail::state_options(p, state_dtype(p)));
  internal::copy_(out, saved);
  return out;
}

bool RowWiseAdagrad::sparse_fused(size_t /*group*/, const Tensor& p) const {
  return detail::sparse_fusable(p, *autograd::sparse_grad(p));
}

void RowWiseAdagrad::update_sparse_fused(size_t group, const Tensor& p, const SparseRowGrad& g,
                                         const Tensor& grad_scale, const Tensor& found_inf) {
  const RowWiseAdagradOptions& o = groups_[group].options;
  detail::fused_sparse_step(
      p, g, {row_sums(p)}, step_tensor(p),
      {.rule = detail::SparseRule::RowWiseAdagrad, .lr = o.lr, .eps = o.eps, .maximize = o.maximize}, grad_scale,
      found_inf);
}

}  // namespace kiln::optim
