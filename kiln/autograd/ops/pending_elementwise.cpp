// Not differentiable yet: these forward to the raw ops and record nothing. Each moves into its
// family's file (forward and backward side by side) as it gains a gradient; this file then goes.
#include "kiln/autograd/functions.h"

namespace kiln {

Tensor& uniform_(Tensor& t, double from, double to, Generator* gen) { return ops::uniform_(t, from, to, gen); }
Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) { return ops::normal_(t, mean, std, gen); }
Tensor& fill_(Tensor& t, Scalar value) { return ops::fill_(t, value); }
Tensor neg(const Tensor& a) { return ops::neg(a); }
Tensor abs(const Tensor& a) { return ops::abs(a); }
Tensor exp(const Tensor& a) { return ops::exp(a); }
Tensor expm1(const Tensor& a) { return ops::expm1(a); }
Tensor log(const Tensor& a) { return ops::log(a); }
Tensor log1p(const Tensor& a) { return ops::log1p(a); }
Tensor log2(const Tensor& a) { return ops::log2(a); }
Tensor sqrt(const Tensor& a) { return ops::sqrt(a); }
Tensor rsqrt(const Tensor& a) { return ops::rsqrt(a); }
Tensor sin(const Tensor& a) { return ops::sin(a); }
Tensor cos(const Tensor& a) { return ops::cos(a); }
Tensor tanh(const Tensor& a) { return ops::tanh(a); }
Tensor erf(const Tensor& a) { return ops::erf(a); }
Tensor sigmoid(const Tensor& a) { return ops::sigmoid(a); }
Tensor relu(const Tensor& a) { return ops::relu(a); }
Tensor gelu(const Tensor& a, bool tanh_approximation) { return ops::gelu(a, tanh_approximation); }
Tensor silu(const Tensor& a) { return ops::silu(a); }
Tensor sign(const Tensor& a) { return ops::sign(a); }
Tensor floor(const Tensor& a) { return ops::floor(a); }
Tensor ceil(const Tensor& a) { return ops::ceil(a); }
Tensor round(const Tensor& a) { return ops::round(a); }
Tensor square(const Tensor& a) { return ops::square(a); }
Tensor reciprocal(const Tensor& a) { return ops::reciprocal(a); }
Tensor pow(const Tensor& a, const Tensor& exponent) { return ops::pow(a, exponent); }
Tensor pow(const Tensor& a, Scalar exponent) { return ops::pow(a, exponent); }
Tensor pow(Scalar base, const Tensor& exponent) { return ops::pow(base, exponent); }
Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) { return ops::clamp(a, min, max); }
Tensor remainder(const Tensor& a, const Tensor& b) { return ops::remainder(a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return ops::maximum(a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return ops::minimum(a, b); }
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) { return ops::where(condition, a, b); }
Tensor where(const Tensor& condition, Scalar a, const Tensor& b) { return ops::where(condition, a, b); }
Tensor where(const Tensor& condition, const Tensor& a, Scalar b) { return ops::where(condition, a, b); }
Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value) { return ops::masked_fill(a, mask, value); }
Tensor lerp(const Tensor& a, const Tensor& b, Scalar weight) { return ops::lerp(a, b, weight); }
Tensor& add_(Tensor& a, const Tensor& b, Scalar alpha) { return ops::add_(a, b, alpha); }
Tensor& add_(Tensor& a, Scalar b) { return ops::add_(a, b); }
Tensor& sub_(Tensor& a, const Tensor& b, Scalar alpha) { return ops::sub_(a, b, alpha); }
Tensor& sub_(Tensor& a, Scalar b) { return ops::sub_(a, b); }
Tensor& mul_(Tensor& a, const Tensor& b) { return ops::mul_(a, b); }
Tensor& mul_(Tensor& a, Scalar b) { return ops::mul_(a, b); }
Tensor& div_(Tensor& a, const Tensor& b) { return ops::div_(a, b); }
Tensor& div_(Tensor& a, Scalar b) { return ops::div_(a, b); }
Tensor& clamp_(Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) { return ops::clamp_(a, min, max); }
Tensor& relu_(Tensor& a) { return ops::relu_(a); }
Tensor& neg_(Tensor& a) { return ops::neg_(a); }
Tensor& exp_(Tensor& a) { return ops::exp_(a); }
Tensor& sqrt_(Tensor& a) { return ops::sqrt_(a); }
Tensor& masked_fill_(Tensor& a, const Tensor& mask, Scalar value) { return ops::masked_fill_(a, mask, value); }

}  // namespace kiln
