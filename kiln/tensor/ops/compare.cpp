// Frontend of the compare ops: argument checks, promotion, output allocation, then the backend.
#include "kiln/tensor/ops.h"

#include "kiln/tensor/backend.h"

namespace kiln::ops {

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  throw NotImplementedError("ops::allclose: not implemented yet");
}

Tensor isclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  throw NotImplementedError("ops::isclose: not implemented yet");
}

bool equal(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::equal: not implemented yet");
}

}  // namespace kiln::ops
