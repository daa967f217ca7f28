// Grouping gradients by device and dtype for the fused kernels.
#include "kiln/optim/grad_groups.h"

#include "kiln/tensor/internal_ops.h"

namespace kiln::optim::detail {

std::vector<GradGroup> group_grads(const std::vector<Tensor>& params) {
  std::vector<GradGroup> groups;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    const Tensor& g = p.grad();
    GradGroup* group = nullptr;
    for (GradGroup& existing : groups) {
      if (existing.device == g.device()) group = &existing;
    }
    if (group == nullptr) group = &groups.emplace_back(GradGroup{.device = g.device()});
    group->all.push_back(g);
    // The fused kernels take dense float32 / float16 / bfloat16 tensors.
    const bool fusable = g.dtype() == DType::Float32 || g.dtype() == DType::Float16 || g.dtype() == DType::BFloat16;
    if (!fusable || !flat_dense(g)) {
      group->others.push_back(g);
      continue;
    }
    std::vector<Tensor>* same = nullptr;
    for (auto& list : group->dense_by_dtype) {
      if (list.front().dtype() == g.dtype()) same = &list;
    }
    if (same == nullptr) same = &group->dense_by_dtype.emplace_back();
    same->push_back(g);
  }
  return groups;
}

bool flat_dense(const Tensor& t) {
  return t.is_contiguous() || (t.dim() == 4 && t.is_contiguous(MemoryFormat::ChannelsLast));
}

MemoryFormat flat_layout(const Tensor& param) {
  return !param.is_contiguous() && param.dim() == 4 && param.is_contiguous(MemoryFormat::ChannelsLast)
             ? MemoryFormat::ChannelsLast
             : MemoryFormat::Contiguous;
}

bool same_order(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

void mul_in_float32_(Tensor& grad, const Tensor& factor) {
  if (grad.dtype() == DType::Float16 || grad.dtype() == DType::BFloat16) {
    grad.copy_(internal::mul(grad.to(DType::Float32), factor.to(DType::Float32)));
  } else {
    internal::mul_(grad, factor);
  }
}

std::vector<Tensor> params_of(const Optimizer& opt) {
  std::vector<Tensor> out;
  for (size_t g = 0; g < opt.num_param_groups(); ++g) {
    const auto& ps = opt.params(g);
    out.insert(out.end(), ps.begin(), ps.end());
  }
  return out;
}

}  // namespace kiln::optim::detail
