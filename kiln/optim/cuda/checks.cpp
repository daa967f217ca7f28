// Argument checks of the fused kernels (checks.h).
#include "kiln/optim/cuda/checks.h"

#include "kiln/optim/grad_groups.h"  // flat_dense, same_order

namespace kiln::optim::cuda_impl {

bool is_fused_dtype(DType t) { return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16; }

Device check_params(const TensorVec& params, const char* op) {
  if (params.empty()) return Device::cpu();
  KILN_CHECK(params[0].defined(), op, ": params[0] is undefined");
  const Device dev = params[0].device();
  KILN_CHECK(dev.is_cuda(), op, ": params must be CUDA tensors (params[0] is on ", dev, ")");
  const DType dtype = params[0].dtype();
  KILN_CHECK(is_fused_dtype(dtype), op, ": params[0] has dtype ", dtype,
             "; the fused kernels take float32, float16 or bfloat16 (use the unfused path)");
  check_list(params, op, "params", dev, params.size(), dtype, nullptr);
  return dev;
}

Device check_tensors(const TensorVec& list, const char* op, const char* name) {
  if (list.empty()) return Device::cpu();
  KILN_CHECK(list[0].defined(), op, ": ", name, "[0] is undefined");
  const Device dev = list[0].device();
  KILN_CHECK(dev.is_cuda(), op, ": ", name, " must be CUDA tensors (", name, "[0] is on ", dev, ")");
  check_list(list, op, name, dev, list.size(), std::nullopt, nullptr);
  return dev;
}

void check_list(const TensorVec& list, const char* op, const char* name, Device device, size_t size,
                std::optional<DType> dtype, const TensorVec* like) {
  KILN_CHECK(list.size() == size, op, ": ", name, " has ", list.size(), " tensors, expected ", size,
             " (one per parameter, in the same order)");
  for (size_t i = 0; i < list.size(); ++i) {
    const Tensor& t = list[i];
    KILN_CHECK(t.defined(), op, ": ", name, "[", i, "] is undefined");
    KILN_CHECK(t.device() == device, op, ": ", name, "[", i, "] is on ", t.device(), ", expected ", device,
               " (all tensors of one call on one device)");
    KILN_CHECK(detail::flat_dense(t), op, ": ", name, "[", i, "] (shape ", t.shape(), ", strides ", t.strides(),
               ") is neither contiguous nor channels-last; pass dense tensors (e.g. .contiguous())");
    if (dtype) {
      KILN_CHECK(t.dtype() == *dtype, op, ": ", name, "[", i, "] has dtype ", t.dtype(), ", expected ", *dtype);
    } else {
      KILN_CHECK(is_fused_dtype(t.dtype()), op, ": ", name, "[", i, "] has dtype ", t.dtype(),
                 "; the fused kernels take float32, float16 or bfloat16");
    }
    if (like != nullptr) {
      KILN_CHECK(t.numel() == (*like)[i].numel(), op, ": ", name, "[", i, "] has ", t.numel(), " elements but params[",
                 i, "] has ", (*like)[i].numel());
      // The update pairs the elements at equal offsets: the same memory order as the parameter, or the same
      // contiguous order where the shapes differ (a flat view of it).
      const bool same = t.shape() == (*like)[i].shape() ? detail::same_order(t, (*like)[i])
                                                        : t.is_contiguous() && (*like)[i].is_contiguous();
      KILN_CHECK(same, op, ": ", name, "[", i, "] (strides ", t.strides(), ") is not in the memory order of params[", i,
                 "] (shape ", (*like)[i].shape(), ", strides ", (*like)[i].strides(),
                 "); pass it in the parameter's layout (e.g. .contiguous(params[i].suggest_memory_format()))");
    }
  }
}

void check_scalar(const Tensor& t, const char* op, const char* name, Device device, bool required) {
  if (!t.defined()) {
    KILN_CHECK(!required, op, ": ", name, " is undefined (a 1-element float32 tensor on ", device, " is needed)");
    return;
  }
  KILN_CHECK(t.numel() == 1 && t.dtype() == DType::Float32 && t.device() == device, op, ": ", name,
             " must be a 1-element float32 tensor on ", device, ", got ", t.numel(), " elements of ", t.dtype(), " on ",
             t.device());
}

void check_steps(const TensorVec& steps, const char* op, Device device, size_t size) {
  KILN_CHECK(steps.size() == size, op, ": steps has ", steps.size(), " tensors, expected ", size,
             " (one 1-element float32 step counter per parameter)");
  for (size_t i = 0; i < steps.size(); ++i) {
    const Tensor& s = steps[i];
    KILN_CHECK(s.defined() && s.numel() == 1 && s.dtype() == DType::Float32 && s.device() == device, op, ": steps[", i,
               "] must be a 1-element float32 tensor on ", device);
  }
}

std::optional<DType> check_shadows(const TensorVec& shadows, const char* op, const TensorVec& params) {
  if (shadows.empty()) return std::nullopt;
  KILN_CHECK(shadows.size() == params.size(), op, ": shadows has ", shadows.size(), " tensors, expected ",
             params.size(), " (none, or one per parameter: undefined where no 16-bit copy is kept)");
  std::optional<DType> dtype;
  for (size_t i = 0; i < shadows.size(); ++i) {
    const Tensor& s = shadows[i];
    if (!s.defined()) continue;
    const Tensor& p = params[i];
    KILN_CHECK(p.dtype() == DType::Float32, op, ": shadows[", i, "] is defined but params[", i, "] has dtype ",
               p.dtype(), "; only float32 parameters have 16-bit shadows");
    KILN_CHECK(s.dtype() == DType::Float16 || s.dtype() == DType::BFloat16, op, ": shadows[", i, "] has dtype ",
               s.dtype(), "; a shadow is float16 or bfloat16");
    KILN_CHECK(!dtype || *dtype == s.dtype(), op, ": shadows[", i, "] is ", s.dtype(), " but an earlier shadow is ",
               *dtype, "; one call writes shadows of one dtype");
    dtype = s.dtype();
    KILN_CHECK(s.device() == p.device() && s.shape() == p.shape() && s.strides() == p.strides(), op, ": shadows[", i,
               "] (shape ", s.shape(), ", strides ", s.strides(), ", on ", s.device(),
               ") must have the shape, strides ", "and device of params[", i, "] (shape ", p.shape(), ", strides ",
               p.strides(), ", on ", p.device(), ")");
  }
  return dtype;
}

std::optional<DType> check_hooks(const Tensor& grad_scale, const Tensor& found_inf, const TensorVec& shadows,
                                 const char* op, Device device, const TensorVec& params) {
  check_scalar(grad_scale, op, "grad_scale", device, false);
  check_scalar(found_inf, op, "found_inf", device, false);
  return check_shadows(shadows, op, params);
}

}  // namespace kiln::optim::cuda_impl
