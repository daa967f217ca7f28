// Not differentiable yet: these forward to the raw ops and record nothing. Each moves into its
// family's file (forward and backward side by side) as it gains a gradient; this file then goes.
#include "kiln/autograd/functions.h"

namespace kiln {

Tensor prod(const Tensor& a, const Dims& dims, bool keepdim) { return ops::prod(a, dims, keepdim); }
Tensor amax(const Tensor& a, const Dims& dims, bool keepdim) { return ops::amax(a, dims, keepdim); }
Tensor amin(const Tensor& a, const Dims& dims, bool keepdim) { return ops::amin(a, dims, keepdim); }
Tensor max(const Tensor& a) { return ops::max(a); }
Tensor min(const Tensor& a) { return ops::min(a); }
std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) { return ops::max(a, dim, keepdim); }
std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) { return ops::min(a, dim, keepdim); }
Tensor var(const Tensor& a, const Dims& dims, int64_t correction, bool keepdim) { return ops::var(a, dims, correction, keepdim); }
Tensor std(const Tensor& a, const Dims& dims, int64_t correction, bool keepdim) { return ops::std(a, dims, correction, keepdim); }
std::tuple<Tensor, Tensor> var_mean(const Tensor& a, const Dims& dims, int64_t correction, bool keepdim) { return ops::var_mean(a, dims, correction, keepdim); }
Tensor norm(const Tensor& a, double p, const Dims& dims, bool keepdim) { return ops::norm(a, p, dims, keepdim); }
Tensor logsumexp(const Tensor& a, const Dims& dims, bool keepdim) { return ops::logsumexp(a, dims, keepdim); }
Tensor softmax(const Tensor& a, int64_t dim) { return ops::softmax(a, dim); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return ops::log_softmax(a, dim); }
Tensor matmul(const Tensor& a, const Tensor& b) { return ops::matmul(a, b); }
Tensor mm(const Tensor& a, const Tensor& b) { return ops::mm(a, b); }
Tensor bmm(const Tensor& a, const Tensor& b) { return ops::bmm(a, b); }
Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) { return ops::addmm(c, a, b, beta, alpha); }
Tensor dot(const Tensor& a, const Tensor& b) { return ops::dot(a, b); }
Tensor outer(const Tensor& a, const Tensor& b) { return ops::outer(a, b); }

}  // namespace kiln
