// Frontend of the indexing ops: index_select, gather, the scatter family, masked_select, nonzero,
// one_hot, embedding, sort/argsort/topk and tril/triu. Shape, dtype and device checks live here, once
// for every backend; index values are bounds-checked by the backend kernels, which read them.
// cat and stack are in concat.cpp.
#include <algorithm>
#include <string>
#include <utility>  // std::pair
#include <vector>

#include "kiln/tensor/backend.h"
#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/ops/index_checks.h"

namespace kiln::internal {
namespace {

// index_select's (and index_add's) index: 0-d or 1-D.
void check_vector_index(std::string_view op, const Tensor& index) {
  KILN_CHECK(index.dim() <= 1, op, ": expected a 0-d or 1-D index tensor, got shape ", index.shape());
}

// Outputs written in place must not hold two elements at one address (e.g. after expand()).
void check_writable(std::string_view op, const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    KILN_CHECK(t.stride(d) != 0 || t.size(d) <= 1, op, ": the tensor written in place has several elements at ",
               "one memory location (stride 0 in dim ", d, ", shape ", t.shape(), "); clone() it first");
  }
}

// The scatter checks of PyTorch: index, self (out) and src share a rank; index is no larger than src
// in any dim and no larger than self outside `dim`.
void check_scatter_shapes(std::string_view op, const Tensor& out, int64_t dim, const Tensor& index, const Tensor* src) {
  KILN_CHECK(index.dim() == out.dim(), op, ": the index (shape ", index.shape(), ") must have the rank of self (shape ",
             out.shape(), ")");
  if (src) {
    KILN_CHECK(src->dim() == index.dim(), op, ": src (shape ", src->shape(),
               ") must have the rank of the index (shape ", index.shape(), ")");
  }
  for (int64_t i = 0; i < index.dim(); ++i) {
    KILN_CHECK(i == dim || index.size(i) <= out.size(i), op, ": the index of shape ", index.shape(),
               " is larger than self of shape ", out.shape(), " in dim ", i, " (", index.size(i), " > ", out.size(i),
               "); only dim ", dim, " may differ");
    if (src) {
      KILN_CHECK(index.size(i) <= src->size(i), op, ": the index of shape ", index.shape(),
                 " is larger than src of shape ", src->shape(), " in dim ", i, " (", index.size(i), " > ", src->size(i),
                 ")");
    }
  }
}

// Every index is out of range when the indexed dim is empty; the backend never sees that case
// (zero-element tensors do not reach it), so it is reported here.
void check_dim_not_empty(std::string_view op, int64_t size, int64_t dim, int64_t index_count) {
  KILN_CHECK(size > 0 || index_count == 0, op, ": cannot index dim ", dim,
             " of size 0 (every index is out of range: expected 0 <= index < 0)");
}

// The op the backends name in a bad index's error (detail::IndexOpScope): a caller's label when one is open (a
// module's table, nn::Embedding), else op.
std::string index_op_name(std::string_view op) {
  const detail::IndexOpName outer = detail::IndexOpScope::current_name();
  return outer.empty() ? std::string(op) : outer.str();
}

// out.scatter_(dim, index, src) with src's values at index's positions (src already has out's dtype).
void scatter_into(std::string_view op, Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                  bool accumulate) {
  check_not_float8(op, out.dtype());
  if (index.numel() == 0) return;
  check_dim_not_empty(op, out.dim() ? out.size(dim) : 1, dim, index.numel());
  // src may be larger than index; the kernel reads the leading index.shape() block of it.
  Tensor src_view = as_strided(src, index.shape(), src.strides(), src.offset());
  if (src_view.is_alias_of(out)) src_view = clone(src_view, MemoryFormat::Contiguous);
  Tensor idx = index.is_alias_of(out) ? clone(index) : index;
  const std::string_view base = op.substr(0, op.find_last_not_of('_') + 1);
  try {
    detail::IndexOpScope scope(base);
    backend(out.device()).scatter(out, dim, idx, src_view, accumulate);
  } catch (const IndexError&) {
    throw;  // from a GPU kernel: it names its op already (and may be an earlier call's)
  } catch (const Error& e) {
    // A bad index: the kernel names the op already (this one, index_add or one_hot, or the caller's label).
    if (std::string_view(e.what()).starts_with(index_op_name(base))) throw;
    KILN_FAIL(op, ": ", e.what());
  }
  out.impl().storage()->bump_version();
}

Tensor& scatter_tensor_(std::string_view op, Tensor& a, int64_t dim, const Tensor& index, const Tensor& src,
                        bool accumulate) {
  check_defined(op, a, "self");
  check_defined(op, src, "src");
  const Tensor idx = index_tensor(op, index, a.device());
  check_same_device(op, a, src, "src");
  KILN_CHECK(src.dtype() == a.dtype(), op, ": expected src to have self's dtype ", a.dtype(), ", got ", src.dtype(),
             "; convert it with .to(DType::", dtype_enum_name(a.dtype()), ")");
  const int64_t d = wrap_dim(dim, a.dim(), op);
  check_scatter_shapes(op, a, d, idx, &src);
  check_writable(op, a);
  scatter_into(op, a, d, idx, src, accumulate);
  return a;
}

}  // namespace

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  check_defined("index_select", a, "the input");
  check_not_float8("index_select", a.dtype());
  const Tensor idx = index_tensor("index_select", index, a.device());
  check_vector_index("index_select", idx);
  const int64_t d = wrap_dim(dim, a.dim(), "index_select");
  if (a.dim() == 0) {
    KILN_CHECK(idx.numel() == 1, "index_select: a 0-d input takes an index of one element, got shape ", idx.shape());
    return squeeze(index_select(unsqueeze(a, 0), 0, idx), 0);
  }
  Shape shape = a.shape();
  shape[d] = idx.numel();
  Tensor out = empty(shape, a.options());
  if (out.numel() == 0) return out;
  check_dim_not_empty("index_select", a.size(d), d, idx.numel());
  backend(a.device()).index_select(out, a, d, idx.dim() == 0 ? unsqueeze(idx, 0) : idx);
  return out;
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  check_defined("gather", a, "the input");
  check_not_float8("gather", a.dtype());
  const Tensor idx = index_tensor("gather", index, a.device());
  const int64_t d = wrap_dim(dim, a.dim(), "gather");
  KILN_CHECK(idx.dim() == a.dim(), "gather: the index (shape ", idx.shape(), ") must have the input's rank (shape ",
             a.shape(), ")");
  for (int64_t i = 0; i < a.dim(); ++i) {
    KILN_CHECK(i == d || idx.size(i) <= a.size(i), "gather: the index of shape ", idx.shape(),
               " is larger than the input of shape ", a.shape(), " in dim ", i, " (", idx.size(i), " > ", a.size(i),
               "); only dim ", d, " may differ");
  }
  Tensor out = empty(idx.shape(), a.options());
  if (out.numel() == 0) return out;
  check_dim_not_empty("gather", a.dim() ? a.size(d) : 1, d, idx.numel());
  backend(a.device()).gather(out, a, d, idx);
  return out;
}

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined("scatter", a, "self");
  Tensor out = clone(a);
  return scatter_tensor_("scatter", out, dim, index, src, false);
}

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, Scalar value) {
  check_defined("scatter", a, "self");
  const Tensor idx = index_tensor("scatter", index, a.device());
  const int64_t d = wrap_dim(dim, a.dim(), "scatter");
  check_scatter_shapes("scatter", a, d, idx, nullptr);
  Tensor out = clone(a);
  // The value as a 0-d tensor seen with stride 0 everywhere: one element serves every position.
  const Tensor v = scalar_tensor(value, a.options());
  scatter_into("scatter", out, d, idx, as_strided(v, idx.shape(), Strides(idx.dim(), 0)), false);
  return out;
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined("scatter_add", a, "self");
  Tensor out = clone(a);
  return scatter_tensor_("scatter_add", out, dim, index, src, true);
}

