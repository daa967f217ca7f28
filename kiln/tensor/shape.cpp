#include "kiln/tensor/shape.h"

#include "kiln/tensor/checked_size.h"

#include "kiln/tensor/error.h"

namespace kiln {

int64_t numel(const Shape& shape) { return numel(shape, "numel"); }

int64_t numel(const Shape& shape, std::string_view op) {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t s : shape) {
    KILN_CHECK(s >= 0, op, ": negative size in shape ", shape, "; sizes must be >= 0");
    overflow |= __builtin_mul_overflow(n, s, &n);
  }
  // A zero size makes the product 0 even when an earlier partial product overflowed: such a shape is empty,
  // not too large, so only a nonzero product can be refused.
  if (overflow) {
    for (int64_t s : shape) {
      if (s == 0) return 0;
    }
    KILN_FAIL(op, ": shape ", shape, " has more than 2^63-1 elements; check the sizes (a size read from a ",
              "file header or computed from a product of sizes may be corrupt)");
  }
  return n;
}

int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t out = 0;
  KILN_CHECK(!__builtin_mul_overflow(a, b, &out), what, ": ", a, " * ", b,
             " overflows a 64-bit integer (more than 2^63-1); check the sizes");
  return out;
}

int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t out = 0;
  KILN_CHECK(!__builtin_add_overflow(a, b, &out), what, ": ", a, " + ", b,
             " overflows a 64-bit integer (more than 2^63-1); check the sizes and offsets");
  return out;
}

int64_t checked_nbytes(const Shape& shape, int64_t element_size, std::string_view op) {
  const int64_t n = numel(shape, op);
  int64_t bytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(n, element_size, &bytes), op, ": shape ", shape, " has ", n,
             " elements, whose size in bytes (", element_size, " each) exceeds 2^63-1");
  return bytes;
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    // Wraps only for shapes that numel() refuses; callers check the shape first.
    __builtin_mul_overflow(stride, std::max<int64_t>(shape[i], 1), &stride);
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
