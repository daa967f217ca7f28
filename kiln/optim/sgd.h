// kiln/optim/sgd.h — stochastic gradient descent with momentum, dampening, Nesterov and weight decay,
// exactly as torch.optim.SGD.
//
//   optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-5});
//   opt.zero_grad();  loss.backward();  opt.step();
//
// Per parameter with gradient g (negated when maximize):
//   g += weight_decay * p
//   buf = g on the first step, else momentum * buf + (1 - dampening) * g       (when momentum != 0)
//   g = nesterov ? g + momentum * buf : buf                                      (when momentum != 0)
//   p -= lr * g
// State: "momentum_buffer" (when momentum != 0) and "step".
//
// Sparse gradients (nn::Embedding with {.sparse = true}; kiln/autograd/sparse_grad.h), as torch.optim.SGD with a
// sparse .grad: the gradient is coalesced (repeated rows summed) and only rows are updated. Without momentum,
// p[rows] -= lr * g. With momentum, PyTorch's buffer is a sparse tensor holding every row ever touched; here it is
// "momentum_buffer" (V, D...), zero outside those rows, plus "momentum_mask" (V) Bool, true on those rows (state_dict
// gives it as "momentum_rows" (R) Int64, the rows sorted, and load_state_dict takes that), and each step updates buf
// and p on that union only (O(rows touched so far), as PyTorch, plus a scan of the V flags that finds them):
//   buf[U] = momentum * buf[U] + (1 - dampening) * g[U]   (g is 0 on rows of U it does not hold; first step buf = g)
//   p[U] -= lr * (nesterov ? g[U] + momentum * buf[U] : buf[U])
// which is the dense update with the dense gradient, on every row. weight_decay > 0 with a sparse gradient is
// refused (it would touch every row; PyTorch refuses it too): give the tables a group with weight_decay 0.
// The mask is per row, so nn::HybridEmbedding::swap_state_rows carries it with rows that change tier.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// SGD's hyperparameters, with PyTorch's names and defaults.
struct SGDOptions {
  static constexpr const char* kName = "SGD";  // the optimizer's name
  double lr = 1e-3;                            // learning rate, >= 0
  double momentum = 0;                         // >= 0; 0 keeps no momentum buffer
  double dampening = 0;                        // scales the new gradient by 1 - dampening in the buffer
  double weight_decay = 0;                     // L2 penalty added to the gradient, >= 0
  bool nesterov = false;                       // needs momentum > 0 and dampening == 0
  bool maximize = false;                       // ascend instead of descend

  void validate() const;                         // throws kiln::Error naming the bad option
  std::map<std::string, double> values() const;  // by name, flags as 0 or 1 (state_dict)
  static SGDOptions from_values(const std::map<std::string, double>& values);  // the inverse of values()
};

// Stochastic gradient descent with optional momentum, dampening, Nesterov and weight decay, as torch.optim.SGD.
class SGD : public HookedOptimizer<SGDOptions> {
 public:
  using HookedOptimizer::HookedOptimizer;  // (params, options = {}) or (groups, defaults = {})
  // The base's, with each sparse momentum's "momentum_mask" given as "momentum_rows" (R) Int64 on the CPU: the
  // sorted rows it covers.
  OptimizerState state_dict() const override;
  // The base's, then each loaded "momentum_rows" made the "momentum_mask" it stands for.
  void load_state_dict(const OptimizerState& state) override;

 protected:
  void update_bucket(size_t group, CudaBucket& bucket, const Tensor& grad_scale, const Tensor& found_inf) override;
  void update_param(size_t group, const Tensor& param, Tensor grad, Tensor& w, double t) override;  // the CPU update
  // Sparse gradients: refused with weight_decay > 0; updated row by row through kiln ops on any device.
  void check_sparse_param(size_t group, const Tensor& param) const override;
  void update_sparse_param(size_t group, const Tensor& param, const SparseRowGrad& grad, double t) override;
  bool sparse_fused(size_t group, const Tensor& param) const override;  // detail::sparse_fusable
  // cuda/sparse.cu's kernels; with momentum, a sweep over the mask (O(V / 32) warps) updates every covered row.
  void update_sparse_fused(size_t group, const Tensor& param, const SparseRowGrad& grad, const Tensor& grad_scale,
                           const Tensor& found_inf) override;
  // "momentum_rows": a sorted, unique Int64 row list in [0, V) (load_state_dict then makes it "momentum_mask");
  // "momentum_mask": (V) Bool; the rest as the base.
  Tensor load_state_tensor(const Tensor& param, size_t index, const std::string& name, const Tensor& saved,
                           const std::string& key) const override;

 private:
  // p's "momentum_mask" on `device` (moved there if elsewhere), made from a loaded "momentum_rows" (then dropped) or
  // as zeros when absent.
  Tensor& momentum_mask(const Tensor& p, Device device);
};

}  // namespace kiln::optim
