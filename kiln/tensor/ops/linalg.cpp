// Frontend of the linalg ops: argument checks, promotion, output allocation, then the backend.
#include "kiln/tensor/ops.h"

#include "kiln/tensor/backend.h"

namespace kiln::ops {

Tensor matmul(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::matmul: not implemented yet");
}

Tensor mm(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::mm: not implemented yet");
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::bmm: not implemented yet");
}

Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) {
  throw NotImplementedError("ops::addmm: not implemented yet");
}

Tensor dot(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::dot: not implemented yet");
}

Tensor outer(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::outer: not implemented yet");
}

}  // namespace kiln::ops
