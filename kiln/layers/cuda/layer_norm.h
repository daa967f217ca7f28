// kiln/layers/cuda/layer_norm.h — layer norm on the GPU: one kernel forward, two backward (internal).
//
// x is viewed as rows (R, D) of the normalised size D = prod(normalized_shape); statistics per row in
// float32 (float64 for float64 input). weight and bias (D) have x's dtype and may be undefined.
#pragma once

#include <optional>

#include "kiln/tensor/generator.h"  // GeneratorState: the draw of a fused dropout
#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

struct LayerNormSaved {
  Tensor y;      // x's shape and dtype (the residual's with a residual)
  Tensor mean;   // (R), float32 (float64 for float64 x)
  Tensor rstd;   // (R), 1 / sqrt(var + eps)
  Tensor sum;    // with a residual: x + residual, the layer's input for backward
  Tensor keep;   // with a dropout: (R, 32) Int32, bit j of word l of row r set when element l + 32 j of the row stayed
  Tensor y_low;  // y in y_also_in as well, when asked for and written (see layer_norm_forward)
  bool fp8_written = false;  // the forward pass wrote Fp8Output's codes and amax (see layer_norm_forward)
};
// y's FP8 codes, for the FP8 product that reads y next: codes (rows, d) Float8_e4m3fn contiguous (the kernel writes
// E4M3, the format of every forward tensor; codes of another dtype are left to the caller), as
// internal::fp8_quantize(y, Float8_e4m3fn, scale, amax) writes them (and amax[0] = max(amax[0], max |y|)).
struct Fp8Output {
  Tensor codes;
  Tensor scale;  // 1-element float32 on x's device
  Tensor amax;   // 1-element float32 on x's device
};
// A dropout of x fused before the residual add: p in (0, 1), and the generator's draw (internal::draw_for) that
// internal::dropout would have taken.
struct FusedDropout {
  double p = 0;
  GeneratorState draw;
};
// With `residual` (x's shape, x's dtype or Float32 for a 16-bit x; D <= 1024): normalises x + residual, summed in
// float32 (exactly as a cast of x and an add would), and returns that sum too. With `dropout` too (not Float64):
// normalises dropout(x) + residual, where dropout(x) has exactly internal::dropout(x, p)'s mask and values for the same
// draw (element i of x, row-major, kept by the Philox word internal::dropout's kernels give it), and returns the keep
// bits.
// y_also_in (BFloat16 or Float16): y written in that dtype too, from the same values (y cast as a cast would round
// it), where y is float32 and D <= 1024 (else y_low stays undefined): the cast autocast would make of y for the next
// product, in the same pass.
// fp8 (null: none): y's FP8 codes written into fp8->codes in the same pass (and fp8->amax updated), where y is float32
// and the row kernel moves groups of 4 (D <= 1024, D % 4 == 0, aligned pointers): fp8_written says whether it did; the
// caller quantises y itself where not.
LayerNormSaved layer_norm_forward(const Tensor& x, int64_t d, const Tensor& weight, const Tensor& bias, double eps,
                                  const Tensor& residual = {}, const FusedDropout* dropout = nullptr,
                                  std::optional<DType> y_also_in = std::nullopt, const Fp8Output* fp8 = nullptr);

struct LayerNormGrads {
  Tensor dx, dweight, dbias;  // undefined where not asked for
  Tensor dx_low;              // dx in dx_also_in as well, when asked for
  Tensor dx_sums;             // (d) float32: the column sums of x's gradient as stored (dx_low where written, else
                              // dx), when asked for (dx_sums) and the row kernel moved groups of 4; else undefined
};
// dx_also_in (BFloat16 or Float16, for Float32 x with D <= 1024): also write dx in that dtype, from the same values.
// With `keep` (forward's keep bits, D <= 1024, not Float64) and dx_also_in (which may then be x's dtype): dx_low is
// the gradient of the dropout's input instead, dx rounded to dx_also_in times the dropout's mask (0 or
// 1 / (1 - p) rounded to dx_also_in), rounded once: what internal::dropout's backward would make of it.
// dx_sums: the row kernel also sums the columns of x's gradient as it stores them (dx_sums; the bias gradient of the
// Linear whose output x is), where rows move in groups of 4 (D % 4 == 0, aligned pointers).
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, int64_t d, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, bool need_dx, bool need_dweight, bool need_dbias,
                                   std::optional<DType> dx_also_in = std::nullopt, const Tensor& keep = {},
                                   double p = 0, bool dx_sums = false);

}  // namespace kiln::nn::cuda_impl
