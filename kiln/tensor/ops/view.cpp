// View ops: new shapes and strides over the same storage, never a copy (reshape copies only when it must).
#include <algorithm>
#include <numeric>

#include "kiln/tensor/checked_size.h"
#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/small_alloc.h"

namespace kiln::internal {
namespace {

Tensor make_view(const Tensor& t, Shape sizes, Strides strides, int64_t offset) {
  auto impl = make_pooled<TensorImpl>(t.impl().storage(), t.dtype(), std::move(sizes), std::move(strides), offset);
  impl->set_is_view(true);
  return Tensor(std::move(impl));
}

void check_defined(const Tensor& t, std::string_view op) { KILN_CHECK(t.defined(), op, ": the tensor is undefined"); }

// Strides that let `new_shape` view memory laid out as (old_shape, old_strides), or nothing when a copy is
// needed. Walks both shapes from the innermost dim, matching runs of old dims that are contiguous with
// each other ("chunks") against runs of new dims with the same number of elements.
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape) {
  Strides out(new_shape.size());
  if (numel(old_shape) == 0 || old_shape.empty()) return contiguous_strides(new_shape);
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    const bool chunk_ends = d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      out[view_d] = view_numel * chunk_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (d > 0) {
      chunk_stride = old_strides[d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

}  // namespace

Shape infer_shape(const Shape& shape, int64_t n, std::string_view op) {
  Shape out = shape;
  int64_t known = 1;
  bool overflow = false, zero = false;
  std::optional<size_t> infer;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      KILN_CHECK(!infer, op, ": only one dim can be inferred (-1) in shape ", shape);
      infer = i;
    } else {
      KILN_CHECK(out[i] >= 0, op, ": invalid size ", out[i], " in shape ", shape);
      overflow |= mul_overflows(known, out[i], &known);
      zero |= out[i] == 0;
    }
  }
  // A size 0 makes the product 0 even after a partial product overflowed (as numel()).
  if (zero) known = 0;
  KILN_CHECK(!overflow || zero, op, ": shape ", shape, " has more than 2^63-1 elements; it is invalid for a tensor of ",
             n, " elements");
  if (infer) {
    KILN_CHECK(known != 0 && n % known == 0, op, ": shape ", shape, " is invalid for a tensor of ", n, " elements");
    out[*infer] = n / known;
  } else {
    KILN_CHECK(known == n, op, ": shape ", shape, " is invalid for a tensor of ", n, " elements (it holds ", known,
               ")");
  }
  return out;
}

Tensor view(const Tensor& t, const Shape& shape) {
  check_defined(t, "view");
  Shape target = infer_shape(shape, t.numel(), "view");
  auto strides = view_strides(t.shape(), t.strides(), target);
  KILN_CHECK(strides.has_value(), "view: shape ", target, " is not compatible with the strides ", t.strides(),
             " of a tensor of shape ", t.shape(),
             " (a view cannot span non-contiguous dims); use reshape(), "
             "which copies when it must, or call .contiguous() first");
  return make_view(t, std::move(target), std::move(*strides), t.offset());
}

Tensor reshape(const Tensor& t, const Shape& shape) {
  check_defined(t, "reshape");
  Shape target = infer_shape(shape, t.numel(), "reshape");
  if (auto strides = view_strides(t.shape(), t.strides(), target)) {
    return make_view(t, std::move(target), std::move(*strides), t.offset());
  }
  return view(clone(t, MemoryFormat::Contiguous), target);
}

Tensor permute(const Tensor& t, const Dims& dims) {
  check_defined(t, "permute");
  const int64_t rank = t.dim();
  KILN_CHECK(static_cast<int64_t>(dims.size()) == rank, "permute: got ", dims.size(), " dims ", dims,
             " for a tensor of rank ", rank, "; give each dim exactly once");
  Shape sizes(rank);
  Strides strides(rank);
  std::vector<bool> seen(rank, false);
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t d = wrap_dim(dims[i], rank, "permute");
    KILN_CHECK(!seen[d], "permute: dim ", d, " appears twice in ", dims);
    seen[d] = true;
    sizes[i] = t.size(d);
    strides[i] = t.stride(d);
  }
  return make_view(t, std::move(sizes), std::move(strides), t.offset());
}

Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  check_defined(t, "transpose");
  if (t.dim() == 0) return t;
  const int64_t a = wrap_dim(dim0, t.dim(), "transpose"), b = wrap_dim(dim1, t.dim(), "transpose");
  Shape sizes = t.shape();
  Strides strides = t.strides();
  std::swap(sizes[a], sizes[b]);
  std::swap(strides[a], strides[b]);
  return make_view(t, std::move(sizes), std::move(strides), t.offset());
}

