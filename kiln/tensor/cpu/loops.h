// kiln/tensor/cpu/loops.h — the strided iteration shared by the CPU copy and elementwise kernels.
//
//   // out = a + b (float32), where a and b already have out's shape (broadcast inputs carry stride 0):
//   cpu::for_each_run<3>({out, a, b}, [](char* const* p, const int64_t* s, int64_t n) {
//     for (int64_t i = 0; i < n; ++i)   // p[k] + i * s[k] is element i of operand k; s is in bytes
//       *(float*)(p[0] + i * s[0]) = *(float*)(p[1] + i * s[1]) + *(float*)(p[2] + i * s[2]);
//   });
//
// The operands' dims are put in the order of operand 0's strides (innermost first), so that a
// channels-last output iterates its memory in order, then dims that are contiguous across every
// operand are merged ("coalesced"). A contiguous tensor, or a channels-last one with channels-last
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

#include "kiln/tensor/cpu/parallel.h"  // parallel_for, kGrainSize
#include "kiln/tensor/tensor.h"

namespace kiln::cpu {

// The coalesced geometry of N operands of one shape: sizes and byte strides, innermost dim first.
template <size_t N>
struct LoopGeometry {
  std::vector<int64_t> sizes;                   // (ndim), at least one dim
  std::array<std::vector<int64_t>, N> strides;  // (N, ndim) in bytes
  std::array<char*, N> base{};
  int64_t numel = 0;

  explicit LoopGeometry(const std::array<Tensor, N>& ops) {
    const Shape& shape = ops[0].shape();
    numel = ops[0].numel();
    for (size_t k = 0; k < N; ++k) base[k] = static_cast<char*>(ops[k].data_ptr());
    // Dims of size 1 do not move any pointer: drop them.
    std::vector<int64_t> dims;
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != 1) dims.push_back(static_cast<int64_t>(d));
    // Innermost first, by operand 0's strides, ties broken by the next operands (stable insertion sort;
    // ranks are small). A dim whose strides are all equal keeps its logical order.
    auto inner_before = [&](int64_t x, int64_t y) {
      for (size_t k = 0; k < N; ++k) {
        const int64_t sx = ops[k].strides()[x], sy = ops[k].strides()[y];
        if (sx != sy) return sx < sy;
      }
      return x > y;
    };
    std::reverse(dims.begin(), dims.end());  // logical order, innermost first
    for (size_t i = 1; i < dims.size(); ++i)
      for (size_t j = i; j > 0 && inner_before(dims[j], dims[j - 1]); --j) std::swap(dims[j], dims[j - 1]);
    for (int64_t d : dims) {
      const int64_t size = shape[d];
      bool merge = !sizes.empty();
      for (size_t k = 0; k < N && merge; ++k) {
        const int64_t stride = ops[k].strides()[d] * static_cast<int64_t>(ops[k].element_size());
        merge = stride == strides[k].back() * sizes.back();
      }
      if (merge) {
        sizes.back() *= size;
        continue;
      }
      sizes.push_back(size);
      for (size_t k = 0; k < N; ++k)
        strides[k].push_back(ops[k].strides()[d] * static_cast<int64_t>(ops[k].element_size()));
    }
    if (sizes.empty()) {  // 0-d, or all sizes 1: one element
      sizes.push_back(1);
      for (size_t k = 0; k < N; ++k) strides[k].push_back(0);
    }
  }

  int ndim() const { return static_cast<int>(sizes.size()); }
  std::array<int64_t, N> inner_strides() const {
    std::array<int64_t, N> s{};
    for (size_t k = 0; k < N; ++k) s[k] = strides[k][0];
    return s;
  }
};

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
