// kiln/tensor/checked_size.h — checked arithmetic for sizes that come from user input or a file (DESIGN.md
// rule 11): element counts, byte sizes and offsets are checked for overflow, never wrapped.
//
//   const int64_t n = numel(shape, "zeros");            // "zeros: shape [4294967296, 4294967296, 4] has more
//                                                        //  than 2^63-1 elements ..." instead of 0
//   const int64_t bytes = checked_nbytes(shape, 4, "Embedding");
//   const int64_t end = checked_add(offset, length, "model.bin: tensor 'w'");
//   int64_t p; if (mul_overflows(a, b, &p)) { ... }     // for callers that build their own message
#pragma once

#include <cstdint>
#include <string_view>

#include "kiln/tensor/shape.h"

namespace kiln {

// Product of the sizes. Throws kiln::Error naming `op` and the shape when a size is negative or the product
// exceeds 2^63-1. A shape with a zero size has 0 elements however large the others are. numel(shape) is the
// same check with op "numel".
int64_t numel(const Shape& shape, std::string_view op);

// a * b and a + b, or kiln::Error "<what>: <a> * <b> overflows a 64-bit integer ..."; `what` names the op or
// the file and what is being computed.
int64_t checked_mul(int64_t a, int64_t b, std::string_view what);
int64_t checked_add(int64_t a, int64_t b, std::string_view what);  // a + b, or the same kind of error

// numel(shape) * element_size bytes, checked; the message names `op`, the shape and the element size.
int64_t checked_nbytes(const Shape& shape, int64_t element_size, std::string_view op);

// The non-throwing forms: true on overflow (then *out is the wrapped value and must not be used).
inline bool mul_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
// *out = a + b; true when it overflows.
inline bool add_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }

}  // namespace kiln