Tensor& scatter_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_tensor_("scatter_", a, dim, index, src, false);
}

Tensor& scatter_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_tensor_("scatter_add_", a, dim, index, src, true);
}

namespace {

// index_add's and index_add_'s checks: the index as a tensor on a's device, and dim wrapped.
std::pair<Tensor, int64_t> checked_index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined("index_add", a, "self");
  check_defined("index_add", src, "source");
  Tensor idx = index_tensor("index_add", index, a.device());
  check_same_device("index_add", a, src, "source");
  check_vector_index("index_add", idx);
  KILN_CHECK(src.dtype() == a.dtype(), "index_add: expected source to have self's dtype ", a.dtype(), ", got ",
             src.dtype(), "; convert it with .to(DType::", dtype_enum_name(a.dtype()), ")");
  const int64_t d = wrap_dim(dim, a.dim(), "index_add");
  // source has self's shape with index.numel() at dim (0-d self: source 0-d or of one element).
  Shape expected = a.dim() == 0 ? Shape{} : a.shape();
  if (a.dim() > 0) expected[d] = idx.numel();
  KILN_CHECK(src.shape() == expected || (a.dim() == 0 && src.numel() == 1 && idx.numel() == 1),
             "index_add: source of shape ", src.shape(), " does not match self of shape ", a.shape(), " with ",
             idx.numel(), " indices in dim ", d, " (expected ", expected, ")");
  return {std::move(idx), d};
}

