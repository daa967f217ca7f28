// kiln/tensor/fp8_ops.h — the FP8 compute primitives (kiln::internal): quantisation with a fused amax, the scaled
// FP8 matrix product, and the delayed-scaling update of the scales. The FP8 Linear layer is built on them; programs
// do not call them directly.
//
//   amp::Fp8ScalingState st = amp::Fp8ScalingState::for_linear(recipe, dev);   // 0: input, 1: weight, 2: grad
//   Tensor x8 = internal::fp8_quantize(x, DType::Float8_e4m3fn, st.scale().narrow(0, 0, 1),
//                                      st.amax_history().select(0, 0).narrow(0, 0, 1));      // (M, K)
//   Tensor w8 = internal::fp8_quantize(w, DType::Float8_e4m3fn, st.scale().narrow(0, 1, 1),
//                                      st.amax_history().select(0, 0).narrow(0, 1, 1));      // (N, K)
//   Tensor y = internal::fp8_gemm(x8, w8, st.scale_inv().narrow(0, 0, 1), st.scale_inv().narrow(0, 1, 1),
//                                 DType::BFloat16, bias);                                     // (M, N)
//   internal::fp8_update_scales(history, scale, scale_inv, scaled_max, false);  // what st.update() runs
//
// They run on the CPU (the reference semantics, used by CI) and on CUDA (one kernel each; cuBLASLt), and none reads a
// device value on the host, so a training step that uses them can be captured into a CUDA graph.
#pragma once

#include <utility>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::internal {

// An activation applied to the values as they are quantised (fp8_quantize, fp8_quantize_pair): a transformer MLP's
// GELU, fused into the quantisation of the next product's input. The values quantised are act(x) computed in float32
// from x's values (not rounded to x's dtype first), with kiln's gelu (both forms: gelu(x, tanh_approximation)); the
// amax and column sums are those of act(x).
enum class Fp8Activation { None, Gelu, GeluTanh };

// saturate_to_fp8(x * scale) in fp8_dtype (Float8_e4m3fn or Float8_e5m2), x's shape; with transpose, x must be 2-D
// (R, C) and the result is the contiguous (C, R) transpose (the K-major copy an FP8 GEMM of the backward pass needs),
// made in the same pass. In the same pass amax[0] = max(amax[0], max |x|).
//
// - x: float32, bfloat16 or float16, contiguous. scale, amax: 1-element float32 tensors on x's device (views such
//   as `state.scale().narrow(0, j, 1)` and an element of the amax history's row 0 are fine: only their element is
//   read or written).
// - x * scale is computed in float32 and rounded once to the FP8 format as every cast into FP8 is (float8.h): to
//   nearest even, finite values beyond the largest finite one and ±inf saturate to ±max (448 for E4M3FN, 57344 for
//   E5M2: never an E5M2 infinity), NaN becomes the NaN code 0x7f, values below half the smallest subnormal ±0.
// - amax follows Fp8ScalingState::record_amax: a NaN in x makes amax[0] NaN (and a NaN amax[0] stays NaN), an inf
//   makes it inf. amax[0] is expected to hold a value >= 0 or NaN, as an amax history does.
// - Empty x: an empty result; amax is left as it is.
// - act: Fp8Activation above.
// kiln::Error (nothing written) for a non-float x, a non-FP8 dtype, scale or amax not 1-element float32 on x's
// device, a non-contiguous x, transpose of a tensor that is not 2-D.
Tensor fp8_quantize(const Tensor& x, DType fp8_dtype, const Tensor& scale, const Tensor& amax, bool transpose = false,
                    Fp8Activation act = Fp8Activation::None);

// {fp8_quantize(x, ...), fp8_quantize(x, ..., true)} for a 2-D x (R, C), made in one pass over x where the GPU kernel
// takes the shape (C a multiple of 64, R of 4), with the same codes and the same amax update. column_sums: null, or
// it receives the float32 sums of x's columns (C) (a bias gradient: the output gradient's rows summed), from the
// same pass on the GPU (partial sums per tile of 64 rows, then summed: the same value on every run). act: as
// fp8_quantize's; the GPU applies it in the same pass for a 16-bit x quantised to E4M3 without column sums (a GELU
// output's quantisation in a forward pass), elsewhere in a float32 pass first. Errors as fp8_quantize's, and for an
// x that is not 2-D.
std::pair<Tensor, Tensor> fp8_quantize_pair(const Tensor& x, DType fp8_dtype, const Tensor& scale, const Tensor& amax,
                                            Tensor* column_sums = nullptr, Fp8Activation act = Fp8Activation::None);

// fp8_quantize_pair of the gradient that reaches a GELU's input: the values quantised (and their amax and column
// sums) are grad * gelu'(h) in float32, where h is the GELU's input and grad the gradient of its output (2-D, one
// shape, float32, bfloat16 or float16): kiln's gelu_backward of the two in float32. A transformer MLP's backward
// quantises the first product's output gradient so without writing it. On the GPU one pass for 16-bit grad and h that
// the pair kernel takes (erf form); elsewhere gelu_backward in float32 first. Errors as fp8_quantize_pair's, and for
// h of another shape, dtype or device.
std::pair<Tensor, Tensor> fp8_quantize_pair_through_gelu(const Tensor& grad, const Tensor& h, bool tanh_approximation,
                                                         DType fp8_dtype, const Tensor& scale, const Tensor& amax,
                                                         Tensor* column_sums = nullptr);

