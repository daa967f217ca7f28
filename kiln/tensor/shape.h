// kiln/tensor/shape.h — sizes and strides, and the small helpers every op uses on them.
//
//   Shape s = {2, 3, 4};   numel(s) == 24;   contiguous_strides(s) == {12, 4, 1}
//   broadcast_shapes({2, 1, 4}, {3, 1}) == {2, 3, 4}
//   std::cout << s;        // "[2, 3, 4]"
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string_view>
#include <vector>

namespace kiln {

using Shape = std::vector<int64_t>;    // sizes, outermost first
using Strides = std::vector<int64_t>;  // in elements, not bytes

// Product of the sizes. Throws kiln::Error naming `op` and the shape when a size is negative or the product
// exceeds 2^63-1 (DESIGN.md rule 11: sizes from user input or files are checked, never wrapped).
int64_t numel(const Shape& shape, std::string_view op = "numel");
Strides contiguous_strides(const Shape& shape);

// Checked int64 arithmetic for sizes, byte counts and offsets that come from user input or a file. Each throws
// kiln::Error "<what>: <a> * <b> overflows int64 ..." instead of wrapping; `what` names the op or the file.
int64_t checked_mul(int64_t a, int64_t b, std::string_view what);
int64_t checked_add(int64_t a, int64_t b, std::string_view what);
// numel(shape) * element_size bytes, checked; the message names `op`, the shape and the element size.
int64_t checked_nbytes(const Shape& shape, int64_t element_size, std::string_view op);
// Non-throwing forms for callers that build their own message: false on overflow.
inline bool mul_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
inline bool add_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }

// NumPy broadcasting of two shapes; throws kiln::Error naming `op` and both shapes when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op = "broadcast");

// Wraps a possibly negative dim into [0, rank); throws kiln::Error naming `op` when out of range.
// A 0-d tensor accepts dims -1 and 0, as in PyTorch.
int64_t wrap_dim(int64_t dim, int64_t rank, std::string_view op);

std::ostream& operator<<(std::ostream& os, const std::vector<int64_t>& v);

}  // namespace kiln
