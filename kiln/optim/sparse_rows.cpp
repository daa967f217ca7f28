// kiln/optim/sparse_rows.cpp — rows of a table read (index_select) and written (scatter_ with the row index
// broadcast along the other dims) through kiln ops; where rows sit in a sorted row list.
#include "kiln/optim/sparse_rows.h"

#if KILN_WITH_CUDA
#include "kiln/optim/cuda/fused.h"  // fuses_sparse, fused_sparse_update
#endif

#include <algorithm>

#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::optim::detail {

bool sparse_fusable(const Tensor& param, const SparseRowGrad& grad) {
#if KILN_WITH_CUDA
  return grad.values.defined() && cuda_impl::fuses_sparse(param, grad.values.device());
#else
  (void)param, (void)grad;
  return false;
#endif
}

void fused_sparse_step(const Tensor& param, const SparseRowGrad& grad, const std::vector<Tensor>& states,
                       const Tensor& step, const SparseHyper& hyper, const Tensor& grad_scale,
                       const Tensor& found_inf) {
  KILN_CHECK(sparse_fusable(param, grad),
             "optim: the fused sparse update takes a contiguous float32, float16 or "
             "bfloat16 parameter on its gradient's GPU (or in page-locked host memory), got ",
             param.shape(), " ", param.dtype(), " on ", param.device(), " with a gradient on ",
             grad.values.defined() ? grad.values.device() : param.device());
#if KILN_WITH_CUDA
  const Device device = grad.values.device();
  const auto scalar = [&](const Tensor& t) {
    if (!t.defined()) return t;
    KILN_CHECK(t.numel() == 1, "optim: grad_scale and found_inf hold one element, got shape ", t.shape());
    return internal::contiguous(internal::reshape(internal::to(t, device, DType::Float32), {1}));
  };
  cuda_impl::fused_sparse_update(param, grad.indices, internal::contiguous(grad.values), states, step, hyper,
                                 scalar(grad_scale), scalar(found_inf));
#else
  (void)states, (void)step, (void)hyper, (void)grad_scale, (void)found_inf;
#endif
}

TensorOptions state_options(const Tensor& param, DType dtype) {
  return {.dtype = dtype, .device = param.device(), .pinned_memory = param.is_cpu() && param.is_pinned()};
}

Tensor& pin_like(const Tensor& param, Tensor& state) {
  if (param.is_cpu() && param.is_pinned() && state.is_cpu() && !state.is_pinned()) state = state.pin_memory();
  return state;
}

Tensor gather_rows(const Tensor& t, const Tensor& rows, std::optional<DType> dtype) {
  Tensor out = internal::index_select(t, 0, rows);  // (K, D...)
  return dtype && *dtype != out.dtype() ? internal::cast(out, *dtype) : out;
}

void write_rows_(Tensor& t, const Tensor& rows, const Tensor& values) {
  const int64_t k = rows.numel();
  Shape expected = t.shape();
  expected[0] = k;
  KILN_CHECK(values.shape() == expected, "optim: rows of shape ", values.shape(), " written into a table of shape ",
             t.shape(), " at ", k, " rows");
  if (k == 0) return;
  // scatter_ along dim 0 with index[i, j...] = rows[i]: a stride-0 view of the (K) rows, no (K, D...) copy.
  Shape one(static_cast<size_t>(t.dim()), 1);
  one[0] = k;
  const Tensor index = internal::expand(internal::reshape(rows, one), expected);
  internal::scatter_(t, 0, index, values.dtype() == t.dtype() ? values : internal::cast(values, t.dtype()));
}

Tensor per_row(const Tensor& v, int64_t dims) {
  Shape shape(static_cast<size_t>(std::max<int64_t>(dims, 1)), 1);
  shape[0] = v.numel();
  return internal::reshape(v, shape);
}

std::vector<int64_t> positions_in(const std::vector<int64_t>& sorted, const std::vector<int64_t>& rows) {
  std::vector<int64_t> out;
  out.reserve(rows.size());
  auto it = sorted.begin();
  for (const int64_t row : rows) {  // rows are sorted: one forward pass
    it = std::lower_bound(it, sorted.end(), row);
    out.push_back(static_cast<int64_t>(it - sorted.begin()));
  }
  return out;
}

std::vector<int64_t> host_rows(const Tensor& rows) {
  KILN_CHECK(rows.dim() == 1 && rows.dtype() == DType::Int64, "optim: a row list must be 1-D Int64, got shape ",
             rows.shape(), " and dtype ", rows.dtype());
  const Tensor host = internal::contiguous(internal::to(rows, Device::cpu()));
  const int64_t* p = host.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + host.numel());
}

}  // namespace kiln::optim::detail
