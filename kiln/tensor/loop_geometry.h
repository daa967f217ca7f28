// kiln/tensor/loop_geometry.h — the iteration order of N same-shaped operands, shared by every backend.
//
//   // out = a + b, where a and b already have out's shape (broadcast inputs carry stride 0):
//   LoopGeometry<3> g({out, a, b});
//   // g.sizes = innermost-first extents; g.strides[k][d] = operand k's byte stride along dim d.
//   // A contiguous (or all-channels-last) case gives g.ndim() == 1.
//
// The operands' dims are put in the order of operand 0's strides (innermost first), so that a
// channels-last output iterates its memory in order; dims of size 1 are dropped; then neighbouring dims
// that are contiguous across every operand are merged ("coalesced"). What a backend does with the
// result (runs over a thread pool, an offset calculator in a CUDA kernel) is its own business.
//
// Backend-internal: no Eigen, no thread pool, no CUDA; include it only from backend code.
#pragma once

#include <algorithm>  // std::reverse, std::swap
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln {

// A vector of dims that lives inline up to kInline entries (every realistic rank), so that planning a
// loop allocates nothing; higher ranks spill to the heap.
class DimVec {
 public:
  static constexpr size_t kInline = 8;  // entries kept without a heap allocation
  // The number of entries.
  size_t size() const { return size_; }
  // No entries.
  bool empty() const { return size_ == 0; }
  // The first entry (inline or on the heap).
  int64_t* data() { return heap_.empty() ? inline_.data() : heap_.data(); }
  // The first entry, read-only.
  const int64_t* data() const { return heap_.empty() ? inline_.data() : heap_.data(); }
  // Entry i, unchecked.
  int64_t& operator[](size_t i) { return data()[i]; }
  // Entry i, unchecked, by value.
  int64_t operator[](size_t i) const { return data()[i]; }
  // The last entry; the vector must not be empty.
  int64_t& back() { return data()[size_ - 1]; }
  // The last entry, by value; the vector must not be empty.
  int64_t back() const { return data()[size_ - 1]; }
  // Iteration over the entries.
  int64_t* begin() { return data(); }
  // One past the last entry.
  int64_t* end() { return data() + size_; }
  void push_back(int64_t v) {  // moves to the heap past kInline entries
    if (heap_.empty() && size_ < kInline) {
      inline_[size_++] = v;
      return;
    }
    if (heap_.empty()) heap_.assign(inline_.begin(), inline_.begin() + static_cast<std::ptrdiff_t>(size_));
    heap_.push_back(v);
    ++size_;
  }

 private:
  std::array<int64_t, kInline> inline_{};
  std::vector<int64_t> heap_;
  size_t size_ = 0;
};

// The coalesced geometry of N operands of one shape: sizes and byte strides, innermost dim first.
template <size_t N>
struct LoopGeometry {
  DimVec sizes;                   // (ndim), at least one dim
  std::array<DimVec, N> strides;  // (N, ndim) in bytes
  std::array<char*, N> base{};    // each operand's first element (data_ptr())
  int64_t numel = 0;              // elements of the shape

  explicit LoopGeometry(const std::array<Tensor, N>& ops) {
    const Shape& shape = ops[0].shape();
    numel = ops[0].numel();
    for (size_t k = 0; k < N; ++k) base[k] = static_cast<char*>(ops[k].data_ptr());
    // Dims of size 1 do not move any pointer: drop them.
    DimVec dims;
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

  // The number of dims after coalescing (at least 1).
  int ndim() const { return static_cast<int>(sizes.size()); }
  std::array<int64_t, N> inner_strides() const {  // each operand's byte stride along the innermost dim
    std::array<int64_t, N> s{};
    for (size_t k = 0; k < N; ++k) s[k] = strides[k][0];
    return s;
  }
};

}  // namespace kiln