Tensor slice(const Tensor& t, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
  check_defined(t, "slice");
  KILN_CHECK(t.dim() > 0, "slice: cannot slice a 0-d tensor");
  KILN_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t d = wrap_dim(dim, t.dim(), "slice");
  const int64_t n = t.size(d);
  // Python semantics: negative bounds count from the end, then clamp into [0, n].
  auto clamp_bound = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  const int64_t b = start ? clamp_bound(*start) : 0;
  const int64_t e = std::max(b, end ? clamp_bound(*end) : n);
  Shape sizes = t.shape();
  Strides strides = t.strides();
  sizes[d] = e == b ? 0 : 1 + (e - b - 1) / step;  // ceil((e - b) / step) without overflow for a huge step
  // A dim of size 0 or 1 never steps, so its stride is free: keep it when stride * step would overflow.
  int64_t stepped = 0;
  if (!mul_overflows(strides[d], step, &stepped)) strides[d] = stepped;
  return make_view(t, std::move(sizes), std::move(strides), t.offset() + b * t.stride(d));
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  check_defined(t, "narrow");
  KILN_CHECK(t.dim() > 0, "narrow: cannot narrow a 0-d tensor");
  const int64_t d = wrap_dim(dim, t.dim(), "narrow");
  const int64_t n = t.size(d);
  if (start < 0) start += n;
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: range [", start, ", ", start + length,
             ") is out of bounds for dim ", d, " of size ", n, " (shape ", t.shape(), ")");
  return slice(t, d, start, start + length, 1);
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  check_defined(t, "select");
  KILN_CHECK(t.dim() > 0, "select: cannot index a 0-d tensor; use item() to read its value");
  const int64_t d = wrap_dim(dim, t.dim(), "select");
  const int64_t n = t.size(d);
  KILN_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d, " of size ", n,
             " (shape ", t.shape(), ")");
  if (index < 0) index += n;
  Shape sizes = t.shape();
  Strides strides = t.strides();
  sizes.erase(sizes.begin() + d);
  strides.erase(strides.begin() + d);
  return make_view(t, std::move(sizes), std::move(strides), t.offset() + index * t.stride(d));
}

Tensor expand(const Tensor& t, const Shape& shape) {
  check_defined(t, "expand");
  const int64_t rank = static_cast<int64_t>(shape.size()), old_rank = t.dim();
  KILN_CHECK(rank >= old_rank, "expand: the target shape ", shape, " has fewer dims than the tensor's shape ",
             t.shape());
  Shape sizes(rank);
  Strides strides(rank);
  for (int64_t i = rank - 1; i >= 0; --i) {
    const int64_t j = i - (rank - old_rank);  // matching dim of t, or < 0 for a new leading dim
    const int64_t old_size = j >= 0 ? t.size(j) : 1;
    int64_t size = shape[i];
    if (size == -1) {
      KILN_CHECK(j >= 0, "expand: -1 is not allowed for the new leading dim ", i, " in ", shape);
      size = old_size;
    }
    KILN_CHECK(size >= 0, "expand: invalid size ", size, " in ", shape);
    if (j >= 0 && old_size == size) {
      sizes[i] = size;
      strides[i] = t.stride(j);
    } else {
      KILN_CHECK(old_size == 1, "expand: the size ", old_size, " of dim ", j, " (shape ", t.shape(),
                 ") must be 1 to expand to ", size, " (target ", shape, ")");
      sizes[i] = size;
      strides[i] = 0;
    }
  }
  if (sizes == t.shape() && strides == t.strides()) return t;
  (void)numel(sizes, "expand");  // an expanded view may still not count more than 2^63-1 elements
  return make_view(t, std::move(sizes), std::move(strides), t.offset());
}

