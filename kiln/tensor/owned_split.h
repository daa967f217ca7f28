// kiln/tensor/owned_split.h — a tensor nothing else holds, split into pieces along dim 0 that each own their part.
//
//   std::vector<Tensor> parts = internal::split_owned(std::move(g), {H, H, H});  // three (H, ...) tensors
//
// A gradient computed for several parameters at once (one product for a stack of weights) comes back as one tensor;
// its pieces are the parameters' gradients. Views of it would share one Storage, and AccumulateGrad copies a gradient
// that shares its storage (an in-place update of one .grad must not reach another tensor). The pieces split_owned
// makes are tensors of their own, each with a Storage over its rows of the memory: disjoint, so no write to one can
// reach another, and kept as .grad without a copy. The memory is freed when the last piece is.
#pragma once

#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::internal {

// t split along dim 0 into pieces of rows[0], rows[1], ... rows (summing to t.size(0)). When t is contiguous and
// exclusively owned (the caller passes the only reference to it, and its storage is held by t alone),
// each piece has a Storage of its own over its part of t's memory; otherwise the pieces are views of t (narrow).
std::vector<Tensor> split_owned(Tensor t, const std::vector<int64_t>& rows);

}  // namespace kiln::internal
