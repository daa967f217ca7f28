// kiln/tensor/cpu/strided_loop.h — walking several equally-shaped strided tensors together (backend-internal).
//
//   StridedWalker<2> w(shape, {out.strides(), in.strides()});
//   w.seek(begin);
//   for (int64_t i = begin; i < end; ++i, w.next()) out_p[w.offset(0)] = in_p[w.offset(1)];
//
// The walker keeps a row-major multi-index and one element offset per tensor, so moving to the next
// element costs O(1) amortised instead of a division per dim. Used by the index and sort kernels,
// which split a linear range over the thread pool and seek each chunk to its start.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kiln/tensor/shape.h"

namespace kiln::cpu {

template <int N>
class StridedWalker {
 public:
  StridedWalker(const Shape& shape, const std::array<Strides, N>& strides) : shape_(shape), strides_(strides) {
    index_.assign(shape_.size(), 0);
    offsets_.fill(0);
  }

  // Positions the walker at row-major element `linear`.
  void seek(int64_t linear) {
    offsets_.fill(0);
    for (size_t d = shape_.size(); d-- > 0;) {
      const int64_t size = shape_[d];
      index_[d] = size == 0 ? 0 : linear % size;
      linear = size == 0 ? 0 : linear / size;
      for (int t = 0; t < N; ++t) offsets_[t] += index_[d] * strides_[t][d];
    }
  }

  void next() {
    for (size_t d = shape_.size(); d-- > 0;) {
      ++index_[d];
      for (int t = 0; t < N; ++t) offsets_[t] += strides_[t][d];
      if (index_[d] < shape_[d]) return;
      for (int t = 0; t < N; ++t) offsets_[t] -= index_[d] * strides_[t][d];
      index_[d] = 0;
    }
  }

  int64_t offset(int t) const { return offsets_[t]; }
  const std::vector<int64_t>& index() const { return index_; }  // the current multi-index

 private:
  Shape shape_;
  std::array<Strides, N> strides_;
  std::vector<int64_t> index_;
  std::array<int64_t, N> offsets_;
};

// A tensor's shape and strides, with a 0-d tensor seen as 1-D of one element (kernels along a dim
// then need no special case for rank 0).
struct Geometry {
  Shape shape;
  Strides strides;
};
inline Geometry geometry_of(const Shape& shape, const Strides& strides) {
  if (shape.empty()) return {{1}, {1}};
  return {shape, strides};
}

// shape / strides without dim `dim` (the "rows" that a kernel along `dim` runs over).
inline std::vector<int64_t> erase_dim(std::vector<int64_t> v, int64_t dim) {
  v.erase(v.begin() + dim);
  return v;
}

}  // namespace kiln::cpu
