// Frontend of the reduce ops: argument checks, promotion, output allocation, then the backend.
#include "kiln/tensor/ops.h"

#include "kiln/tensor/backend.h"

namespace kiln::ops {

Tensor sum(const Tensor& a, const Dims& dims, bool keepdim, std::optional<DType> dtype) {
  throw NotImplementedError("ops::sum: not implemented yet");
}

Tensor mean(const Tensor& a, const Dims& dims, bool keepdim) {
  throw NotImplementedError("ops::mean: not implemented yet");
}

Tensor prod(const Tensor& a, const Dims& dims, bool keepdim) {
  throw NotImplementedError("ops::prod: not implemented yet");
}

Tensor amax(const Tensor& a, const Dims& dims, bool keepdim) {
  throw NotImplementedError("ops::amax: not implemented yet");
}

Tensor amin(const Tensor& a, const Dims& dims, bool keepdim) {
  throw NotImplementedError("ops::amin: not implemented yet");
}

Tensor max(const Tensor& a) {
  throw NotImplementedError("ops::max: not implemented yet");
}

Tensor min(const Tensor& a) {
  throw NotImplementedError("ops::min: not implemented yet");
}

std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  throw NotImplementedError("ops::max: not implemented yet");
}

std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) {
  throw NotImplementedError("ops::min: not implemented yet");
}

Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  throw NotImplementedError("ops::argmax: not implemented yet");
}

Tensor argmin(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  throw NotImplementedError("ops::argmin: not implemented yet");
}

Tensor var(const Tensor& a, const Dims& dims, int64_t correction, bool keepdim) {
  throw NotImplementedError("ops::var: not implemented yet");
}

Tensor std(const Tensor& a, const Dims& dims, int64_t correction, bool keepdim) {
  throw NotImplementedError("ops::std: not implemented yet");
}

std::tuple<Tensor, Tensor> var_mean(const Tensor& a, const Dims& dims, int64_t correction, bool keepdim) {
  throw NotImplementedError("ops::var_mean: not implemented yet");
}

Tensor norm(const Tensor& a, double p, const Dims& dims, bool keepdim) {
  throw NotImplementedError("ops::norm: not implemented yet");
}

Tensor logsumexp(const Tensor& a, const Dims& dims, bool keepdim) {
  throw NotImplementedError("ops::logsumexp: not implemented yet");
}

Tensor all(const Tensor& a, const Dims& dims, bool keepdim) {
  throw NotImplementedError("ops::all: not implemented yet");
}

Tensor any(const Tensor& a, const Dims& dims, bool keepdim) {
  throw NotImplementedError("ops::any: not implemented yet");
}

Tensor count_nonzero(const Tensor& a, const Dims& dims) {
  throw NotImplementedError("ops::count_nonzero: not implemented yet");
}

Tensor softmax(const Tensor& a, int64_t dim) {
  throw NotImplementedError("ops::softmax: not implemented yet");
}

Tensor log_softmax(const Tensor& a, int64_t dim) {
  throw NotImplementedError("ops::log_softmax: not implemented yet");
}

}  // namespace kiln::ops
