// kiln/layers/cuda/attention_rows.h — the rows of the fused attention's output that no key may attend to
// (internal).
#pragma once

#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

// Zeroes, in place, the rows of out (B, H, L, E) (last dim of stride 1) whose flag in dead (B|1, H|1, L|1, 1), Bool,
// is set, and touches no other row: the cost is one read of the flags, not a pass over out. With stats, the
// (B, H, L, 1) contiguous Float32 softmax statistics of out, a flagged row's entry there becomes +inf in the same
// kernel.
void zero_flagged_rows(const Tensor& out, const Tensor& dead, const Tensor& stats = {});

}  // namespace kiln::nn::cuda_impl
