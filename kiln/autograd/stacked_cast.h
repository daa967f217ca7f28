// kiln/autograd/stacked_cast.h — the 16-bit casts of several parameters as one stacked tensor, for one product.
//
//   Tensor w = autocast::stacked_cast({query->weight, key->weight, value->weight}, DType::BFloat16);  // (3H, H)
//
// A layer that runs the products of several parameters as one (attention's query, key and value projections) needs
// their casts stacked along dim 0. cat() of the three casts copies them every step, and the stack's gradient, split
// into views, is copied again into each .grad. stacked_cast keeps the parameters' 16-bit shadows (autocast.h,
// shadow::) as consecutive rows of one buffer: once the fused optimizer has written them, the stack is that buffer,
// and nothing is copied. Its gradient reaches each parameter in float32, split into pieces that own their rows
// (internal::split_owned), which .grad keeps without a copy. Before the first optimizer step, outside autocast
// regions, for parameters whose shadows another region changed, and while ops are recorded (capture::), it is the
// cat() of the casts, with the same values and gradients.
#pragma once

#include <vector>

#include "kiln/tensor/dtype.h"
#include "kiln/tensor/tensor.h"

namespace kiln::autocast {

// The casts of `params` (float32, dims after the first equal) to `dtype`, stacked along dim 0, differentiable with
// respect to each parameter.
Tensor stacked_cast(const std::vector<Tensor>& params, DType dtype);

namespace detail {
// The parameters' current shadows in `dtype`, when they are the consecutive rows of one buffer: that buffer (a plain
// tensor, no history). Otherwise undefined, and the shadows are planned as the rows of one buffer, which the
// optimizer's first shadow::buffer() call for one of them makes (no memory where no optimizer writes shadows).
// Undefined too where the casts would not be cached (cast_to): no region, grad mode off, or a parameter that is not a
// float32 leaf requiring grad, contiguous, on the first one's device.
Tensor stacked_shadow(const std::vector<Tensor>& params, DType dtype);
}  // namespace detail

}  // namespace kiln::autocast