Tensor squeeze(const Tensor& t) {
  check_defined(t, "squeeze");
  Shape sizes;
  Strides strides;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1) {
      sizes.push_back(t.size(d));
      strides.push_back(t.stride(d));
    }
  }
  return make_view(t, std::move(sizes), std::move(strides), t.offset());
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  check_defined(t, "squeeze");
  if (t.dim() == 0) {
    wrap_dim(dim, 0, "squeeze");
    return t;
  }
  const int64_t d = wrap_dim(dim, t.dim(), "squeeze");
  if (t.size(d) != 1) return t;  // as PyTorch: squeezing a dim of size > 1 leaves the tensor unchanged
  Shape sizes = t.shape();
  Strides strides = t.strides();
  sizes.erase(sizes.begin() + d);
  strides.erase(strides.begin() + d);
  return make_view(t, std::move(sizes), std::move(strides), t.offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  check_defined(t, "unsqueeze");
  const int64_t d = wrap_dim(dim, t.dim() + 1, "unsqueeze");
  Shape sizes = t.shape();
  Strides strides = t.strides();
  const int64_t stride = d < t.dim() ? t.stride(d) * t.size(d) : 1;
  sizes.insert(sizes.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return make_view(t, std::move(sizes), std::move(strides), t.offset());
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  check_defined(t, "flatten");
  if (t.dim() == 0) return reshape(t, {1});
  const int64_t s = wrap_dim(start_dim, t.dim(), "flatten"), e = wrap_dim(end_dim, t.dim(), "flatten");
  KILN_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim, " for shape ", t.shape());
  if (s == e) return t;
  Shape sizes(t.shape().begin(), t.shape().begin() + s);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= t.size(d);
  sizes.push_back(merged);
  sizes.insert(sizes.end(), t.shape().begin() + e + 1, t.shape().end());
  return reshape(t, sizes);
}

Tensor unflatten(const Tensor& t, int64_t dim, const Shape& sizes) {
  check_defined(t, "unflatten");
  KILN_CHECK(!sizes.empty(), "unflatten: sizes must not be empty");
  const int64_t d = wrap_dim(dim, t.dim(), "unflatten");
  Shape inner = infer_shape(sizes, t.size(d), "unflatten");
  Shape shape(t.shape().begin(), t.shape().begin() + d);
  shape.insert(shape.end(), inner.begin(), inner.end());
  shape.insert(shape.end(), t.shape().begin() + d + 1, t.shape().end());
  return view(t, shape);
}

