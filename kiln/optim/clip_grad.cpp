// clip_grad_norm_ / clip_grad_value_: per-device partial norms (fused on CUDA for p = 2), combined on the
// first gradient's device; the clip coefficient never leaves the device.
#include "kiln/optim/clip_grad.h"

#include <cmath>
#include <utility>

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/sparse_grad.h"
#include "kiln/optim/grad_groups.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

#if KILN_WITH_CUDA
#include "kiln/optim/cuda/fused.h"
#endif

namespace kiln::optim {
namespace {

// The p-norm of one gradient as a 0-d tensor of `dtype` (16-bit gradients are widened first).
Tensor tensor_norm(const Tensor& g, double p, DType dtype) {
  return internal::norm(g.dtype() == dtype ? g : g.to(dtype), p);
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  KILN_CHECK(norm_type > 0 && !std::isnan(norm_type), "clip_grad_norm_: norm_type must be > 0 or INFINITY, got ",
             norm_type);
  KILN_CHECK(!std::isnan(max_norm) && max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  std::vector<optim::detail::GradGroup> groups = optim::detail::group_grads(params);
  // Sparse gradients (sparse_grad.h) count as their coalesced rows (repeated rows summed), as PyTorch's norm of a
  // sparse tensor: (parameter, coalesced gradient).
  std::vector<std::pair<Tensor, SparseRowGrad>> sparse;
  for (const Tensor& p : params) {
    if (p.defined() && autograd::has_sparse_grad(p)) sparse.emplace_back(p, autograd::sparse_grad(p)->coalesce());
  }
  if (groups.empty() && sparse.empty()) return internal::zeros({}, {.dtype = DType::Float32});
  bool all_float64 = true;
  for (const auto& group : groups) {
    for (const Tensor& g : group.all) all_float64 = all_float64 && g.dtype() == DType::Float64;
  }
  for (const auto& [p, g] : sparse) all_float64 = all_float64 && g.values.dtype() == DType::Float64;
  const DType norm_dtype = all_float64 ? DType::Float64 : DType::Float32;
  const Device first = groups.empty() ? sparse.front().second.values.device() : groups.front().device;

  std::vector<Tensor> device_norms;  // one 0-d norm per device, moved to `first`
  for (const auto& group : groups) {
    std::vector<Tensor> norms;  // 0-d partial norms on group.device
#if KILN_WITH_CUDA
    if (group.device.is_cuda() && norm_type == 2.0) {
      for (const auto& same_dtype : group.dense_by_dtype) {
        norms.push_back(optim::cuda_impl::fused_l2_norm(same_dtype).reshape({}).to(norm_dtype));  // (1,) -> 0-d
      }
      for (const Tensor& g : group.others) norms.push_back(tensor_norm(g, norm_type, norm_dtype));
    } else {
      for (const Tensor& g : group.all) norms.push_back(tensor_norm(g, norm_type, norm_dtype));
    }
#else
    for (const Tensor& g : group.all) norms.push_back(tensor_norm(g, norm_type, norm_dtype));
#endif
    const Tensor norm = norms.size() == 1 ? norms.front() : internal::norm(internal::stack(norms), norm_type);
    device_norms.push_back(norm.to(first, /*non_blocking=*/true));
  }
  for (const auto& [p, g] : sparse) {
    device_norms.push_back(tensor_norm(g.values, norm_type, norm_dtype).to(first, /*non_blocking=*/true));
  }
  const Tensor total = device_norms.size() == 1 ? device_norms.front()
                                                : internal::norm(internal::stack(device_norms), norm_type);  // 0-d

  if (error_if_nonfinite) {
    const double value = total.item<double>();  // the one host sync, asked for by the caller
    KILN_CHECK(std::isfinite(value), "clip_grad_norm_: the total norm of order ", norm_type, " of the gradients is ",
               value, ", so they cannot be clipped; pass error_if_nonfinite = false to clip anyway (the gradients ",
               "then become NaN) or find where the inf/NaN comes from");
  }

  // min(1, max_norm / (total + 1e-6)), 0-d on `first`: exactly 1 when the total is small enough.
  const Tensor coef = internal::clamp(internal::div(max_norm, internal::add(total, 1e-6)), std::nullopt, 1.0);
  for (auto& group : groups) {
#if KILN_WITH_CUDA
    if (group.device.is_cuda()) {
      const Tensor coef1 = coef.to(group.device, DType::Float32, /*non_blocking=*/true).reshape({1});  // (1,)
      for (const auto& same_dtype : group.dense_by_dtype) optim::cuda_impl::fused_scale(same_dtype, coef1);
      const Tensor coef0 = coef.to(group.device, /*non_blocking=*/true);
      for (Tensor& g : group.others) optim::detail::mul_in_float32_(g, coef0);
      continue;
    }
#endif
    const Tensor coef0 = coef.to(group.device, /*non_blocking=*/true);
    for (Tensor& g : group.all) optim::detail::mul_in_float32_(g, coef0);
  }
  // A sparse gradient's values are scaled in a copy (they may be a tensor the caller still holds), and the
  // coalesced, scaled gradient replaces the parameter's.
  for (auto& [p, g] : sparse) {
    Tensor values = internal::clone(g.values);
    optim::detail::mul_in_float32_(values, coef.to(values.device(), /*non_blocking=*/true));
    g.values = values;
    autograd::set_sparse_grad(p, g);
  }
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  KILN_CHECK(!std::isnan(clip_value) && clip_value >= 0, "clip_grad_value_: clip_value must be >= 0, got ", clip_value);
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    if (!p.defined()) continue;
    if (const SparseRowGrad* sparse = autograd::sparse_grad(p)) {
      // The coalesced rows are clamped: the same as clamping the dense gradient, whose other rows are 0.
      SparseRowGrad g = sparse->coalesce();
      g.values = internal::clamp(g.values, -clip_value, clip_value);
      autograd::set_sparse_grad(p, std::move(g));
      continue;
    }
    if (!p.grad().defined()) continue;
    Tensor g = p.grad();  // shares the gradient's memory
    internal::clamp_(g, -clip_value, clip_value);
  }
}

}  // namespace kiln::optim
