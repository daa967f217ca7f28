// kiln/optim/sparse_adam.h — SparseAdam: the lazy Adam of torch.optim.SparseAdam, for embedding tables with
// row-sparse gradients (nn::Embedding with {.sparse = true}; kiln/autograd/sparse_grad.h).
//
//   auto emb = std::make_shared<nn::Embedding>(1'000'000, 64, nn::EmbeddingOptions{.sparse = true});
//   optim::SparseAdam sparse_opt(emb->parameters(), {.lr = 1e-3});
//   optim::AdamW dense_opt(rest_of_the_model->parameters(), {.lr = 1e-3});
//   loss.backward();  sparse_opt.step();  dense_opt.step();
//
// Per parameter, at its step t = 1, 2, ... (one count per parameter, advanced by each step that finds a gradient),
// with the gradient coalesced (rows sorted, repeated rows summed; negated when maximize), on its K rows only:
//   m[rows] += (1 - beta1) * (g - m[rows]);   v[rows] += (1 - beta2) * (g^2 - v[rows])
//   p[rows] -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m[rows] / (sqrt(v[rows]) + eps)
// (eps is added to sqrt(v), not to sqrt(v / (1 - beta2^t)) as in Adam: PyTorch's formula.) The other rows of p, m
// and v keep their bits, so a step costs O(K). State: "step", "exp_avg", "exp_avg_sq" (V, D...), as Adam's.
// A dense gradient is refused (as PyTorch): use optim::Adam for such parameters. The update runs through kiln ops
// on any device (one parameter at a time).
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// SparseAdam's hyperparameters, with PyTorch's names and defaults.
struct SparseAdamOptions {
  static constexpr const char* kName = "SparseAdam";  // the optimizer's name
  double lr = 1e-3;                                   // learning rate, >= 0
  std::array<double, 2> betas = {0.9, 0.999};         // each in [0, 1)
  double eps = 1e-8;                                  // added to sqrt(v), > 0 (as PyTorch)
  bool maximize = false;                              // ascend instead of descend

  void validate() const;                         // throws kiln::Error naming the bad option
  std::map<std::string, double> values() const;  // by name, flags as 0 or 1 (state_dict)
  static SparseAdamOptions from_values(const std::map<std::string, double>& values);  // the inverse of values()
};

// Lazy Adam over the rows a sparse gradient holds, as torch.optim.SparseAdam.
class SparseAdam : public HookedOptimizer<SparseAdamOptions> {
 public:
  using HookedOptimizer::HookedOptimizer;  // (params, options = {}) or (groups, defaults = {})

 protected:
  void check_dense_param(size_t group, const Tensor& param) const override;   // refuses every dense gradient
  void check_sparse_param(size_t group, const Tensor& param) const override;  // accepts every sparse gradient
  void update_sparse_param(size_t group, const Tensor& param, const SparseRowGrad& grad, double t) override;
  bool sparse_fused(size_t group, const Tensor& param) const override;  // CUDA parameters
  void update_sparse_fused(size_t group, const Tensor& param, const SparseRowGrad& grad, const Tensor& grad_scale,
                           const Tensor& found_inf) override;  // cuda/sparse.cu's kernel
};

}  // namespace kiln::optim
