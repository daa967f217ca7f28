// Frontend of the reduce ops: argument checks, promotion, output allocation, then the backend.
//
// Every reduction is computed by the backend into a fresh contiguous output of keepdim form (size 1
// in each reduced dim); without keepdim, the reduced dims are dropped from that output by a view.
// Edge cases are settled here, once for every backend: a 0-d tensor reduces to itself; an empty
// reduction gives the op's identity (sum 0, prod 1, all true, any false) or NaN (mean, var), and is an
// error for the ops without one (max, min, argmax, argmin).
#include <cmath>
#include <limits>

#include "kiln/tensor/backend.h"
#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/small_alloc.h"

namespace kiln::internal {
namespace {

// The reduced dims of `a` as a mask: empty dims mean all of them; negative dims wrap; a dim given
// twice is an error naming op.
std::vector<bool> reduce_mask(const Tensor& a, const Dims& dims, std::string_view op) {
  check_not_float8(op, a.dtype());  // every reduction passes here
  const int64_t rank = a.dim();
  std::vector<bool> mask(static_cast<size_t>(std::max<int64_t>(rank, 1)), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, rank, op);
    KILN_CHECK(!mask[w], op, ": dim ", w, " appears more than once in dims ", dims, " of a tensor of shape ", a.shape(),
               "; list each dim once");
    mask[w] = true;
  }
  mask.resize(static_cast<size_t>(rank));
  return mask;
}

Shape keepdim_shape(const Shape& shape, const std::vector<bool>& mask) {
  Shape out = shape;
  for (size_t d = 0; d < out.size(); ++d) {
    if (mask[d]) out[d] = 1;
  }
  return out;
}

Shape result_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim) {
  if (keepdim) return keepdim_shape(shape, mask);
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d]) out.push_back(shape[d]);
  }
  return out;
}

// Number of elements each output reduces.
int64_t reduced_count(const Shape& shape, const std::vector<bool>& mask) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (mask[d]) n *= shape[d];
  }
  return n;
}

// A contiguous tensor seen with another shape of as many elements (a view on the same storage).
Tensor reshaped(const Tensor& t, const Shape& shape) {
  return Tensor(make_pooled<TensorImpl>(t.impl().storage(), t.dtype(), shape, contiguous_strides(shape), t.offset()));
}

std::string dims_str(const Dims& dims) {
  return dims.empty() ? std::string("all dims") : detail::str_cat("dims ", dims);
}

// The shared path: out (out_dtype) = op over the masked dims of in, identity for empty reductions.
Tensor reduce_into(ReduceOp op, const Tensor& in, const std::vector<bool>& mask, bool keepdim, DType out_dtype,
                   double empty_value, const ReduceParams& params = {}) {
  const Shape kept = keepdim_shape(in.shape(), mask);
  const Shape shape = result_shape(in.shape(), mask, keepdim);
  if (numel(shape) == 0) return empty(shape, {.dtype = out_dtype, .device = in.device()});
  if (reduced_count(in.shape(), mask) == 0)
    return full(shape, empty_value, {.dtype = out_dtype, .device = in.device()});
  Tensor out = empty(kept, {.dtype = out_dtype, .device = in.device()});
  backend(in.device()).reduce(op, out, in, mask, params);
  return keepdim ? out : reshaped(out, shape);
}

void check_floating(const Tensor& a, std::string_view op) {
  KILN_CHECK(a.is_floating_point(), op, ": expected a floating-point tensor, got ", a.dtype(), " (shape ", a.shape(),
             "); convert it first, e.g. with .to(DType::Float32)");
}

// max, min, argmax...: no identity, so every output must see at least one element.
void check_nonempty_reduction(const Tensor& a, const std::vector<bool>& mask, const Dims& dims, std::string_view op) {
  for (size_t d = 0; d < mask.size(); ++d) {
    KILN_CHECK(!(mask[d] && a.shape()[d] == 0), op, ": cannot reduce over dim ", d, " of size 0 (input shape ",
               a.shape(), ", ", dims_str(dims), "); the operation has no identity, so reduce over non-empty dims only");
  }
}

Tensor as_bool(const Tensor& a) { return a.dtype() == DType::Bool ? a : cast(a, DType::Bool); }

Tensor extreme(ReduceOp op, const Tensor& a, const Dims& dims, bool keepdim, std::string_view name) {
  const auto mask = reduce_mask(a, dims, name);
  check_nonempty_reduction(a, mask, dims, name);
  return reduce_into(op, a, mask, keepdim, a.dtype(), 0);
}

