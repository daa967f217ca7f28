// kiln/optim/rowwise_adagrad.h — row-wise Adagrad, as FBGEMM's EXACT_ROWWISE_ADAGRAD (TorchRec's fused embedding
// optimizer): one accumulator per row of an embedding table instead of one per element (V numbers, not V x D).
//
//   auto emb = std::make_shared<nn::Embedding>(10'000'000, 128, nn::EmbeddingOptions{.sparse = true});
//   optim::RowWiseAdagrad opt(emb->parameters(), {.lr = 0.01});
//   loss.backward();  opt.step();   // updates only the rows the batch looked up
//
// Per parameter (V, D...) with gradient g (negated when maximize; plus weight_decay * p when dense), for each row
// r the gradient holds (a sparse gradient: its coalesced rows, repeated rows summed; a dense one: every row):
//   G[r] += mean over the row of g[r]^2
//   p[r] -= lr * g[r] / (sqrt(G[r]) + eps)
// State: "sum" (V) (float32 for 16-bit parameters, else the parameter's dtype) and "step". Rows a sparse gradient
// does not hold keep their bits in p and G: a step costs O(K) for K rows. Defaults lr = 0.01 and eps = 1e-10 are
// torch.optim.Adagrad's and TorchRec's RowWiseAdagrad's (FBGEMM's kernels default to eps = 1e-8). weight_decay
// (L2, added to the gradient) is refused with a sparse gradient, as it would touch every row. Parameters need at
// least one dim (a 1-D parameter's rows are single elements). The update runs through kiln ops on any device.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// RowWiseAdagrad's hyperparameters.
struct RowWiseAdagradOptions {
  static constexpr const char* kName = "RowWiseAdagrad";  // the optimizer's name
  double lr = 1e-2;                                       // learning rate, >= 0
  double eps = 1e-10;                                     // added to sqrt(G), >= 0
  double weight_decay = 0;  // L2 penalty added to a dense gradient, >= 0; refused (> 0) with sparse gradients
  bool maximize = false;    // ascend instead of descend

  void validate() const;                         // throws kiln::Error naming the bad option
  std::map<std::string, double> values() const;  // by name, flags as 0 or 1 (state_dict)
  static RowWiseAdagradOptions from_values(const std::map<std::string, double>& values);  // the inverse of values()
};

// Row-wise Adagrad for embedding tables (sparse or dense gradients) and any parameter of at least one dim.
class RowWiseAdagrad : public HookedOptimizer<RowWiseAdagradOptions> {
 public:
  using HookedOptimizer::HookedOptimizer;  // (params, options = {}) or (groups, defaults = {})

 protected:
  // CUDA parameters with dense gradients: kiln ops, one parameter at a time (found_inf read on the host).
  void update_bucket(size_t group, CudaBucket& bucket, const Tensor& grad_scale, const Tensor& found_inf) override;
  void update_param(size_t group, const Tensor& param, Tensor grad, Tensor& w, double t) override;  // dense rows
  void check_dense_param(size_t group, const Tensor& param) const override;   // refuses a 0-d parameter
  void check_sparse_param(size_t group, const Tensor& param) const override;  // refuses weight_decay > 0
  void update_sparse_param(size_t group, const Tensor& param, const SparseRowGrad& grad, double t) override;
  bool sparse_fused(size_t group, const Tensor& param) const override;  // CUDA parameters
  void update_sparse_fused(size_t group, const Tensor& param, const SparseRowGrad& grad, const Tensor& grad_scale,
                           const Tensor& found_inf) override;  // cuda/sparse.cu's kernel
  // "sum": (V) floating; the rest as the base.
  Tensor load_state_tensor(const Tensor& param, size_t index, const std::string& name, const Tensor& saved,
                           const std::string& key) const override;

 private:
  Tensor& row_sums(const Tensor& param);  // "sum" (V), created as zeros
};

}  // namespace kiln::optim
