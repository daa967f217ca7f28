// kiln/tensor/cpu/loops.h — the strided iteration shared by the CPU copy and elementwise kernels.
//
//   // out = a + b (float32), where a and b already have out's shape (broadcast inputs carry stride 0):
//   cpu::for_each_run<3>({out, a, b}, [](char* const* p, const int64_t* s, int64_t n) {
//     for (int64_t i = 0; i < n; ++i)   // p[k] + i * s[k] is element i of operand k; s is in bytes
//       *(float*)(p[0] + i * s[0]) = *(float*)(p[1] + i * s[1]) + *(float*)(p[2] + i * s[2]);
//   });
//
// The operands' dims are ordered and coalesced by LoopGeometry (kiln/tensor/loop_geometry.h, shared with
// the CUDA backend). A contiguous tensor, or a channels-last one with channels-last
// inputs, becomes a single run; the kernel then sees long runs with stride == element size and can
// hand them to Eigen. The flat range is split over the thread pool in chunks of at least kGrainSize
// elements; a chunk may start or end in the middle of a run.
//
// Backend-internal: include it only from tensor/cpu/*.cpp.
#pragma once

#include <algorithm>  // std::min, std::swap
#include <array>
#include <cstdint>
#include <vector>

#include "kiln/tensor/cpu/parallel.h"   // parallel_for, kGrainSize
#include "kiln/tensor/loop_geometry.h"  // LoopGeometry
#include "kiln/tensor/tensor.h"

namespace kiln::cpu {

using kiln::LoopGeometry;  // loop_geometry.h: dim ordering and coalescing, shared with the CUDA backend

// Calls fn(ptrs, strides, n) over runs of the flat range [begin, end) of `g`: element i of a run of
// operand k is at ptrs[k] + i * strides[k] (bytes); strides are those of the innermost coalesced dim.
template <size_t N, typename F>
void for_each_run_in_range(const LoopGeometry<N>& g, int64_t begin, int64_t end, const F& fn) {
  const int ndim = g.ndim();
  const std::array<int64_t, N> inner = g.inner_strides();
  std::array<char*, N> ptrs = g.base;
  if (ndim == 1) {  // the contiguous (or single-strided) fast path: one run
    for (size_t k = 0; k < N; ++k) ptrs[k] += begin * inner[k];
    fn(ptrs.data(), inner.data(), end - begin);
    return;
  }
  std::vector<int64_t> index(ndim);  // innermost first
  int64_t rest = begin;
  for (int d = 0; d < ndim; ++d) {
    index[d] = rest % g.sizes[d];
    rest /= g.sizes[d];
    for (size_t k = 0; k < N; ++k) ptrs[k] += index[d] * g.strides[k][d];
  }
  for (int64_t pos = begin; pos < end;) {
    const int64_t n = std::min(g.sizes[0] - index[0], end - pos);
    fn(ptrs.data(), inner.data(), n);
    pos += n;
    index[0] += n;
    for (size_t k = 0; k < N; ++k) ptrs[k] += n * inner[k];
    // Carry into the outer dims.
    for (int d = 0; d + 1 < ndim && index[d] == g.sizes[d]; ++d) {
      index[d] = 0;
      ++index[d + 1];
      for (size_t k = 0; k < N; ++k) ptrs[k] += g.strides[k][d + 1] - g.sizes[d] * g.strides[k][d];
    }
  }
}

// Runs fn over every element of a geometry, spread over the thread pool.
template <size_t N, typename F>
void for_each_run(const LoopGeometry<N>& g, const F& fn, int64_t grain = kGrainSize) {
  if (g.numel == 0) return;
  parallel_for(0, g.numel, grain, [&](int64_t begin, int64_t end) { for_each_run_in_range(g, begin, end, fn); });
}

// Runs fn over every element of the operands (operand 0 is the output), spread over the thread pool.
template <size_t N, typename F>
void for_each_run(const std::array<Tensor, N>& operands, const F& fn, int64_t grain = kGrainSize) {
  for_each_run(LoopGeometry<N>(operands), fn, grain);
}

}  // namespace kiln::cpu