Tensor extreme_all(ReduceOp op, const Tensor& a, std::string_view name) {
  KILN_CHECK(a.numel() > 0, name, "(): cannot reduce an empty tensor (shape ", a.shape(), ", ", a.dtype(),
             "); the operation has no identity. Check the input is not empty, or reduce over a non-empty dim");
  return reduce_into(op, a, reduce_mask(a, {}, name), false, a.dtype(), 0);
}

// max/min along one dim with the index of the first extreme.
std::tuple<Tensor, Tensor> extreme_dim(ReduceOp op, const Tensor& a, int64_t dim, bool keepdim, std::string_view name) {
  check_not_float8(name, a.dtype());
  const int64_t d = wrap_dim(dim, a.dim(), name);
  Tensor in = a.dim() == 0 ? reshaped(a, {1}) : a;  // a 0-d tensor is its own line of one element
  KILN_CHECK(in.size(d) > 0, name, ": cannot reduce over dim ", d, " of size 0 (input shape ", a.shape(),
             "); the operation has no identity, so reduce over a non-empty dim");
  std::vector<bool> mask(static_cast<size_t>(in.dim()), false);
  mask[d] = true;
  const Shape kept = keepdim_shape(in.shape(), mask);
  const Shape shape = a.dim() == 0 ? Shape{} : result_shape(in.shape(), mask, keepdim);
  Tensor values = empty(kept, {.dtype = a.dtype(), .device = a.device()});
  Tensor indices = empty(kept, {.dtype = DType::Int64, .device = a.device()});
  if (values.numel() > 0) backend(a.device()).arg_reduce(op, values, indices, in, d);
  if (shape == kept) return {values, indices};
  return {reshaped(values, shape), reshaped(indices, shape)};
}

Tensor arg_extreme(ReduceOp op, const Tensor& a, std::optional<int64_t> dim, bool keepdim, std::string_view name) {
  if (dim) return std::get<1>(extreme_dim(op, a, *dim, keepdim, name));
  // Over the flattened tensor: the index into its row-major order.
  KILN_CHECK(a.numel() > 0, name, "(): cannot reduce an empty tensor (shape ", a.shape(),
             ") without a dim; the operation has no identity");
  Tensor flat = reshaped(contiguous(a), {a.numel()});
  Tensor index = std::get<1>(extreme_dim(op, flat, 0, false, name));
  return keepdim ? reshaped(index, Shape(static_cast<size_t>(a.dim()), 1)) : index;
}

Tensor variance(ReduceOp op, const Tensor& a, const Dims& dims, int64_t correction, bool keepdim,
                std::string_view name) {
  check_floating(a, name);
  const auto mask = reduce_mask(a, dims, name);
  return reduce_into(op, a, mask, keepdim, a.dtype(), std::numeric_limits<double>::quiet_NaN(),
                     {.correction = correction});
}

}  // namespace

Tensor sum(const Tensor& a, const Dims& dims, bool keepdim, std::optional<DType> dtype) {
  const auto mask = reduce_mask(a, dims, "sum");
  const bool integral = is_integral(a.dtype(), /*include_bool=*/true);
  const DType out_dtype = dtype ? *dtype : integral ? DType::Int64 : a.dtype();
  // Integers sum straight into int64; any other requested dtype is computed in that dtype.
  const bool widen = integral && out_dtype == DType::Int64;
  const Tensor in = (widen || out_dtype == a.dtype()) ? a : cast(a, out_dtype);
  return reduce_into(ReduceOp::Sum, in, mask, keepdim, out_dtype, 0);
}

Tensor mean(const Tensor& a, const Dims& dims, bool keepdim) {
  KILN_CHECK(a.is_floating_point(), "mean: cannot compute the mean of a ", a.dtype(), " tensor (shape ", a.shape(),
             "); the mean needs a floating-point input: convert it first with .to(DType::Float32)");
  const auto mask = reduce_mask(a, dims, "mean");
  return reduce_into(ReduceOp::Mean, a, mask, keepdim, a.dtype(), std::numeric_limits<double>::quiet_NaN());
}