// out[idx[i]] += src[i] along d, after checked_index_add: a scatter_add whose index is the 1-D index seen along d
// (stride 0 elsewhere).
void add_indexed(Tensor& out, int64_t d, const Tensor& idx, const Tensor& src) {
  if (src.numel() == 0) return;
  Tensor out_v = out.dim() == 0 ? unsqueeze(out, 0) : out;
  Tensor src_v = out.dim() == 0 ? reshape(src, {1}) : src;
  Strides strides(out_v.dim(), 0);
  strides[d] = idx.dim() == 0 ? 0 : idx.stride(0);
  scatter_into("index_add", out_v, d, as_strided(idx, src_v.shape(), strides), src_v, true);
}

}  // namespace

Tensor& index_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  const auto [idx, d] = checked_index_add(a, dim, index, src);
  check_writable("index_add_", a);
  add_indexed(a, d, idx, src);
  return a;
}

Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  const auto [idx, d] = checked_index_add(a, dim, index, src);
  Tensor out = clone(a);
  add_indexed(out, d, idx, src);
  return out;
}

Tensor masked_select(const Tensor& a, const Tensor& mask) {
  check_defined("masked_select", a, "the input");
  check_not_float8("masked_select", a.dtype());
  check_defined("masked_select", mask, "the mask");
  check_same_device("masked_select", a, mask, "the mask");
  KILN_CHECK(mask.dtype() == DType::Bool, "masked_select: expected a Bool mask, got ", mask.dtype(),
             "; build one with a comparison (x > 0) or convert it with .to(DType::Bool)");
  const Shape shape = broadcast_shapes(a.shape(), mask.shape(), "masked_select");
  const int64_t n = numel(shape);
  if (n == 0) return empty({0}, a.options());
  // Flatten both (broadcast) operands, find the selected positions, and pick them.
  const Tensor flat_mask = reshape(contiguous(expand(mask, shape)), {n});
  const Tensor flat_a = reshape(contiguous(expand(a, shape)), {n});
  const Tensor positions = backend(a.device()).nonzero(flat_mask);  // (count, 1)
  return index_select(flat_a, 0, reshape(positions, {positions.size(0)}));
}

