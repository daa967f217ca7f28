// kiln/optim/sparse_adam.cpp — SparseAdam: lazy Adam on the rows of a coalesced sparse gradient, through kiln ops.
#include "kiln/optim/sparse_adam.h"

#include <cmath>

#include "kiln/autograd/sparse_grad.h"
#include "kiln/optim/sparse_rows.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::optim {

void SparseAdamOptions::validate() const {
  KILN_CHECK(std::isfinite(lr) && lr >= 0, kName, ": invalid learning rate ", lr, " (lr must be >= 0)");
  KILN_CHECK(std::isfinite(eps) && eps > 0, kName, ": invalid eps ", eps, " (must be > 0)");
  for (int i = 0; i < 2; ++i) {
    KILN_CHECK(betas[i] >= 0 && betas[i] < 1, kName, ": invalid beta parameter at index ", i, ": ", betas[i],
               " (betas must be in [0, 1))");
  }
}

std::map<std::string, double> SparseAdamOptions::values() const {
  return {{"lr", lr}, {"betas.0", betas[0]}, {"betas.1", betas[1]}, {"eps", eps}, {"maximize", maximize ? 1.0 : 0.0}};
}

SparseAdamOptions SparseAdamOptions::from_values(const std::map<std::string, double>& v) {
  return {.lr = v.at("lr"),
          .betas = {v.at("betas.0"), v.at("betas.1")},
          .eps = v.at("eps"),
          .maximize = v.at("maximize") != 0};
}

void SparseAdam::check_dense_param(size_t group, const Tensor& p) const {
  KILN_FAIL("SparseAdam.step: the parameter of shape ", p.shape(), " in parameter group ", group,
            " has a dense gradient; SparseAdam takes only sparse gradients (nn::Embedding with {.sparse = true}), "
            "as torch.optim.SparseAdam: use optim::Adam (or AdamW) for dense parameters, in a second optimizer");
}

void SparseAdam::check_sparse_param(size_t /*group*/, const Tensor& /*param*/) const {}

void SparseAdam::update_sparse_param(size_t group, const Tensor& p, const SparseRowGrad& g, double t) {
  const SparseAdamOptions& o = groups_[group].options;
  const auto [beta1, beta2] = o.betas;
  const DType math = state_dtype(p);
  Tensor param = p;
  Tensor& m = state_tensor(p, "exp_avg");                               // (V, D...)
  Tensor& v = state_tensor(p, "exp_avg_sq");                            // (V, D...)
  const Tensor& rows = g.indices;                                       // (K) sorted unique
  const Tensor grad = o.maximize ? internal::neg(g.values) : g.values;  // (K, D...)
  // old <- b * old + (1 - b) * new, written as old + (1 - b) * (new - old) (PyTorch's order of operations).
  const Tensor m_rows = detail::gather_rows(m, rows);
  const Tensor m_new = internal::add(m_rows, internal::mul(internal::sub(grad, m_rows), 1 - beta1));
  detail::write_rows_(m, rows, m_new);
  const Tensor v_rows = detail::gather_rows(v, rows);
  const Tensor v_new =
      internal::add(v_rows, internal::mul(internal::sub(internal::mul(grad, grad), v_rows), 1 - beta2));
  detail::write_rows_(v, rows, v_new);
  const double step_size = o.lr * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t));
  const Tensor denom = internal::add(internal::sqrt(v_new), o.eps);
  Tensor w = detail::gather_rows(p, rows, math);
  internal::add_(w, internal::div(m_new, denom), -step_size);
  detail::write_rows_(param, rows, w);
}

bool SparseAdam::sparse_fused(size_t /*group*/, const Tensor& p) const {
  return detail::sparse_fusable(p, *autograd::sparse_grad(p));
}

void SparseAdam::update_sparse_fused(size_t group, const Tensor& p, const SparseRowGrad& g, const Tensor& grad_scale,
                                     const Tensor& found_inf) {
  const SparseAdamOptions& o = groups_[group].options;
  detail::fused_sparse_step(p, g, {state_tensor(p, "exp_avg"), state_tensor(p, "exp_avg_sq")}, step_tensor(p),
                            {.rule = detail::SparseRule::Adam,
                             .lr = o.lr,
                             .beta1 = o.betas[0],
                             .beta2 = o.betas[1],
                             .eps = o.eps,
                             .maximize = o.maximize},
                            grad_scale, found_inf);
}

}  // namespace kiln::optim