Tensor prod(const Tensor& a, const Dims& dims, bool keepdim) {
  const auto mask = reduce_mask(a, dims, "prod");
  const DType out_dtype = is_integral(a.dtype(), /*include_bool=*/true) ? DType::Int64 : a.dtype();
  return reduce_into(ReduceOp::Prod, a, mask, keepdim, out_dtype, 1);
}

Tensor amax(const Tensor& a, const Dims& dims, bool keepdim) {
  return extreme(ReduceOp::Max, a, dims, keepdim, "amax");
}
Tensor amin(const Tensor& a, const Dims& dims, bool keepdim) {
  return extreme(ReduceOp::Min, a, dims, keepdim, "amin");
}
Tensor max(const Tensor& a) { return extreme_all(ReduceOp::Max, a, "max"); }
Tensor min(const Tensor& a) { return extreme_all(ReduceOp::Min, a, "min"); }

std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme_dim(ReduceOp::Max, a, dim, keepdim, "max");
}
std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme_dim(ReduceOp::Min, a, dim, keepdim, "min");
}

Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  return arg_extreme(ReduceOp::Max, a, dim, keepdim, "argmax");
}
Tensor argmin(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  return arg_extreme(ReduceOp::Min, a, dim, keepdim, "argmin");
}

Tensor var(const Tensor& a, const Dims& dims, int64_t correction, bool keepdim) {
  return variance(ReduceOp::Var, a, dims, correction, keepdim, "var");
}

Tensor std(const Tensor& a, const Dims& dims, int64_t correction, bool keepdim) {
  return variance(ReduceOp::Std, a, dims, correction, keepdim, "std");
}

std::tuple<Tensor, Tensor> var_mean(const Tensor& a, const Dims& dims, int64_t correction, bool keepdim) {
  Tensor v = variance(ReduceOp::Var, a, dims, correction, keepdim, "var_mean");
  return {v, mean(a, dims, keepdim)};
}

Tensor norm(const Tensor& a, double p, const Dims& dims, bool keepdim) {
  check_floating(a, "norm");
  KILN_CHECK(!std::isnan(p), "norm: the order p is NaN; use p = 2, 1, 0, inf, -inf or another number");
  const auto mask = reduce_mask(a, dims, "norm");
  if (std::isinf(p)) check_nonempty_reduction(a, mask, dims, p > 0 ? "norm(p=inf)" : "norm(p=-inf)");
  return reduce_into(ReduceOp::Norm, a, mask, keepdim, a.dtype(), 0, {.p = p});
}

Tensor logsumexp(const Tensor& a, const Dims& dims, bool keepdim) {
  const auto mask = reduce_mask(a, dims, "logsumexp");
  const Tensor in = a.is_floating_point() ? a : cast(a, kDefaultFloat);  // integers give float32, as in PyTorch
  return reduce_into(ReduceOp::LogSumExp, in, mask, keepdim, in.dtype(), -std::numeric_limits<double>::infinity());
}

Tensor all(const Tensor& a, const Dims& dims, bool keepdim) {
  const auto mask = reduce_mask(a, dims, "all");
  return reduce_into(ReduceOp::All, as_bool(a), mask, keepdim, DType::Bool, 1);
}

Tensor any(const Tensor& a, const Dims& dims, bool keepdim) {
  const auto mask = reduce_mask(a, dims, "any");
  return reduce_into(ReduceOp::Any, as_bool(a), mask, keepdim, DType::Bool, 0);
}

Tensor count_nonzero(const Tensor& a, const Dims& dims) {
  const auto mask = reduce_mask(a, dims, "count_nonzero");
  return reduce_into(ReduceOp::Sum, as_bool(a), mask, false, DType::Int64, 0);
}

namespace {
Tensor softmax_impl(const Tensor& a, int64_t dim, bool log) {
  const std::string_view name = log ? "log_softmax" : "softmax";
  check_not_float8(name, a.dtype());
  KILN_CHECK(a.is_floating_point(), name, ": expected a floating-point tensor, got ", a.dtype(), " (shape ", a.shape(),
             "); convert it first with .to(DType::Float32)");
  const int64_t d = wrap_dim(dim, a.dim(), name);
  Tensor out = empty(a.shape(), a.options());
  if (a.numel() == 0) return out;
  if (a.dim() == 0) {
    backend(a.device()).softmax(reshaped(out, {1}), reshaped(a, {1}), 0, log);
  } else {
    backend(a.device()).softmax(out, a, d, log);
  }
  return out;
}
}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, false); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, true); }

}  // namespace kiln::internal
