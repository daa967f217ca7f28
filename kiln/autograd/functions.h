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

using Dims = std::vector<int64_t>;  // a list of dims (negative ones count from the end)

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
Tensor& uniform_(Tensor& t, double from = 0, double to = 1, Generator* gen = nullptr);  // U[from, to), floating t
Tensor& normal_(Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);  // N(mean, std^2), floating t

// ---------------------------------------------------------------- the differentiable ops
// Declared by the lists kiln::internal expands too (op_signatures.h, unary_ops.h, binary_ops.h), so each takes the
// raw op's arguments and defaults; their forward and backward live in ops/<family>.cpp.
KILN_COPY_DECLARE_ALL()  // ops/copy.cpp
KILN_VIEW_DECLARE_ALL()  // ops/view.cpp

// The unary ops of the table (unary_ops.h), differentiable: exp(a), and exp_(a) in place; gelu, square, clamp
// (ops/unary.cpp) and clamp_ (ops/inplace.cpp).
KILN_UNARY_DECLARE_ALL()

// The binary ops of the table (binary_ops.h), differentiable, with broadcasting and type promotion: add(a, b, alpha)
// = a + alpha * b, sub, mul, div (true division: integers give kDefaultFloat), remainder (Python's %), pow, maximum,
// minimum; mul(a, 2.5); the in-place forms (ops/inplace.cpp) add_, sub_, mul_, div_, masked_fill_ write into `a`
// (the promoted type must be castable to a's dtype: float into int is an error). The predicates (eq, ...,
// logical_xor) give Bool and have no gradient.
KILN_BINARY_DECLARE_ALL()

KILN_REDUCE_DECLARE_ALL()  // ops/reduce.cpp, ops/softmax.cpp
KILN_LINALG_DECLARE_ALL()  // ops/linalg.cpp
KILN_INDEX_DECLARE_ALL()   // ops/index.cpp, ops/concat.cpp

// ---------------------------------------------------------------- comparison helpers (compare.cpp)
// |a - b| <= atol + rtol * |b| elementwise, NaNs equal when equal_nan; shapes must broadcast.

}  // namespace kiln
