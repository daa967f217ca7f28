// kiln/layers/cuda/hybrid_rows.h — rows of a table in page-locked host memory read by a GPU kernel, for
// nn::HybridEmbedding's cold tier (internal).
#pragma once

#include <cstdint>

#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

// out[i] = table[rows[i]] for each of the N rows: out (N, D...) contiguous on a GPU, table (R, D...) contiguous in
// page-locked host memory of out's dtype, rows (N) Int64 on out's device, each in [0, R) (not checked: the caller's
// own placement made them). The kernel reads the host rows through the memory's device mapping (no staging copy,
// no host work), on out's stream.
void gather_host_rows(const Tensor& out, const Tensor& table, const Tensor& rows);

// A lookup whose placement is mirrored on the GPU (nn::HybridEmbedding with mapped cold reads), with no host work:
// for each of the N ids, where = slot[id] (>= 0: hot slot, < 0: cold slot -where - 1); out[i] = hot[where] or
// cold[-where - 1] (cold read through its mapping); where_out[i] = where; ++counts[id] when counts is defined;
// tiers = {ids in the hot tier, ids in the cold tier}.
//   out (N, D) contiguous on the GPU, of hot's dtype; where_out (N) Int32 on it; tiers (2) Int64 on it (zeroed here);
//   ids (N) Int64 contiguous on it; slot (V) Int32 on it; hot (H, D) contiguous on it; cold (V - H, D) contiguous in
//   page-locked host memory; counts (V) Int32 on the GPU, or undefined.
// An id outside [0, V) is reported as kiln's index ops report theirs (kiln/tensor/cuda/index_errors.h: thrown at the
// next index op or synchronisation, under the name of the innermost IndexOpScope); its row of out is zeros, its
// where is kNoTier and it is in neither tier.
void placed_lookup(const Tensor& out, const Tensor& where_out, const Tensor& tiers, const Tensor& ids,
                   const Tensor& slot, const Tensor& hot, const Tensor& cold, const Tensor& counts);

// placed_lookup's where of a bad id.
inline constexpr int32_t kNoTier = INT32_MIN;

// The positions of where (N) Int32 split by tier, each in position order: hot_pos (Nh) and hot_slots (Nh) for the
// entries >= 0, cold_pos (Nc) and cold_slots (Nc, -where - 1) for the others but kNoTier; all Int64 on where's device,
// their sizes those that placed_lookup's tiers counted.
void split_by_tier(const Tensor& where, const Tensor& hot_pos, const Tensor& hot_slots, const Tensor& cold_pos,
                   const Tensor& cold_slots);

}  // namespace kiln::nn::cuda_impl
