// kiln/tensor/reduce_geometry.h — the plan of a reduction, shared by the CPU and CUDA backends
// (backend-internal).
//
//   ReduceGeometry g = plan_reduction(in.sizes(), in.strides(), out.strides(), reduce_mask);
//   // g.n_out outputs, each reducing g.n_red inputs; offsets via g.in_offset(o) + g.red_offset(r)
//
// Size-1 dims are dropped, the kept and the reduced dims are each sorted by input stride (largest
// first) and merged where two of them step like one. A full reduction keeps one kept dim {1}, and
// neither list is ever empty.
#pragma once

#include <algorithm>  // std::stable_sort
#include <cstdint>
#include <vector>

#include "kiln/tensor/shape.h"

namespace kiln {

// The offset of linear index i over the first n dims of (sizes, strides), row-major.
inline int64_t offset_of(int64_t i, const int64_t* sizes, const int64_t* strides, size_t n) {
  int64_t off = 0;
  for (size_t d = n; d-- > 0;) {
    off += (i % sizes[d]) * strides[d];
    i /= sizes[d];
  }
  return off;
}

// What plan_reduction returns: the kept (output) and reduced dims, coalesced, with their strides in elements.
struct ReduceGeometry {
  Shape kept_sizes;  // coalesced kept dims, largest input stride first (never empty: {1} for a full reduction)
  // The kept dims' input strides (kept_in) and output strides (kept_out).
  Strides kept_in, kept_out;  // kept_out: the output's strides along the kept dims
  Shape red_sizes;            // coalesced reduced dims, largest input stride first (never empty)
  Strides red_in;             // the reduced dims' input strides
  // The number of outputs (n_out) and of inputs each reduces (n_red).
  int64_t n_out = 1, n_red = 1;  // n_red: the inputs each output reduces

  // Output offset of output o (row-major over the kept dims).
  int64_t out_offset(int64_t o) const { return offset_of(o, kept_sizes.data(), kept_out.data(), kept_sizes.size()); }
  // Input offset where output o's reduced elements start.
  int64_t in_offset(int64_t o) const { return offset_of(o, kept_sizes.data(), kept_in.data(), kept_sizes.size()); }
  // Input offset of reduced position r (row-major over the reduced dims), relative to the output's start.
  int64_t red_offset(int64_t r) const { return offset_of(r, red_sizes.data(), red_in.data(), red_sizes.size()); }
  // True when the reduced elements of an output are a contiguous run of the input.
  bool inner_contiguous() const { return red_in.back() == 1; }
  // True when the innermost kept dim is contiguous in the input (the column path applies).
  bool columns_contiguous() const { return kept_in.back() == 1 && kept_sizes.back() > 1; }
};

// Plans a reduction of a tensor (sizes, in_strides) into a keepdim-form output with out_strides.
inline ReduceGeometry plan_reduction(const Shape& sizes, const Strides& in_strides, const Strides& out_strides,
                                     const std::vector<bool>& reduce) {
  struct D {
    int64_t size, in, out;
  };
  std::vector<D> kept, red;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    (reduce[d] ? red : kept).push_back({sizes[d], in_strides[d], reduce[d] ? 0 : out_strides[d]});
  }
  auto by_stride = [](const D& a, const D& b) { return a.in > b.in; };
  std::stable_sort(kept.begin(), kept.end(), by_stride);
  std::stable_sort(red.begin(), red.end(), by_stride);
  // Merge an outer dim into the next inner one when together they step like a single dim.
  auto coalesce = [](std::vector<D>& dims, bool check_out) {
    std::vector<D> merged;
    for (const D& d : dims) {
      if (!merged.empty() && merged.back().in == d.in * d.size && (!check_out || merged.back().out == d.out * d.size)) {
        merged.back() = {merged.back().size * d.size, d.in, d.out};
      } else {
        merged.push_back(d);
      }
    }
    if (merged.empty()) merged.push_back({1, 0, 0});
    dims = std::move(merged);
  };
  coalesce(kept, true);
  coalesce(red, false);
  ReduceGeometry g;
  for (const D& d : kept) {
    g.kept_sizes.push_back(d.size);
    g.kept_in.push_back(d.in);
    g.kept_out.push_back(d.out);
    g.n_out *= d.size;
  }
  for (const D& d : red) {
    g.red_sizes.push_back(d.size);
    g.red_in.push_back(d.in);
    g.n_red *= d.size;
  }
  return g;
}

}  // namespace kiln
