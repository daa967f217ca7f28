// kiln/layers/cuda/cross_entropy.h — fused softmax + cross-entropy on CUDA for class-index targets
// (internal; included by kiln/layers/loss.cpp and kiln/layers/cuda/*).
//
//   if (cuda_impl::cross_entropy_fits(logits, target, options))          // logits (N, C[, d1...]) on a GPU
//     loss = cuda_impl::cross_entropy(logits, target, options);          // differentiable in logits
//
// Forward reads each row of logits once (twice with label smoothing) and keeps its logsumexp (float32, or
// float64 for float64 logits; rows whose target is ignore_index are not read); backward writes
// grad_logits = g_i * (A_i softmax - q) in one pass. 16-bit
// logits are read as they are and computed in float32. No host synchronisation: a target outside
// [0, C) that is not ignore_index makes its row's loss (and gradient) NaN instead of raising.
#pragma once

#include <cstdint>

#include "kiln/layers/loss.h"    // CrossEntropyOptions
#include "kiln/tensor/tensor.h"  // Tensor

namespace kiln::nn::cuda_impl {

// Whether the fused path takes this call: CUDA logits with at least one class and an integer target
// (not probabilities), and a class weight that needs no gradient.
bool cross_entropy_fits(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options);

// nn::cross_entropy for logits (N, C) or (N, C, d1, ...) and class indices (N) / (N, d1, ...) whose shapes
// were checked by the caller. Applies autocast (autocast_ops::cross_entropy()) itself.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options);

// ---- the kernels' launchers (cross_entropy.cu) ----
// Rows are logits (R, C) with any strides; `target` (R) Int64 contiguous; `weight` (C) contiguous in the
// compute dtype (float32, float64 for float64 logits) or undefined; `weight_sum` its 0-d sum (backward) or
// undefined.

struct CrossEntropyRows {
  Tensor loss;     // (R) compute dtype: (1-s) w[t] (lse - x[t]) + s/C sum_c w[c] (lse - x[c]); 0 where ignored
  Tensor weights;  // (R) compute dtype: w[t], 0 where ignored (Mean's denominator terms)
  Tensor lse;      // (R) compute dtype: log sum_c exp(x[c]), for backward; 0 where ignored
};

CrossEntropyRows cross_entropy_rows(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                    int64_t ignore_index, double smoothing);

// grad_logits (R, C) in the logits' dtype: contiguous, or with the logits' row stride where that is their rows
// padded to a 16-byte pitch (a product's output, Backend::matmul_row_pitch). `grad` holds g in the compute dtype: (R)
// for Reduction::None, else 0-d (one g for every row); `denominator` (0-d, Mean) divides it, or is undefined.
Tensor cross_entropy_rows_backward(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                   const Tensor& weight_sum, const Tensor& lse, const Tensor& grad,
                                   const Tensor& denominator, int64_t ignore_index, double smoothing);

}  // namespace kiln::nn::cuda_impl
