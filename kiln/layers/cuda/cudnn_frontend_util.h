// kiln/layers/cuda/cudnn_frontend_util.h — what the layers' cudnn-frontend graphs share: a failed frontend call as a
// kiln error, and the rule for a failed step while a graph is built (internal; included only where
// KILN_WITH_CUDNN_FRONTEND is set, after cudnn_frontend.h).
#pragma once

#include <cudnn_frontend.h>

#include <string>

#include "kiln/tensor/error.h"  // CudaError

namespace kiln::nn::cuda_impl {

// A failed frontend call at run time: a CudaError naming `op` and the step, with the frontend's message.
inline void check_frontend(cudnn_frontend::error_t status, const char* op, const char* step) {
  if (status.is_bad()) {
    throw CudaError(::kiln::detail::str_cat(op, ": cudnn-frontend ", step, " failed: ", status.get_message()));
  }
}

// A step while building a graph: true when it succeeded. The CUDA runtime or the handle failing throws; anything else
// (not supported, no engine, no plan) returns false, with the reason in *why_not when given, and the caller takes
// another path.
inline bool frontend_build_step(cudnn_frontend::error_t status, const char* op, const char* step,
                                std::string* why_not = nullptr) {
  if (status.is_good()) return true;
  const cudnn_frontend::error_code_t code = status.get_code();
  if (code == cudnn_frontend::error_code_t::CUDA_API_FAILED || code == cudnn_frontend::error_code_t::HANDLE_ERROR ||
      code == cudnn_frontend::error_code_t::INVALID_CUDA_DEVICE) {
    check_frontend(status, op, step);
  }
  if (why_not != nullptr) *why_not = ::kiln::detail::str_cat("cuDNN ", step, ": ", status.get_message());
  return false;
}

}  // namespace kiln::nn::cuda_impl
