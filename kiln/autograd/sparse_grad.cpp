// kiln/autograd/sparse_grad.cpp — row-sparse gradients: coalescing, densifying, and the slot on a leaf's autograd
// state that holds them.
#include "kiln/autograd/sparse_grad.h"

#include <algorithm>
#include <numeric>

#include "kiln/autograd/autograd_meta.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln {

namespace {

// (V, D...) with `rows` in place of V.
Shape rows_shape(const Shape& dense, int64_t rows) {
  Shape s = dense;
  s[0] = rows;
  return s;
}

void check_grad(const SparseRowGrad& g, const char* what) {
  KILN_CHECK(g.indices.defined() && g.values.defined(), what, ": a sparse gradient needs indices and values");
  KILN_CHECK(!g.dense_shape.empty(), what, ": a sparse gradient's dense shape has at least one dim (the rows)");
  KILN_CHECK(g.indices.dim() == 1 && g.indices.dtype() == DType::Int64, what,
             ": sparse gradient indices must be 1-D Int64, got shape ", g.indices.shape(), " and dtype ",
             g.indices.dtype());
  KILN_CHECK(g.values.shape() == rows_shape(g.dense_shape, g.indices.numel()), what,
             ": sparse gradient values of shape ", g.values.shape(), " do not match ", g.indices.numel(), " rows of ",
             g.dense_shape);
  KILN_CHECK(g.indices.device() == g.values.device(), what, ": sparse gradient indices are on ", g.indices.device(),
             " but values on ", g.values.device());
}

}  // namespace

SparseRowGrad SparseRowGrad::coalesce() const {
  check_grad(*this, "SparseRowGrad::coalesce");
  if (coalesced) return *this;
  const int64_t k = indices.numel();
  // The row of each entry, read on the host (K integers; on a GPU this waits for them), sorted stably so that
  // repeated rows are summed in the order backward added them.
  const Tensor host = internal::contiguous(internal::to(indices, Device::cpu()));
  const int64_t* idx = host.data_ptr<int64_t>();
  std::vector<int64_t> order(static_cast<size_t>(k));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return idx[a] < idx[b]; });
  std::vector<int64_t> unique_rows, group(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    const int64_t row = idx[order[static_cast<size_t>(j)]];
    KILN_CHECK(row >= 0 && row < dense_shape[0], "SparseRowGrad::coalesce: row index ", row, " is outside [0, ",
               dense_shape[0], ")");
    if (unique_rows.empty() || unique_rows.back() != row) unique_rows.push_back(row);
    group[static_cast<size_t>(order[static_cast<size_t>(j)])] = static_cast<int64_t>(unique_rows.size()) - 1;
  }
  const Device device = values.device();
  const int64_t u = static_cast<int64_t>(unique_rows.size());
  SparseRowGrad out;
  out.dense_shape = dense_shape;
  out.indices = internal::to(internal::from_vector(unique_rows, {u}), device);
  // Sums in the entries' order: index_add adds entry j into row group[j].
  out.values =
      internal::index_add(internal::zeros(rows_shape(dense_shape, u), {.dtype = values.dtype(), .device = device}), 0,
                          internal::to(internal::from_vector(group, {k}), device), values);
  out.coalesced = true;
  return out;
}

Tensor SparseRowGrad::to_dense() const {
  check_grad(*this, "SparseRowGrad::to_dense");
  const Tensor zero = internal::zeros(dense_shape, {.dtype = values.dtype(), .device = values.device()});
  return internal::index_add(zero, 0, indices, values);
}

namespace autograd {

const SparseRowGrad* sparse_grad(const Tensor& param) {
  KILN_CHECK(param.defined(), "sparse_grad: the tensor is undefined");
  const AutogradMeta* m = get_meta(param);
  return m == nullptr ? nullptr : m->sparse_grad.get();
}

namespace {
// A page-locked host parameter's gradient held on a GPU (sparse_grad.h).
bool device_held(const Tensor& param, const SparseRowGrad& g) {
  return param.is_cpu() && param.is_pinned() && g.values.is_cuda();
}

void check_against(const Tensor& param, const SparseRowGrad& g, const char* what) {
  check_grad(g, what);
  KILN_CHECK(g.dense_shape == param.shape(), what, ": a sparse gradient of shape ", g.dense_shape,
             " for a parameter of shape ", param.shape());
  KILN_CHECK(g.values.dtype() == param.dtype() && (g.values.device() == param.device() || device_held(param, g)), what,
             ": sparse gradient values are ", g.values.dtype(), " on ", g.values.device(), " but the parameter is ",
             param.dtype(), " on ", param.device(),
             param.is_cpu() && g.values.is_cuda() ? " in pageable memory (a gradient may stay on a GPU only for a "
                                                    "parameter in page-locked host memory)"
                                                  : "");
}
}  // namespace

void accumulate_sparse_grad(const Tensor& param, SparseRowGrad g) {
  KILN_CHECK(param.defined(), "accumulate_sparse_grad: the tensor is undefined");
  check_against(param, g, "accumulate_sparse_grad");
  AutogradMeta& m = materialize_meta(param);
  KILN_CHECK(!m.grad.defined(), "accumulate_sparse_grad: the parameter of shape ", param.shape(),
             " already holds a dense gradient; a table's lookups must all be sparse or all dense (clear the gradient "
             "with zero_grad() between the two)");
  if (m.sparse_grad == nullptr) {
    m.sparse_grad = std::make_shared<SparseRowGrad>(std::move(g));
    return;
  }
  SparseRowGrad& acc = *m.sparse_grad;
  KILN_CHECK(acc.values.device() == g.values.device(), "accumulate_sparse_grad: the parameter of shape ", param.shape(),
             " holds a sparse gradient on ", acc.values.device(), " and is given rows on ", g.values.device(),
             "; every lookup of a backward pass must leave its rows on the same device");
  acc.indices = internal::cat({acc.indices, g.indices}, 0);
  acc.values = internal::cat({acc.values, g.values}, 0);
  acc.coalesced = false;
}

void set_sparse_grad(const Tensor& param, SparseRowGrad g) {
  KILN_CHECK(param.defined(), "set_sparse_grad: the tensor is undefined");
  check_against(param, g, "set_sparse_grad");
  materialize_meta(param).sparse_grad = std::make_shared<SparseRowGrad>(std::move(g));
}

void clear_sparse_grad(const Tensor& param) {
  KILN_CHECK(param.defined(), "clear_sparse_grad: the tensor is undefined");
  if (AutogradMeta* m = get_meta(param)) m->sparse_grad.reset();
}

}  // namespace autograd
}  // namespace kiln
