// kiln/autograd/functions.h — the ops as users call them: kiln::add, kiln::matmul, kiln::zeros, ...
//
//   using namespace kiln;
//   Tensor w = randn({8, 4}).requires_grad_();
//   Tensor loss = softmax(matmul(x, w), -1).sum();
//   loss.backward();                                 // w.grad() is (8, 4)
//
// Every op that has a gradient records itself in the graph when grad mode is on and an input requires
// grad; otherwise it is the raw op of kiln/tensor/internal_ops.h plus one thread-local check. Each family's
// forward and backward live side by side in kiln/autograd/ops/. Ops without a gradient (factories,
// random draws, comparisons, arg-reductions) are the raw ops themselves.
#pragma once

#include "kiln/tensor/internal_ops.h"

namespace kiln {

using Dims = std::vector<int64_t>;

// ---------------------------------------------------------------- not differentiable (kiln/tensor/internal_ops.h)
using internal::all;
using internal::allclose;
using internal::any;
using internal::arange;
using internal::argmax;
using internal::argmin;
using internal::argsort;
using internal::bernoulli;
using internal::count_nonzero;
using internal::empty;
using internal::empty_like;
using internal::empty_strided;
using internal::equal;
using internal::eye;
using internal::from_blob;
using internal::from_vector;
using internal::full;
using internal::full_like;
using internal::infer_shape;
using internal::is_pinned;
using internal::isclose;
using internal::linspace;
#define KILN_X(Enum, name, ...) using internal::name;  // the predicates of the unary table (unary_ops.h)
KILN_UNARY_PREDICATES(KILN_X)
#undef KILN_X
using internal::nonzero;
using internal::normal;
using internal::one_hot;
using internal::ones;
using internal::ones_like;
using internal::pin_memory;
using internal::rand;
using internal::randint;
using internal::randn;
using internal::randperm;
using internal::result_type;
using internal::scalar_tensor;
using internal::zeros;
using internal::zeros_like;

using Dims = std::vector<int64_t>;

// ---------------------------------------------------------------- in-place initialisation (ops/inplace.cpp)
// The new values do not depend on the old ones: no gradient flows to what the tensor held before.
Tensor& uniform_(Tensor& t, double from = 0, double to = 1, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);

// ---------------------------------------------------------------- copy and cast (ops/copy.cpp)
Tensor& copy_(Tensor& dst, const Tensor& src, bool non_blocking = false);
Tensor to(const Tensor& t, Device device, std::optional<DType> dtype = {}, bool non_blocking = false);
Tensor cast(const Tensor& t, DType dtype);
Tensor contiguous(const Tensor& t, MemoryFormat format = MemoryFormat::Contiguous);
Tensor clone(const Tensor& t, MemoryFormat format = MemoryFormat::Preserve);
Tensor& fill_(Tensor& t, Scalar value);

// ---------------------------------------------------------------- views (ops/view.cpp)
Tensor view(const Tensor& t, const Shape& shape);
Tensor reshape(const Tensor& t, const Shape& shape);
Tensor permute(const Tensor& t, const Dims& dims);
Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& t, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step = 1);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor expand(const Tensor& t, const Shape& shape);
Tensor squeeze(const Tensor& t);
Tensor squeeze(const Tensor& t, int64_t dim);
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor unflatten(const Tensor& t, int64_t dim, const Shape& sizes);
Tensor as_strided(const Tensor& t, const Shape& sizes, const Strides& strides, std::optional<int64_t> offset = {});
Tensor diagonal(const Tensor& t, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);
std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split_with_sizes(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim = 0);
std::vector<Tensor> unbind(const Tensor& t, int64_t dim = 0);

// ---------------------------------------------------------------- elementwise (ops/unary.cpp, ops/binary.cpp)
// The unary ops of the table (unary_ops.h), differentiable: exp(a), and exp_(a) in place. Floating inputs keep
// their dtype; integer inputs to floating functions (exp, sqrt, sigmoid, ...) give kDefaultFloat.
#define KILN_X(Enum, name, ...) \
  Tensor name(const Tensor& a); \
  Tensor& name##_(Tensor& a);
KILN_UNARY_OPS(KILN_X)
#undef KILN_X
Tensor gelu(const Tensor& a, bool tanh_approximation = false);
Tensor square(const Tensor& a);
Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max);

// The binary ops of the table (binary_ops.h), differentiable, with broadcasting and type promotion: add(a, b, alpha)
// = a + alpha * b, sub, mul, div (true division: integers give kDefaultFloat), remainder (Python's %), pow, maximum,
// minimum; mul(a, 2.5); the in-place forms (ops/inplace.cpp) add_, sub_, mul_, div_ write into `a` (the promoted
// type must be castable to a's dtype: float into int is an error). The predicates (eq, ..., logical_xor) give Bool
// and have no gradient.
KILN_BINARY_DECLARE_ALL()

// In-place forms (ops/inplace.cpp) write into `a`; the promoted type must be castable to a's dtype (float into int is
// an error).
Tensor& clamp_(Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max);
Tensor& masked_fill_(Tensor& a, const Tensor& mask, Scalar value);

// ---------------------------------------------------------------- reductions (ops/reduce.cpp, ops/softmax.cpp)
// `dims` empty means all dims. Integer and bool sums give Int64, as in PyTorch.
Tensor sum(const Tensor& a, const Dims& dims = {}, bool keepdim = false, std::optional<DType> dtype = {});
Tensor mean(const Tensor& a, const Dims& dims = {}, bool keepdim = false);
Tensor prod(const Tensor& a, const Dims& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& a, const Dims& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, const Dims& dims = {}, bool keepdim = false);
Tensor max(const Tensor& a);  // over all elements, 0-d
Tensor min(const Tensor& a);
std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);  // values, Int64 indices
std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor var(const Tensor& a, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& a, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false);
std::tuple<Tensor, Tensor> var_mean(const Tensor& a, const Dims& dims = {}, int64_t correction = 1,
                                    bool keepdim = false);
Tensor norm(const Tensor& a, double p = 2, const Dims& dims = {}, bool keepdim = false);  // p may be INFINITY
Tensor logsumexp(const Tensor& a, const Dims& dims, bool keepdim = false);
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);

// ---------------------------------------------------------------- linear algebra (ops/linalg.cpp)
// matmul follows torch.matmul: 1-D operands are promoted and squeezed, batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);   // (M,K) x (K,N)
Tensor bmm(const Tensor& a, const Tensor& b);  // (B,M,K) x (B,K,N)
Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b, Scalar beta = 1,
             Scalar alpha = 1);  // beta*c + alpha*a@b
Tensor dot(const Tensor& a, const Tensor& b);
Tensor outer(const Tensor& a, const Tensor& b);

// ---------------------------------------------------------------- indexing (ops/index.cpp, ops/concat.cpp)
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, Scalar value);
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor& scatter_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor& scatter_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor masked_select(const Tensor& a, const Tensor& mask);    // 1-D
Tensor embedding(const Tensor& weight, const Tensor& index);  // weight (V, D), index (...) -> (..., D)
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim = -1, bool descending = false, bool stable = true);
std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);
Tensor tril(const Tensor& a, int64_t diagonal = 0);
Tensor triu(const Tensor& a, int64_t diagonal = 0);

// ---------------------------------------------------------------- comparison helpers (compare.cpp)
// |a - b| <= atol + rtol * |b| elementwise, NaNs equal when equal_nan; shapes must broadcast.

}  // namespace kiln
