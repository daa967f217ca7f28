// Frontend of the view ops: argument checks, promotion, output allocation, then the backend.
#include "kiln/tensor/ops.h"

#include "kiln/tensor/backend.h"

namespace kiln::ops {

Tensor view(const Tensor& t, const Shape& shape) {
  throw NotImplementedError("ops::view: not implemented yet");
}

Tensor reshape(const Tensor& t, const Shape& shape) {
  throw NotImplementedError("ops::reshape: not implemented yet");
}

Tensor permute(const Tensor& t, const Dims& dims) {
  throw NotImplementedError("ops::permute: not implemented yet");
}

Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  throw NotImplementedError("ops::transpose: not implemented yet");
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  throw NotImplementedError("ops::narrow: not implemented yet");
}

Tensor slice(const Tensor& t, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
  throw NotImplementedError("ops::slice: not implemented yet");
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  throw NotImplementedError("ops::select: not implemented yet");
}

Tensor expand(const Tensor& t, const Shape& shape) {
  throw NotImplementedError("ops::expand: not implemented yet");
}

Tensor squeeze(const Tensor& t) {
  throw NotImplementedError("ops::squeeze: not implemented yet");
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  throw NotImplementedError("ops::squeeze: not implemented yet");
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  throw NotImplementedError("ops::unsqueeze: not implemented yet");
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  throw NotImplementedError("ops::flatten: not implemented yet");
}

Tensor unflatten(const Tensor& t, int64_t dim, const Shape& sizes) {
  throw NotImplementedError("ops::unflatten: not implemented yet");
}

Tensor as_strided(const Tensor& t, const Shape& sizes, const Strides& strides, std::optional<int64_t> offset) {
  throw NotImplementedError("ops::as_strided: not implemented yet");
}

Tensor diagonal(const Tensor& t, int64_t offset, int64_t dim1, int64_t dim2) {
  throw NotImplementedError("ops::diagonal: not implemented yet");
}

std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim) {
  throw NotImplementedError("ops::split: not implemented yet");
}

std::vector<Tensor> split_with_sizes(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim) {
  throw NotImplementedError("ops::split_with_sizes: not implemented yet");
}

std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim) {
  throw NotImplementedError("ops::chunk: not implemented yet");
}

std::vector<Tensor> unbind(const Tensor& t, int64_t dim) {
  throw NotImplementedError("ops::unbind: not implemented yet");
}

Shape infer_shape(const Shape& shape, int64_t numel, std::string_view op) {
  throw NotImplementedError("ops::infer_shape: not implemented yet");
}

}  // namespace kiln::ops
