// Tensor's methods and operators: thin forwards to the differentiable functions of namespace kiln
// (functions.h), so that x.relu(), a + b and x.sum() record the graph as kiln::relu(x) does.
#include "kiln/autograd/functions.h"

namespace kiln {

Tensor Tensor::to(Device device, bool non_blocking) const { return kiln::to(*this, device, {}, non_blocking); }
Tensor Tensor::to(DType dtype) const { return kiln::to(*this, device(), dtype); }
Tensor Tensor::to(Device device, DType dtype, bool non_blocking) const {
  return kiln::to(*this, device, dtype, non_blocking);
}
Tensor Tensor::to(MemoryFormat format) const { return kiln::contiguous(*this, format); }
Tensor Tensor::contiguous(MemoryFormat format) const { return kiln::contiguous(*this, format); }
Tensor Tensor::clone(MemoryFormat format) const { return kiln::clone(*this, format); }
Tensor Tensor::pin_memory() const { return kiln::pin_memory(*this); }
bool Tensor::is_pinned() const { return kiln::is_pinned(*this); }
Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) { return kiln::copy_(*this, src, non_blocking); }
Tensor& Tensor::fill_(Scalar value) { return kiln::fill_(*this, value); }

Tensor Tensor::view(const Shape& s) const { return kiln::view(*this, s); }
Tensor Tensor::reshape(const Shape& s) const { return kiln::reshape(*this, s); }
Tensor Tensor::permute(const std::vector<int64_t>& dims) const { return kiln::permute(*this, dims); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return kiln::transpose(*this, d0, d1); }
Tensor Tensor::t() const { return dim() < 2 ? *this : kiln::transpose(*this, 0, 1); }
Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const { return kiln::narrow(*this, d, start, length); }
Tensor Tensor::slice(int64_t d, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) const {
  return kiln::slice(*this, d, start, end, step);
}
Tensor Tensor::select(int64_t d, int64_t index) const { return kiln::select(*this, d, index); }
Tensor Tensor::expand(const Shape& s) const { return kiln::expand(*this, s); }
Tensor Tensor::squeeze() const { return kiln::squeeze(*this); }
Tensor Tensor::squeeze(int64_t d) const { return kiln::squeeze(*this, d); }
Tensor Tensor::unsqueeze(int64_t d) const { return kiln::unsqueeze(*this, d); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const { return kiln::flatten(*this, start_dim, end_dim); }
Tensor Tensor::unflatten(int64_t d, const Shape& sizes) const { return kiln::unflatten(*this, d, sizes); }
Tensor Tensor::as_strided(const Shape& sizes, const Strides& strides, std::optional<int64_t> offset) const {
  return kiln::as_strided(*this, sizes, strides, offset);
}
std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const { return kiln::split(*this, split_size, d); }
std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const { return kiln::chunk(*this, chunks, d); }
Tensor Tensor::diagonal(int64_t offset, int64_t d1, int64_t d2) const { return kiln::diagonal(*this, offset, d1, d2); }

#define KILN_X(Enum, name, ...)                             \
  Tensor Tensor::name() const { return kiln::name(*this); } \
  Tensor& Tensor::name##_() { return kiln::name##_(*this); }
KILN_UNARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Enum, name, ...) \
  Tensor Tensor::name() const { return kiln::name(*this); }
KILN_UNARY_PREDICATES(KILN_X)
#undef KILN_X
Tensor Tensor::square() const { return kiln::square(*this); }
Tensor Tensor::pow(Scalar e) const { return kiln::pow(*this, e); }
Tensor Tensor::clamp(std::optional<Scalar> lo, std::optional<Scalar> hi) const { return kiln::clamp(*this, lo, hi); }
// The binary table's methods (binary_ops.h), by the row's forms.
#define KILN_BINARY_METHODS_DEFINE_Plain(name) \
  Tensor Tensor::name(const Tensor& o) const { return kiln::name(*this, o); }
#define KILN_BINARY_METHODS_DEFINE_Scalar(name)                                                                       \
  KILN_BINARY_METHODS_DEFINE_Plain(name) Tensor& Tensor::name##_(const Tensor& o) { return kiln::name##_(*this, o); } \
  Tensor& Tensor::name##_(Scalar o) { return kiln::name##_(*this, o); }
#define KILN_BINARY_METHODS_DEFINE_Alpha(name)                                                      \
  Tensor Tensor::name(const Tensor& o, Scalar alpha) const { return kiln::name(*this, o, alpha); }  \
  Tensor& Tensor::name##_(const Tensor& o, Scalar alpha) { return kiln::name##_(*this, o, alpha); } \
  Tensor& Tensor::name##_(Scalar o) { return kiln::name##_(*this, o); }
#define KILN_X(Enum, name, result, autocast, forms, ...) KILN_BINARY_METHODS_DEFINE_##forms(name)
KILN_BINARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Enum, name, ...) KILN_BINARY_METHODS_DEFINE_Plain(name)
KILN_BINARY_PREDICATES(KILN_X)
#undef KILN_X
Tensor Tensor::masked_fill(const Tensor& mask, Scalar v) const { return kiln::masked_fill(*this, mask, v); }

