// kiln/optim/cuda/checks.h — argument checks shared by the fused kernels' entry points (internal; no CUDA
// header). Each throws kiln::Error naming the op, the list, the index and what is wrong:
//
//   const Device dev = check_params(params, "fused_adam");
//   check_list(grads, "fused_adam", "grads", dev, params.size(), params[0].dtype(), &params);
//   check_scalar(grad_scale, "fused_adam", "grad_scale", dev, /*required=*/false);
#pragma once

#include <cstddef>
#include <optional>

#include "kiln/optim/cuda/fused.h"  // TensorVec

namespace kiln::optim::cuda_impl {

// float32, float16 or bfloat16: the dtypes the fused kernels take.
bool is_fused_dtype(DType t);

// Dense (grad_groups.h: flat_dense) means contiguous or channels-last: the kernels read each tensor as the flat
// run of its elements in memory order.
//
// The parameter list: defined dense CUDA tensors of one fused dtype, on one device (params may be
// empty: then the device is cpu and the caller returns). Returns the device.
Device check_params(const TensorVec& params, const char* op);

// A list of defined dense CUDA tensors of fused dtypes (mixed allowed) on one device (amp, norms).
// An empty list gives cpu (the caller returns). Returns the device.
Device check_tensors(const TensorVec& list, const char* op, const char* name);

// `size` defined dense tensors on `device`; of `dtype` (if given), else of fused dtypes (mixed allowed); with
// the numel and the memory order of like[i] (if like is given).
void check_list(const TensorVec& list, const char* op, const char* name, Device device, size_t size,
                std::optional<DType> dtype, const TensorVec* like);

// t: a 1-element float32 tensor on device, or undefined when !required (grad_scale, found_inf, factor...).
void check_scalar(const Tensor& t, const char* op, const char* name, Device device, bool required);

// One 1-element float32 step counter per parameter, on device.
void check_steps(const TensorVec& steps, const char* op, Device device, size_t size);

// The 16-bit shadows of float32 params (fused.h): empty, or one per parameter, each undefined (none kept) or
// of the parameter's shape and memory order on its device, all of one dtype, float16 or bfloat16. Returns
// that dtype, or nothing when no shadow is defined.
std::optional<DType> check_shadows(const TensorVec& shadows, const char* op, const TensorVec& params);

// What an update takes besides its lists, checked in this order: grad_scale and found_inf (check_scalar, not
// required), then the shadows. Returns check_shadows' dtype.
std::optional<DType> check_hooks(const Tensor& grad_scale, const Tensor& found_inf, const TensorVec& shadows,
                                 const char* op, Device device, const TensorVec& params);

}  // namespace kiln::optim::cuda_impl
