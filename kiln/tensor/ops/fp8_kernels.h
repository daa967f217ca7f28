// kiln/tensor/ops/fp8_kernels.h — the backends' kernels of the FP8 ops (fp8_ops.h), called by ops/fp8.cpp once it
// has checked the arguments (backend-internal). Like the layers' fused kernels they are not part of the Backend
// contract: only the CPU and CUDA backends have them.
#pragma once

#include "kiln/tensor/fp8_ops.h"  // Fp8Activation
#include "kiln/tensor/tensor.h"

namespace kiln::cpu {
// out = saturate(x * scale[0]) (transposed when `transpose`), amax[0] = max(amax[0], max |x|). x non-empty and
// contiguous (float32, bfloat16, float16), out contiguous FP8 of x's (or the transposed) shape.
void fp8_quantize(const Tensor& out, const Tensor& x, const Tensor& scale, const Tensor& amax, bool transpose);
// out (M, N) contiguous = sa * sb * a @ b^T (+ bias) (+ out when accumulate); M, N, K > 0; a (M, K), b (N, K)
// contiguous FP8; bias undefined or (N) contiguous in out's dtype.
void fp8_gemm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& a_scale_inv, const Tensor& b_scale_inv,
              const Tensor& bias, bool accumulate);
// The delayed-scaling update (fp8_update_scales): history (L, N) with L >= 1, N >= 1, scale, scale_inv,
// scaled_max (N); all float32 contiguous. scale_copy, scale_inv_copy: undefined or (N) float32 of any stride.
void fp8_update_scales(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, const Tensor& scaled_max,
                       bool most_recent, const Tensor& scale_copy, const Tensor& scale_inv_copy);
}  // namespace kiln::cpu

namespace kiln::cuda {
// The same on the GPU (cuda/fp8_quantize.cu, cuda/fp8_gemm.cpp, cuda/fp8_scaling.cu), on the current stream of the
// (first) output's device.
void fp8_quantize(const Tensor& out, const Tensor& x, const Tensor& scale, const Tensor& amax, bool transpose);
// fast_accumulation: CUBLASLT_MATMUL_DESC_FAST_ACCUM (fp8_ops.h).
void fp8_gemm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& a_scale_inv, const Tensor& b_scale_inv,
              const Tensor& bias, bool accumulate, bool fast_accumulation);
// Both layouts of x's quantisation in one pass (out (R, C) contiguous, out_t (C, R) with unit column stride and rows
// at any stride >= R that keeps them 16-byte aligned where R % 16 == 0, 4-byte aligned otherwise: a block of columns
// of a wider transpose), and, when partial_sums is defined, the
// column sums of each tile of rows into its column of partial_sums (C, fp8_pair_row_tiles(R)) float32: each column's
// partials contiguous, so that summing them is a row reduction (one warp reads a column's in a few loads). Only where
// fp8_pair_kernel_applies(x): 2-D, C a multiple of 64, R of 4, x 16-byte aligned.
bool fp8_pair_kernel_applies(const Tensor& x);
int64_t fp8_pair_row_tiles(int64_t rows);  // ceil(rows / 64): the column count of partial_sums
// The pair kernel described above, quantising act(x) (fp8_ops.h); an activation only where fp8_pair_kernel_activates.
// With h defined (act None): x * gelu'(h), the gradient through a GELU (fp8_quantize_pair_through_gelu), only where
// fp8_pair_kernel_through_gelu.
void fp8_quantize_pair(const Tensor& out, const Tensor& out_t, const Tensor& partial_sums, const Tensor& x,
                       const Tensor& scale, const Tensor& amax, internal::Fp8Activation act, const Tensor& h = {});
// Whether the pair kernel takes the gradient through a GELU itself: grad and h of one 16-bit dtype and shape, h
// contiguous and 16-byte aligned, grad taking the pair kernel, the erf form.
bool fp8_pair_kernel_through_gelu(const Tensor& grad, const Tensor& h, bool tanh_approximation);
// Whether the pair kernel applies an activation itself for this problem: a 16-bit x quantised to E4M3, without column
// sums (the frontend activates the others in a float32 pass first).
bool fp8_pair_kernel_activates(const Tensor& x, DType fp8_dtype, bool column_sums);
// out (C, R) contiguous = x (R, C)^T for FP8 codes, x contiguous; only where fp8_transpose_kernel_applies(x): C a
// multiple of 64, R of 16, x and out 16-byte aligned (out is a fresh tensor).
bool fp8_transpose_kernel_applies(const Tensor& x);
// The transpose described above, where fp8_transpose_kernel_applies(x).
void fp8_transpose(const Tensor& out, const Tensor& x);
// The delayed-scaling update, as the CPU's above.
void fp8_update_scales(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, const Tensor& scaled_max,
                       bool most_recent, const Tensor& scale_copy, const Tensor& scale_inv_copy);
}  // namespace kiln::cuda
