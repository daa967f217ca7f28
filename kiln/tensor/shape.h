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

int64_t numel(const Shape& shape);               // the product of the sizes; throws on a negative size or overflow
Strides contiguous_strides(const Shape& shape);  // row-major strides, in elements

// NumPy broadcasting of two shapes; throws kiln::Error naming `op` and both shapes when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op = "broadcast");

// Wraps a possibly negative dim into [0, rank); throws kiln::Error naming `op` when out of range.
// A 0-d tensor accepts dims -1 and 0, as in PyTorch.
int64_t wrap_dim(int64_t dim, int64_t rank, std::string_view op);

std::ostream& operator<<(std::ostream& os, const std::vector<int64_t>& v);  // "[2, 3, 4]"

}  // namespace kiln
