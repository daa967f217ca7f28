// Frontend of the index ops: argument checks, promotion, output allocation, then the backend.
#include "kiln/tensor/ops.h"

#include "kiln/tensor/backend.h"

namespace kiln::ops {

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  throw NotImplementedError("ops::index_select: not implemented yet");
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  throw NotImplementedError("ops::gather: not implemented yet");
}

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  throw NotImplementedError("ops::scatter: not implemented yet");
}

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, Scalar value) {
  throw NotImplementedError("ops::scatter: not implemented yet");
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  throw NotImplementedError("ops::scatter_add: not implemented yet");
}

Tensor& scatter_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  throw NotImplementedError("ops::scatter_: not implemented yet");
}

Tensor& scatter_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  throw NotImplementedError("ops::scatter_add_: not implemented yet");
}

Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  throw NotImplementedError("ops::index_add: not implemented yet");
}

Tensor masked_select(const Tensor& a, const Tensor& mask) {
  throw NotImplementedError("ops::masked_select: not implemented yet");
}

Tensor nonzero(const Tensor& a) {
  throw NotImplementedError("ops::nonzero: not implemented yet");
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  throw NotImplementedError("ops::one_hot: not implemented yet");
}

Tensor embedding(const Tensor& weight, const Tensor& index) {
  throw NotImplementedError("ops::embedding: not implemented yet");
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  throw NotImplementedError("ops::cat: not implemented yet");
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  throw NotImplementedError("ops::stack: not implemented yet");
}

std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending, bool stable) {
  throw NotImplementedError("ops::sort: not implemented yet");
}

Tensor argsort(const Tensor& a, int64_t dim, bool descending) {
  throw NotImplementedError("ops::argsort: not implemented yet");
}

std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  throw NotImplementedError("ops::topk: not implemented yet");
}

Tensor tril(const Tensor& a, int64_t diagonal) {
  throw NotImplementedError("ops::tril: not implemented yet");
}

Tensor triu(const Tensor& a, int64_t diagonal) {
  throw NotImplementedError("ops::triu: not implemented yet");
}

}  // namespace kiln::ops