// fp8_quantize_pair(cat(parts, 0), ...) without writing the concatenation: parts (R_i, C), 2-D, of one floating
// dtype and device, quantised into one (sum R_i, C) result and its (C, sum R_i) transpose with one amax over all (the
// weights of several Linears that one scaling state scales, such as BERT's query, key and value, multiplied as one).
// On the GPU one pass per part where each part takes the pair kernel and has a multiple of 16 rows; elsewhere the
// concatenation is made first. Errors as fp8_quantize_pair's, and for an empty list or parts that do not agree.
std::pair<Tensor, Tensor> fp8_quantize_pair_of_rows(const std::vector<Tensor>& parts, DType fp8_dtype,
                                                    const Tensor& scale, const Tensor& amax);

// The contiguous (C, R) transpose of FP8 codes x (R, C), the same codes (a product's K-major operand made from codes
// already written, such as a layer norm's output quantised in its own pass). On the GPU one tiled kernel where C is a
// multiple of 64 and R of 16, else a strided copy. kiln::Error for x that is not a 2-D FP8 tensor.
Tensor fp8_transpose(const Tensor& x);

// out = (a_scale_inv * float(a)) @ (b_scale_inv * float(b))^T (+ bias) (+ *accumulate_into), out (M, N) row-major.
//
// - a (M, K), b (N, K): FP8, contiguous (K contiguous in both: the "TN" layout cuBLASLt's FP8 kernels need, so a
//   Linear's weight (out_features, in_features) is b as it is). Formats: e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3;
//   e5m2 x e5m2 is refused (cuBLASLt has no kernel for it). M, N and K must be multiples of 16 (FP8 tensor cores).
// - a_scale_inv, b_scale_inv: 1-element float32 tensors on the operands' device (the scaling state's scale_inv),
//   read by the GPU (no host sync).
// - out_dtype: BFloat16, Float16 or Float32. bias: undefined or (N) in out_dtype, added to every row.
// - accumulate_into: null, or a contiguous float32 (M, N) tensor (out_dtype must then be Float32): the product (and
//   bias) is added into it in place (beta = 1, for weight gradients summed in float32) and it is returned.
// Products of FP8 values are exact in float32; the CPU sums them in float64 and rounds once; cuBLASLt sums in float32
// (on Hopper: its tensor cores' narrower accumulator within chunks of K, promoted to float32 between them, unless
// fast_accumulation). NaN and E5M2 infinities propagate by IEEE rules.
// On CUDA it needs compute capability 8.9 or newer (Ada, Hopper): kiln::Error on older GPUs, never a fallback.
// - fast_accumulation: on CUDA, keep the partial sums in the tensor cores' accumulator for the whole of K
//   (CUBLASLT_MATMUL_DESC_FAST_ACCUM), which is faster and less precise; the choice of FP8 training recipes for the
//   forward product (the output gradients' products keep the promotion). The CPU ignores it.
Tensor fp8_gemm(const Tensor& a, const Tensor& b, const Tensor& a_scale_inv, const Tensor& b_scale_inv, DType out_dtype,
                const Tensor& bias = {}, Tensor* accumulate_into = nullptr, bool fast_accumulation = false);

// The delayed-scaling update of an Fp8ScalingState (Fp8ScalingState::update()) in one kernel: for each tracked
// tensor j (a column of the history), with c = amax_history[0, j]:
//
// - seen = (c != 0): the column saw data since the last update (a NaN c counts as seen).
// - amax = c when most_recent, else the maximum over the window, max_i amax_history[i, j] with NaN entries read as
//   0 (one NaN step does not poison the window).
// - a seen column's history rolls by one step: row 0 becomes 0, rows 1 .. L-2 take rows 2 .. L-1, row L-1 takes the
//   old row 0 (with L == 1 the single row becomes 0). A column not seen keeps its history.
// - scale[j] = scaled_max[j] / amax (float32 division) where the column was seen and amax is finite and > 0, else
//   scale[j] keeps its value; a scale that is ±inf (an overflowing division, or an infinite old scale) becomes
//   FLT_MAX. scale_inv[j] = 1 / scale[j] (float32), for every column.
//
// - amax_history: (L, N) float32 contiguous, L >= 1; scale, scale_inv, scaled_max: (N) float32 contiguous; all on
//   one device. amax_history, scale and scale_inv are written in place; scaled_max (fp8_max / 2^margin) is read.
// - scale_copy, scale_inv_copy: undefined, or (N) float32 tensors on that device, of any stride, apart from the
//   others: they receive copies of the new scale and scale_inv from the same pass (a snapshot that later updates do
//   not change, as an FP8 layer keeps for its backward).
// On CUDA this is one launch on the current stream that reads nothing on the host (graph-capturable); the CPU and
// CUDA results are equal bit for bit. kiln::Error (nothing written) for an undefined tensor, a dtype other than
// float32, shapes that do not agree, a non-contiguous tensor, tensors on different devices, a copy that shares
// memory with the state.
void fp8_update_scales(const Tensor& amax_history, const Tensor& scale, const Tensor& scale_inv,
                       const Tensor& scaled_max, bool most_recent, const Tensor& scale_copy = {},
                       const Tensor& scale_inv_copy = {});

}  // namespace kiln::internal
