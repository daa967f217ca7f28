// kiln/layers/linear_backward.h — internal to kiln_layers (not installed API): the gradients of a product
// y = x2 w^T + b that nn::linear's fused nodes compute in backward (functional.cpp's AutocastLinearFunction, mlp.cpp's
// MlpFunction).
//
//   auto [dw, db] = detail::linear_weight_bias_grads(g2, x2, want_w, want_b, DType::Float32, DType::Float32);
//   Tensor dx = detail::linear_input_grad(g2, w, ctx.gradient_sum(0), x_shape, DType::Float32);
#pragma once

#include <utility>

#include "kiln/tensor/tensor.h"

namespace kiln::nn::detail {

// The gradients of w (out, in) in w_dtype and of b (out) in b_dtype from g2 (M, out), the output gradient's rows, and
// x2 (M, in), the product's input; each undefined where not wanted. b's is the column sums of g2 that the op after the
// product offered where it summed them as it wrote the gradient (autograd::take_column_sums: a layer norm's
// backward), else the product's own (internal::mm_with_row_sums, with w's), else a reduction.
std::pair<Tensor, Tensor> linear_weight_bias_grads(const Tensor& g2, const Tensor& x2, bool want_w, bool want_b,
                                                   DType w_dtype, DType b_dtype);

// x's gradient g2 @ w (g2 (M, out), w (out, in)) in x_shape: for a float32 x, added in place into `sum`, the float32
// sum of x's other gradients the engine offers (a residual connection's), where that is dense and of x's shape, and
// then `sum` itself; else a new tensor in x_dtype (a widening product for 16-bit factors).
Tensor linear_input_grad(const Tensor& g2, const Tensor& w, const Tensor& sum, const Shape& x_shape, DType x_dtype);

}  // namespace kiln::nn::detail
