// kiln/layers/cuda/hybrid_rows.h — rows of a table in page-locked host memory read by a GPU kernel, for
// nn::HybridEmbedding's cold tier (internal).
#pragma once

#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

// out[i] = table[rows[i]] for each of the N rows: out (N, D...) contiguous on a GPU, table (R, D...) contiguous in
// page-locked host memory of out's dtype, rows (N) Int64 on out's device, each in [0, R) (not checked: the caller's
// own placement made them). The kernel reads the host rows through the memory's device mapping (no staging copy,
// no host work), on out's stream.
void gather_host_rows(const Tensor& out, const Tensor& table, const Tensor& rows);

}  // namespace kiln::nn::cuda_impl