Tensor& Tensor::clamp_(std::optional<Scalar> lo, std::optional<Scalar> hi) { return kiln::clamp_(*this, lo, hi); }
Tensor& Tensor::masked_fill_(const Tensor& mask, Scalar v) { return kiln::masked_fill_(*this, mask, v); }

Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const { return kiln::sum(*this, dims, keepdim); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const { return kiln::mean(*this, dims, keepdim); }
Tensor Tensor::prod(const std::vector<int64_t>& dims, bool keepdim) const { return kiln::prod(*this, dims, keepdim); }
Tensor Tensor::max() const { return kiln::max(*this); }
Tensor Tensor::min() const { return kiln::min(*this); }
Tensor Tensor::amax(const std::vector<int64_t>& dims, bool keepdim) const { return kiln::amax(*this, dims, keepdim); }
Tensor Tensor::amin(const std::vector<int64_t>& dims, bool keepdim) const { return kiln::amin(*this, dims, keepdim); }
Tensor Tensor::argmax(std::optional<int64_t> d, bool keepdim) const { return kiln::argmax(*this, d, keepdim); }
Tensor Tensor::argmin(std::optional<int64_t> d, bool keepdim) const { return kiln::argmin(*this, d, keepdim); }
Tensor Tensor::var(const std::vector<int64_t>& dims, int64_t correction, bool keepdim) const {
  return kiln::var(*this, dims, correction, keepdim);
}
Tensor Tensor::std(const std::vector<int64_t>& dims, int64_t correction, bool keepdim) const {
  return kiln::std(*this, dims, correction, keepdim);
}
Tensor Tensor::norm(double p, const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::norm(*this, p, dims, keepdim);
}
Tensor Tensor::logsumexp(const std::vector<int64_t>& dims, bool keepdim) const {
  return kiln::logsumexp(*this, dims, keepdim);
}
Tensor Tensor::all() const { return kiln::all(*this); }
Tensor Tensor::any() const { return kiln::any(*this); }
Tensor Tensor::softmax(int64_t d) const { return kiln::softmax(*this, d); }
Tensor Tensor::log_softmax(int64_t d) const { return kiln::log_softmax(*this, d); }

Tensor Tensor::matmul(const Tensor& o) const { return kiln::matmul(*this, o); }
Tensor Tensor::index_select(int64_t d, const Tensor& index) const { return kiln::index_select(*this, d, index); }
Tensor Tensor::gather(int64_t d, const Tensor& index) const { return kiln::gather(*this, d, index); }
Tensor Tensor::masked_select(const Tensor& mask) const { return kiln::masked_select(*this, mask); }

// ---- operators ----
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
Tensor operator-(Scalar a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator/(Scalar a, const Tensor& b) { return div(a, b); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator==(const Tensor& a, Scalar b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, Scalar b) { return ne(a, b); }
Tensor operator<(const Tensor& a, Scalar b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, Scalar b) { return le(a, b); }
Tensor operator>(const Tensor& a, Scalar b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, Scalar b) { return ge(a, b); }

namespace {
void check_bool_operands(std::string_view op, const Tensor& a, const Tensor* b = nullptr) {
  KILN_CHECK(a.dtype() == DType::Bool && (b == nullptr || b->dtype() == DType::Bool), "operator", op,
             ": defined for bool tensors (masks) only, got ", a.dtype(), b ? " and " : "",
             b ? dtype_name(b->dtype()) : "", "; use logical_not/logical_and/logical_or/logical_xor for other dtypes");
}
}  // namespace
Tensor operator~(const Tensor& a) {
  check_bool_operands("~", a);
  return logical_not(a);
}
Tensor operator&(const Tensor& a, const Tensor& b) {
  check_bool_operands("&", a, &b);
  return logical_and(a, b);
}
Tensor operator|(const Tensor& a, const Tensor& b) {
  check_bool_operands("|", a, &b);
  return logical_or(a, b);
}
Tensor operator^(const Tensor& a, const Tensor& b) {
  check_bool_operands("^", a, &b);
  return logical_xor(a, b);
}
Tensor& operator+=(Tensor& a, const Tensor& b) { return add_(a, b); }
Tensor& operator-=(Tensor& a, const Tensor& b) { return sub_(a, b); }
Tensor& operator*=(Tensor& a, const Tensor& b) { return mul_(a, b); }
Tensor& operator/=(Tensor& a, const Tensor& b) { return div_(a, b); }
Tensor& operator+=(Tensor& a, Scalar b) { return add_(a, b); }
Tensor& operator-=(Tensor& a, Scalar b) { return sub_(a, b); }
Tensor& operator*=(Tensor& a, Scalar b) { return mul_(a, b); }
Tensor& operator/=(Tensor& a, Scalar b) { return div_(a, b); }

}  // namespace kiln
