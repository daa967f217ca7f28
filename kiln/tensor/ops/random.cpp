// Frontend of the random ops: argument checks, promotion, output allocation, then the backend.
#include "kiln/tensor/ops.h"

#include "kiln/tensor/backend.h"

namespace kiln::ops {

Tensor rand(const Shape& shape, const TensorOptions& options, Generator* gen) {
  throw NotImplementedError("ops::rand: not implemented yet");
}

Tensor randn(const Shape& shape, const TensorOptions& options, Generator* gen) {
  throw NotImplementedError("ops::randn: not implemented yet");
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options, Generator* gen) {
  throw NotImplementedError("ops::randint: not implemented yet");
}

Tensor bernoulli(const Tensor& p, Generator* gen) {
  throw NotImplementedError("ops::bernoulli: not implemented yet");
}

Tensor bernoulli(const Shape& shape, double p, const TensorOptions& options, Generator* gen) {
  throw NotImplementedError("ops::bernoulli: not implemented yet");
}

Tensor normal(const Shape& shape, double mean, double std, const TensorOptions& options, Generator* gen) {
  throw NotImplementedError("ops::normal: not implemented yet");
}

Tensor& uniform_(Tensor& t, double from, double to, Generator* gen) {
  throw NotImplementedError("ops::uniform_: not implemented yet");
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  throw NotImplementedError("ops::normal_: not implemented yet");
}

Tensor randperm(int64_t n, const TensorOptions& options, Generator* gen) {
  throw NotImplementedError("ops::randperm: not implemented yet");
}

}  // namespace kiln::ops
