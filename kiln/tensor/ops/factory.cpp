// Frontend of the factory ops: argument checks, promotion, output allocation, then the backend.
#include "kiln/tensor/ops.h"

#include "kiln/tensor/backend.h"

namespace kiln::ops {

Tensor empty(const Shape& shape, const TensorOptions& options) {
  throw NotImplementedError("ops::empty: not implemented yet");
}

Tensor empty_strided(const Shape& shape, const Strides& strides, const TensorOptions& options) {
  throw NotImplementedError("ops::empty_strided: not implemented yet");
}

Tensor zeros(const Shape& shape, const TensorOptions& options) {
  throw NotImplementedError("ops::zeros: not implemented yet");
}

Tensor ones(const Shape& shape, const TensorOptions& options) {
  throw NotImplementedError("ops::ones: not implemented yet");
}

Tensor full(const Shape& shape, Scalar value, const TensorOptions& options) {
  throw NotImplementedError("ops::full: not implemented yet");
}

Tensor empty_like(const Tensor& t, std::optional<DType> dtype, MemoryFormat format) {
  throw NotImplementedError("ops::empty_like: not implemented yet");
}

Tensor zeros_like(const Tensor& t, std::optional<DType> dtype) {
  throw NotImplementedError("ops::zeros_like: not implemented yet");
}

Tensor ones_like(const Tensor& t, std::optional<DType> dtype) {
  throw NotImplementedError("ops::ones_like: not implemented yet");
}

Tensor full_like(const Tensor& t, Scalar value, std::optional<DType> dtype) {
  throw NotImplementedError("ops::full_like: not implemented yet");
}

Tensor arange(Scalar end, const TensorOptions& options) {
  throw NotImplementedError("ops::arange: not implemented yet");
}

Tensor arange(Scalar start, Scalar end, Scalar step, std::optional<TensorOptions> options) {
  throw NotImplementedError("ops::arange: not implemented yet");
}

Tensor linspace(double start, double end, int64_t steps, const TensorOptions& options) {
  throw NotImplementedError("ops::linspace: not implemented yet");
}

Tensor eye(int64_t n, std::optional<int64_t> m, const TensorOptions& options) {
  throw NotImplementedError("ops::eye: not implemented yet");
}

Tensor from_blob(const void* data, const Shape& shape, DType dtype, Device device) {
  throw NotImplementedError("ops::from_blob: not implemented yet");
}

Tensor scalar_tensor(Scalar value, const TensorOptions& options) {
  throw NotImplementedError("ops::scalar_tensor: not implemented yet");
}

}  // namespace kiln::ops
