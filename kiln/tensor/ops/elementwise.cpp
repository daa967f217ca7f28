// Frontend of the elementwise ops: argument checks, promotion, output allocation, then the backend.
#include "kiln/tensor/ops.h"

#include "kiln/tensor/backend.h"

namespace kiln::ops {

Tensor neg(const Tensor& a) {
  throw NotImplementedError("ops::neg: not implemented yet");
}

Tensor abs(const Tensor& a) {
  throw NotImplementedError("ops::abs: not implemented yet");
}

Tensor exp(const Tensor& a) {
  throw NotImplementedError("ops::exp: not implemented yet");
}

Tensor expm1(const Tensor& a) {
  throw NotImplementedError("ops::expm1: not implemented yet");
}

Tensor log(const Tensor& a) {
  throw NotImplementedError("ops::log: not implemented yet");
}

Tensor log1p(const Tensor& a) {
  throw NotImplementedError("ops::log1p: not implemented yet");
}

Tensor log2(const Tensor& a) {
  throw NotImplementedError("ops::log2: not implemented yet");
}

Tensor sqrt(const Tensor& a) {
  throw NotImplementedError("ops::sqrt: not implemented yet");
}

Tensor rsqrt(const Tensor& a) {
  throw NotImplementedError("ops::rsqrt: not implemented yet");
}

Tensor sin(const Tensor& a) {
  throw NotImplementedError("ops::sin: not implemented yet");
}

Tensor cos(const Tensor& a) {
  throw NotImplementedError("ops::cos: not implemented yet");
}

Tensor tanh(const Tensor& a) {
  throw NotImplementedError("ops::tanh: not implemented yet");
}

Tensor erf(const Tensor& a) {
  throw NotImplementedError("ops::erf: not implemented yet");
}

Tensor sigmoid(const Tensor& a) {
  throw NotImplementedError("ops::sigmoid: not implemented yet");
}

Tensor relu(const Tensor& a) {
  throw NotImplementedError("ops::relu: not implemented yet");
}

Tensor gelu(const Tensor& a, bool tanh_approximation) {
  throw NotImplementedError("ops::gelu: not implemented yet");
}

Tensor silu(const Tensor& a) {
  throw NotImplementedError("ops::silu: not implemented yet");
}

Tensor sign(const Tensor& a) {
  throw NotImplementedError("ops::sign: not implemented yet");
}

Tensor floor(const Tensor& a) {
  throw NotImplementedError("ops::floor: not implemented yet");
}

Tensor ceil(const Tensor& a) {
  throw NotImplementedError("ops::ceil: not implemented yet");
}

Tensor round(const Tensor& a) {
  throw NotImplementedError("ops::round: not implemented yet");
}

Tensor square(const Tensor& a) {
  throw NotImplementedError("ops::square: not implemented yet");
}

Tensor reciprocal(const Tensor& a) {
  throw NotImplementedError("ops::reciprocal: not implemented yet");
}

Tensor logical_not(const Tensor& a) {
  throw NotImplementedError("ops::logical_not: not implemented yet");
}

Tensor isnan(const Tensor& a) {
  throw NotImplementedError("ops::isnan: not implemented yet");
}

Tensor isinf(const Tensor& a) {
  throw NotImplementedError("ops::isinf: not implemented yet");
}

Tensor isfinite(const Tensor& a) {
  throw NotImplementedError("ops::isfinite: not implemented yet");
}

Tensor pow(const Tensor& a, const Tensor& exponent) {
  throw NotImplementedError("ops::pow: not implemented yet");
}

Tensor pow(const Tensor& a, Scalar exponent) {
  throw NotImplementedError("ops::pow: not implemented yet");
}

Tensor pow(Scalar base, const Tensor& exponent) {
  throw NotImplementedError("ops::pow: not implemented yet");
}

Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) {
  throw NotImplementedError("ops::clamp: not implemented yet");
}

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  throw NotImplementedError("ops::add: not implemented yet");
}