Tensor nonzero(const Tensor& a) {
  check_defined("nonzero", a, "the input");
  check_not_float8("nonzero", a.dtype());
  if (a.numel() == 0) return empty({0, a.dim()}, {.dtype = DType::Int64, .device = a.device()});
  return backend(a.device()).nonzero(a);
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  check_defined("one_hot", index, "the index");
  const Tensor idx = index_tensor("one_hot", index, index.device());
  KILN_CHECK(num_classes >= -1, "one_hot: num_classes must be -1 (inferred) or non-negative, got ", num_classes);
  // The class range is checked on the host (for -1 it is needed anyway), on every device, so the
  // message is one_hot's own (non-negative classes, num_classes) rather than scatter's. On a GPU this
  // reads the index back; the CUDA scatter synchronises to check its indices anyway.
  {
    KILN_CHECK(num_classes != -1 || idx.numel() > 0,
               "one_hot: cannot infer the number of classes from an empty index tensor; pass num_classes");
    const std::vector<int64_t> v = idx.to_vector<int64_t>();
    if (!v.empty()) {
      const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      KILN_CHECK(*lo >= 0, "one_hot: class values must be non-negative, got ", *lo);
      if (num_classes == -1) num_classes = *hi + 1;
      KILN_CHECK(*hi < num_classes, "one_hot: class value ", *hi, " is out of range for num_classes ", num_classes,
                 " (expected 0 <= value < ", num_classes, ")");
    }
  }
  Shape shape = idx.shape();
  shape.push_back(num_classes);
  Tensor out = zeros(shape, {.dtype = DType::Int64, .device = idx.device()});
  if (out.numel() == 0 && idx.numel() == 0) return out;
  check_dim_not_empty("one_hot", num_classes, idx.dim(), idx.numel());
  const Tensor column = unsqueeze(idx, -1);  // (..., 1)
  const Tensor one = scalar_tensor(1, {.dtype = DType::Int64, .device = idx.device()});
  scatter_into("one_hot", out, idx.dim(), column, as_strided(one, column.shape(), Strides(column.dim(), 0)), false);
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& index) {
  check_defined("embedding", weight, "the weight");
  check_not_float8("embedding", weight.dtype());
  KILN_CHECK(weight.dim() == 2, "embedding: expected a 2-D weight (num_embeddings, embedding_dim), got shape ",
             weight.shape());
  const Tensor idx = index_tensor("embedding", index, weight.device());
  const int64_t n = idx.numel(), dim = weight.size(1);
  Tensor out = empty({n, dim}, weight.options());  // (N, D)
  if (out.numel() > 0) {
    KILN_CHECK(weight.size(0) > 0, "embedding: the weight has no rows (shape ", weight.shape(),
               "), so every index is out of range");
    try {
      detail::IndexOpScope scope("embedding");  // or the caller's label, kept: nn::Embedding names its table
      backend(weight.device()).index_select(out, weight, 0, reshape(idx, {n}));
    } catch (const IndexError&) {
      throw;  // from a GPU kernel: it names its op already (and may be an earlier call's)
    } catch (const Error& e) {
      // A bad index: the CPU kernel names the op already (embedding, or the caller's label).
      const std::string_view what = e.what();
      KILN_FAIL(what.starts_with(index_op_name("embedding")) ? "" : "embedding: ", what, " (weight of shape ",
                weight.shape(), ", index of shape ", idx.shape(), ")");
    }
  }
  Shape shape = idx.shape();
  shape.push_back(dim);
  return view(out, shape);  // (..., D)
}

std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending, bool stable) {
  check_defined("sort", a, "the input");
  check_not_float8("sort", a.dtype());
  const int64_t d = wrap_dim(dim, a.dim(), "sort");
  Tensor values = empty(a.shape(), a.options());
  Tensor indices = empty(a.shape(), {.dtype = DType::Int64, .device = a.device()});
  if (a.numel() > 0) backend(a.device()).sort(values, indices, a, d, descending, stable);
  return {values, indices};
}

Tensor argsort(const Tensor& a, int64_t dim, bool descending) {
  return std::get<1>(sort(a, dim, descending, /*stable=*/true));
}

std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  check_defined("topk", a, "the input");
  check_not_float8("topk", a.dtype());
  const int64_t d = wrap_dim(dim, a.dim(), "topk");
  const int64_t n = a.dim() == 0 ? 1 : a.size(d);
  KILN_CHECK(k >= 0 && k <= n, "topk: k = ", k, " is out of range for dim ", d, " of size ", n, " (shape ", a.shape(),
             "); expected 0 <= k <= ", n);
  Shape shape = a.shape();
  if (a.dim() > 0) shape[d] = k;
  Tensor values = empty(shape, a.options());
  Tensor indices = empty(shape, {.dtype = DType::Int64, .device = a.device()});
  if (values.numel() > 0) backend(a.device()).topk(values, indices, a, k, d, largest, sorted);
  return {values, indices};
}

namespace {
// Zeroes, in every matrix of a copy of a, the elements j > i + diagonal (lower) or j < i + diagonal (upper),
// one row slice at a time (each slice covers all batch dims).
Tensor triangle(std::string_view op, const Tensor& a, int64_t diagonal, bool lower) {
  check_defined(op, a, "the input");
  KILN_CHECK(a.dim() >= 2, op, ": expected a tensor of at least 2 dims, got shape ", a.shape());
  Tensor out = clone(a);
  const int64_t m = a.size(-2), n = a.size(-1);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t begin = lower ? std::clamp<int64_t>(i + diagonal + 1, 0, n) : 0;
    const int64_t end = lower ? n : std::clamp<int64_t>(i + diagonal, 0, n);
    if (begin >= end) continue;
    Tensor part = narrow(narrow(out, -2, i, 1), -1, begin, end - begin);
    fill_(part, 0);
  }
  return out;
}
}  // namespace

Tensor tril(const Tensor& a, int64_t diagonal) { return triangle("tril", a, diagonal, true); }
Tensor triu(const Tensor& a, int64_t diagonal) { return triangle("triu", a, diagonal, false); }

}  // namespace kiln::internal
