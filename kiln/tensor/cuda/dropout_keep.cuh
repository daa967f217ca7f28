// kiln/tensor/cuda/dropout_keep.cuh — the keep/drop decisions of a fused dropout (backend-internal), shared by
// internal::dropout's kernels (random.cu) and the layers' kernels that fuse dropout (layers/cuda/layer_norm.cu), so
// that every kernel maps an element to the same Philox word:
//
//   bool kept[4];
//   keep_flags<float, 4>(kept, draw, philox::keep_threshold(1 - p), first);  // elements first .. first + 3
//
// Element i (row-major) of a draw is kept exactly when a Bernoulli(1 - p) draw from the same state would give 1:
// word i % 4 of Philox block i / 4 (float32 and 16-bit numbering), words 2 (i % 2), +1 of block i / 2 (float64).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/tensor/generator.h"  // GeneratorState, philox::block, keep_float, keep_double

namespace kiln::cuda {

// The keep/drop decisions of the V consecutive elements from `first` (a multiple of V) of a draw, as a Bernoulli
// draw of probability 1 - p would make them: one Philox block per 4 elements (float32/16-bit numbering) or per 2
// (float64), so V is a multiple of that. T is the dropped tensor's element type (it picks the numbering).
template <typename T, int V>
__device__ __forceinline__ void keep_flags(bool (&kept)[V], const GeneratorState& draw, philox::KeepThreshold keep,
                                           uint64_t first) {
  uint32_t w[4];
  if constexpr (std::is_same_v<T, double>) {
    static_assert(V % 2 == 0);
#pragma unroll
    for (int b = 0; b < V / 2; ++b) {
      philox::block(draw.seed, first / 2 + b, draw.offset, w);
      kept[2 * b] = philox::keep_double(w[0], w[1], keep.below53);
      kept[2 * b + 1] = philox::keep_double(w[2], w[3], keep.below53);
    }
  } else {
    static_assert(V % 4 == 0);
#pragma unroll
    for (int b = 0; b < V / 4; ++b) {
      philox::block(draw.seed, first / 4 + b, draw.offset, w);
#pragma unroll
      for (int j = 0; j < 4; ++j) kept[4 * b + j] = philox::keep_float(w[j], keep.below24);
    }
  }
}

}  // namespace kiln::cuda