Tensor add(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::add: not implemented yet");
}

Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  throw NotImplementedError("ops::sub: not implemented yet");
}

Tensor sub(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::sub: not implemented yet");
}

Tensor rsub(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::rsub: not implemented yet");
}

Tensor mul(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::mul: not implemented yet");
}

Tensor mul(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::mul: not implemented yet");
}

Tensor div(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::div: not implemented yet");
}

Tensor div(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::div: not implemented yet");
}

Tensor div(Scalar a, const Tensor& b) {
  throw NotImplementedError("ops::div: not implemented yet");
}

Tensor remainder(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::remainder: not implemented yet");
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::maximum: not implemented yet");
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::minimum: not implemented yet");
}

Tensor eq(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::eq: not implemented yet");
}

Tensor ne(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::ne: not implemented yet");
}

Tensor lt(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::lt: not implemented yet");
}

Tensor le(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::le: not implemented yet");
}

Tensor gt(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::gt: not implemented yet");
}

Tensor ge(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::ge: not implemented yet");
}

Tensor eq(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::eq: not implemented yet");
}

Tensor ne(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::ne: not implemented yet");
}

Tensor lt(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::lt: not implemented yet");
}

Tensor le(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::le: not implemented yet");
}

Tensor gt(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::gt: not implemented yet");
}

Tensor ge(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::ge: not implemented yet");
}

Tensor logical_and(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::logical_and: not implemented yet");
}

Tensor logical_or(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::logical_or: not implemented yet");
}

Tensor logical_xor(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::logical_xor: not implemented yet");
}

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::where: not implemented yet");
}

Tensor where(const Tensor& condition, Scalar a, const Tensor& b) {
  throw NotImplementedError("ops::where: not implemented yet");
}

Tensor where(const Tensor& condition, const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::where: not implemented yet");
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value) {
  throw NotImplementedError("ops::masked_fill: not implemented yet");
}

Tensor lerp(const Tensor& a, const Tensor& b, Scalar weight) {
  throw NotImplementedError("ops::lerp: not implemented yet");
}

Tensor& add_(Tensor& a, const Tensor& b, Scalar alpha) {
  throw NotImplementedError("ops::add_: not implemented yet");
}

Tensor& add_(Tensor& a, Scalar b) {
  throw NotImplementedError("ops::add_: not implemented yet");
}

Tensor& sub_(Tensor& a, const Tensor& b, Scalar alpha) {
  throw NotImplementedError("ops::sub_: not implemented yet");
}

Tensor& sub_(Tensor& a, Scalar b) {
  throw NotImplementedError("ops::sub_: not implemented yet");
}

Tensor& mul_(Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::mul_: not implemented yet");
}

Tensor& mul_(Tensor& a, Scalar b) {
  throw NotImplementedError("ops::mul_: not implemented yet");
}

Tensor& div_(Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::div_: not implemented yet");
}

Tensor& div_(Tensor& a, Scalar b) {
  throw NotImplementedError("ops::div_: not implemented yet");
}

Tensor& clamp_(Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) {
  throw NotImplementedError("ops::clamp_: not implemented yet");
}

Tensor& relu_(Tensor& a) {
  throw NotImplementedError("ops::relu_: not implemented yet");
}

Tensor& neg_(Tensor& a) {
  throw NotImplementedError("ops::neg_: not implemented yet");
}

Tensor& exp_(Tensor& a) {
  throw NotImplementedError("ops::exp_: not implemented yet");
}

Tensor& sqrt_(Tensor& a) {
  throw NotImplementedError("ops::sqrt_: not implemented yet");
}

Tensor& masked_fill_(Tensor& a, const Tensor& mask, Scalar value) {
  throw NotImplementedError("ops::masked_fill_: not implemented yet");
}

DType result_type(const Tensor& a, const Tensor& b) {
  throw NotImplementedError("ops::result_type: not implemented yet");
}

DType result_type(const Tensor& a, Scalar b) {
  throw NotImplementedError("ops::result_type: not implemented yet");
}

}  // namespace kiln::ops
