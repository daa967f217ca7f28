// kiln/optim/sparse_rows.h — internal: the rows of a (V, D...) table (a parameter or an optimizer state) read and
// written at a list of rows, through kiln ops on any device, for the optimizers' updates from row-sparse gradients
// (kiln/autograd/sparse_grad.h): each costs O(K) for K rows, never O(V).
//
//   Tensor w = detail::gather_rows(param, g.indices);     // (K, D...)
//   internal::add_(w, g.values, -lr);
//   detail::write_rows_(param, g.indices, w);             // param[g.indices[i]] = w[i]; the other rows untouched
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/autograd/sparse_grad.h"  // SparseRowGrad
#include "kiln/tensor/tensor.h"

namespace kiln::optim::detail {

// The fused CUDA update of a row-sparse gradient (cuda/fused.h: fused_sparse_update): the rule and its numbers.
enum class SparseRule { Sgd, SgdMomentum, Adam, RowWiseAdagrad };
// What fused_sparse_update applies (rule, learning rate, ...).
struct SparseHyper {
  SparseRule rule = SparseRule::Sgd;
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // betas: Adam; eps: Adam and RowWiseAdagrad
  bool maximize = false;
  double momentum = 0, dampening = 0;  // SgdMomentum
  bool nesterov = false;               // SgdMomentum
  bool fresh = false;                  // SgdMomentum: the buffer is new (a first step, as step == 0 is too)
};

// Whether `param`'s sparse gradient `grad` takes the fused CUDA update (cuda_impl::fuses_sparse): a contiguous
// float32, float16 or bfloat16 parameter on the gradient's GPU, or in page-locked host memory with the gradient on
// a GPU (device-held, sparse_grad.h). False in a build without CUDA.
bool sparse_fusable(const Tensor& param, const SparseRowGrad& grad);
// cuda_impl::fused_sparse_update on the gradient's GPU, with the gradient as accumulated (values made contiguous) and
// grad_scale and found_inf (undefined, or one element anywhere) as a 1-element float32 tensor on that GPU.
void fused_sparse_step(const Tensor& param, const SparseRowGrad& grad, const std::vector<Tensor>& states,
                       const Tensor& step, const SparseHyper& hyper, const Tensor& grad_scale, const Tensor& found_inf);

// t[rows] as a new (K, D...) tensor in `dtype` (t's own when not given); rows (K) Int64 on t's device.
Tensor gather_rows(const Tensor& t, const Tensor& rows, std::optional<DType> dtype = {});
// t[rows[i]] = values[i] in place, values (K, D...) cast to t's dtype once; rows unique. The rows are overwritten
// (not added to), so a row's new value is exactly values[i]; every other row keeps its bits. Counts the write in
// t's version.
void write_rows_(Tensor& t, const Tensor& rows, const Tensor& values);
// A (K) tensor of per-row numbers shaped to broadcast against (K, D...) rows: (K, 1, ...) with `dims` dims.
Tensor per_row(const Tensor& v, int64_t dims);

// Where each of `rows` (sorted) sits in `sorted` (sorted, unique, holding every one of them): sorted[out[j]] ==
// rows[j].
std::vector<int64_t> positions_in(const std::vector<int64_t>& sorted, const std::vector<int64_t>& rows);
// The state of a parameter in `dtype`: on its device, and page-locked when the parameter is (so that the fused update
// of a device-held gradient reaches it through the device mapping).
TensorOptions state_options(const Tensor& param, DType dtype);
// A state made before its parameter was page-locked (the parameter moved) moves to page-locked memory once.
// Returns `state`.
Tensor& pin_like(const Tensor& param, Tensor& state);
// A 1-D Int64 tensor's entries on the host (a device tensor is copied, which waits for it).
std::vector<int64_t> host_rows(const Tensor& rows);

}  // namespace kiln::optim::detail