Tensor as_strided(const Tensor& t, const Shape& sizes, const Strides& strides, std::optional<int64_t> offset) {
  check_defined(t, "as_strided");
  KILN_CHECK(sizes.size() == strides.size(), "as_strided: ", sizes.size(), " sizes ", sizes, " but ", strides.size(),
             " strides ", strides);
  const int64_t off = offset.value_or(t.offset());
  KILN_CHECK(off >= 0, "as_strided: negative storage offset ", off);
  int64_t last = off;
  for (size_t i = 0; i < sizes.size(); ++i) {
    KILN_CHECK(sizes[i] >= 0 && strides[i] >= 0, "as_strided: sizes and strides must be non-negative, got ", sizes,
               " and ", strides);
    if (sizes[i] == 0) last = -1;
    int64_t span = 0;
    if (last >= 0) {
      KILN_CHECK(!mul_overflows(sizes[i] - 1, strides[i], &span) && !add_overflows(last, span, &last),
                 "as_strided: sizes ", sizes, ", strides ", strides, " and offset ", off,
                 " reach beyond element 2^63-1");
    }
  }
  (void)numel(sizes, "as_strided");
  const int64_t capacity = static_cast<int64_t>(t.impl().storage()->nbytes() / t.element_size());
  KILN_CHECK(last < capacity, "as_strided: sizes ", sizes, ", strides ", strides, " and offset ", off,
             " reach element ", last, " but the storage holds ", capacity, " elements");
  return make_view(t, sizes, strides, off);
}

Tensor diagonal(const Tensor& t, int64_t offset, int64_t dim1, int64_t dim2) {
  check_defined(t, "diagonal");
  KILN_CHECK(t.dim() >= 2, "diagonal: needs a tensor of at least 2 dims, got shape ", t.shape());
  const int64_t a = wrap_dim(dim1, t.dim(), "diagonal"), b = wrap_dim(dim2, t.dim(), "diagonal");
  KILN_CHECK(a != b, "diagonal: dim1 and dim2 must differ, both are ", a);
  int64_t start = t.offset(), len;
  if (offset >= 0) {
    len = std::max<int64_t>(std::min(t.size(a), t.size(b) - offset), 0);
    if (len > 0) start += offset * t.stride(b);
  } else {
    len = std::max<int64_t>(std::min(t.size(a) + offset, t.size(b)), 0);
    if (len > 0) start -= offset * t.stride(a);
  }
  Shape sizes;
  Strides strides;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d == a || d == b) continue;
    sizes.push_back(t.size(d));
    strides.push_back(t.stride(d));
  }
  sizes.push_back(len);
  strides.push_back(t.stride(a) + t.stride(b));
  return make_view(t, std::move(sizes), std::move(strides), start);
}

std::vector<Tensor> split_with_sizes(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim) {
  check_defined(t, "split_with_sizes");
  KILN_CHECK(t.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t d = wrap_dim(dim, t.dim(), "split_with_sizes");
  int64_t total = 0;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "split_with_sizes: negative size in ", sizes);
    total += s;
  }
  KILN_CHECK(total == t.size(d), "split_with_sizes: sizes ", sizes, " add up to ", total, " but dim ", d, " has size ",
             t.size(d));
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(narrow(t, d, start, s));
    start += s;
  }
  return parts;
}

std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim) {
  check_defined(t, "split");
  KILN_CHECK(t.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t d = wrap_dim(dim, t.dim(), "split");
  const int64_t n = t.size(d);
  KILN_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be positive, got ", split_size);
  if (n == 0) return {t};
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += split_size) sizes.push_back(std::min(split_size, n - start));
  return split_with_sizes(t, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim) {
  check_defined(t, "chunk");
  KILN_CHECK(chunks > 0, "chunk: the number of chunks must be positive, got ", chunks);
  KILN_CHECK(t.dim() > 0, "chunk: cannot chunk a 0-d tensor");
  const int64_t d = wrap_dim(dim, t.dim(), "chunk");
  const int64_t n = t.size(d);
  const int64_t split_size = std::max<int64_t>((n + chunks - 1) / chunks, 1);
  return split(t, split_size, d);
}

std::vector<Tensor> unbind(const Tensor& t, int64_t dim) {
  check_defined(t, "unbind");
  const int64_t d = wrap_dim(dim, t.dim(), "unbind");
  KILN_CHECK(t.dim() > 0, "unbind: cannot unbind a 0-d tensor");
  std::vector<Tensor> parts;
  for (int64_t i = 0; i < t.size(d); ++i) parts.push_back(select(t, d, i));
  return parts;
}

}  // namespace kiln::internal
