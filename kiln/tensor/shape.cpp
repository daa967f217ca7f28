#include "kiln/tensor/shape.h"

#include "kiln/tensor/error.h"

namespace kiln {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t sa = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t sb = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(sa == sb || sa == 1 || sb == 1, op, ": shapes ", a, " and ", b, " cannot be broadcast together (dim ", i,
               " of the broadcast shape has sizes ", sa, " and ", sb,
               "); sizes must be equal or 1 in each dim, counting from the last");
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

int64_t wrap_dim(int64_t dim, int64_t rank, std::string_view op) {
  const int64_t r = std::max<int64_t>(rank, 1);  // a 0-d tensor accepts dims -1 and 0
  KILN_CHECK(dim >= -r && dim < r, op, ": dim ", dim, " is out of range for a tensor of rank ", rank,
             " (expected a dim in [", -r, ", ", r - 1, "])");
  return dim < 0 ? dim + r : dim;
}

std::ostream& operator<<(std::ostream& os, const std::vector<int64_t>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os << ']';
}

}  // namespace kiln
