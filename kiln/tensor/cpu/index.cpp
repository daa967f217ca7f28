// CPU kernels: index_select, gather, scatter and nonzero over arbitrary strides.
//
// Bounds are checked here, element by element, because only the kernel reads the index values; an
// out-of-range index throws a kiln::Error naming the op, the value and the valid range (the thread
// pool carries it back to the caller). The op is the one the user called (detail::IndexOpScope: embedding,
// index_add, or a module's table), as the CUDA backend names it, else the kernel's own name.
#include <cstring>  // std::memcpy for the contiguous index_select rows
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/parallel.h"
#include "kiln/tensor/cpu/strided_loop.h"
#include "kiln/tensor/dispatch.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::cpu {
namespace {

// The op to name in an index error: the user's (read on the calling thread: the pool's threads have no scope).
// The name is made only for an error.
kiln::detail::IndexOpName user_op(std::string_view kernel) {
  const kiln::detail::IndexOpName op = kiln::detail::IndexOpScope::current_name();
  return op.empty() ? kiln::detail::IndexOpName{.text = kernel} : op;
}

[[noreturn]] void throw_out_of_range(const kiln::detail::IndexOpName& op, int64_t value, int64_t dim, int64_t size) {
  KILN_FAIL(op.str(), ": index ", value, " is out of range for dim ", dim, " of size ", size,
            " (expected 0 <= index < ", size, ")");
}

inline void check_index(const kiln::detail::IndexOpName& op, int64_t value, int64_t dim, int64_t size) {
  if (value < 0 || value >= size) [[unlikely]]
    throw_out_of_range(op, value, dim, size);
}

// out[p] = a[p with coordinate `dim` replaced by index[p]] for every position p of `shape`.
// index_strides may be 0 in dims the index does not vary along (index_select's expanded 1-D index).
template <typename T>
void gather_kernel(const kiln::detail::IndexOpName& op, const Tensor& out, const Tensor& a, int64_t dim,
                   const int64_t* index, const Strides& index_strides) {
  Geometry og = geometry_of(out.shape(), out.strides());
  Geometry ag = geometry_of(a.shape(), a.strides());
  const int64_t a_dim_size = ag.shape[dim], a_dim_stride = ag.strides[dim];
  Strides a_strides = ag.strides;
  a_strides[dim] = 0;  // the index supplies this coordinate
  Strides i_strides = out.dim() == 0 ? Strides{0} : index_strides;
  T* o = out.data_ptr<T>();
  const T* src = a.data_ptr<T>();
  parallel_for(0, out.numel(), kGrainSize / 4, [&](int64_t begin, int64_t end) {
    StridedWalker<3> w(og.shape, {og.strides, a_strides, i_strides});
    w.seek(begin);
    for (int64_t i = begin; i < end; ++i, w.next()) {
      const int64_t v = index[w.offset(2)];
      check_index(op, v, dim, a_dim_size);
      o[w.offset(0)] = src[w.offset(1) + v * a_dim_stride];
    }
  });
}

// index_select on contiguous a and out: whole rows of `inner` elements move with one memcpy.
template <typename T>
void index_select_contiguous(const kiln::detail::IndexOpName& op, const Tensor& out, const Tensor& a, int64_t dim,
                             const Tensor& index) {
  const Shape& shape = a.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (int64_t d = dim + 1; d < a.dim(); ++d) inner *= shape[d];
  const int64_t size = shape[dim], n = index.numel(), index_stride = index.dim() == 0 ? 0 : index.stride(0);
  const int64_t* idx = index.data_ptr<int64_t>();
  T* o = out.data_ptr<T>();
  const T* src = a.data_ptr<T>();
  parallel_for(0, outer * n, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(inner, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   const int64_t j = r % n, block = r / n;
                   const int64_t v = idx[j * index_stride];
                   check_index(op, v, dim, size);
                   std::memcpy(o + r * inner, src + (block * size + v) * inner, sizeof(T) * inner);
                 }
               });
}

// out[p with coordinate dim = index[q]] = src[q] (or +=) for every position q of index's shape.
// Work is split over the positions that differ outside `dim`; each task walks its positions for every
// step along `dim` in order, so two tasks never write the same element and accumulation needs no atomics
// (and duplicates are applied in index order, deterministically).
template <typename T>
void scatter_kernel(const kiln::detail::IndexOpName& op, const Tensor& out, int64_t dim, const Tensor& index,
                    const Tensor& src, bool accumulate) {
  Geometry og = geometry_of(out.shape(), out.strides());
  Geometry ig = geometry_of(index.shape(), index.strides());
  Geometry sg = geometry_of(src.shape(), src.strides());
  const int64_t out_size = og.shape[dim], out_stride = og.strides[dim];
  const int64_t steps = ig.shape[dim], i_stride = ig.strides[dim], s_stride = sg.strides[dim];
  const Shape rows_shape = erase_dim(ig.shape, dim);
  const int64_t rows = numel(rows_shape);
  T* o = out.data_ptr<T>();
  const int64_t* idx = index.data_ptr<int64_t>();
  const T* s = src.data_ptr<T>();
  parallel_for(0, rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(steps, 1)),
               [&](int64_t begin, int64_t end) {
                 StridedWalker<3> w(
                     rows_shape, {erase_dim(og.strides, dim), erase_dim(ig.strides, dim), erase_dim(sg.strides, dim)});
                 for (int64_t t = 0; t < steps; ++t) {
                   w.seek(begin);
                   for (int64_t r = begin; r < end; ++r, w.next()) {
                     const int64_t v = idx[w.offset(1) + t * i_stride];
                     check_index(op, v, dim, out_size);
                     T& target = o[w.offset(0) + v * out_stride];
                     const T value = s[w.offset(2) + t * s_stride];
                     if (accumulate) {
                       using C = compute_t<T>;
                       if constexpr (std::is_same_v<T, bool>) target = target || value;
                       else target = T(static_cast<C>(static_cast<C>(target) + static_cast<C>(value)));
                     } else {
                       target = value;
                     }
                   }
                 }
               });
}

template <typename T>
bool is_nonzero(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return static_cast<float>(v) != 0.0f;
  else return v != T(0);
}

}  // namespace

void CpuBackend::index_select(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  // a (..., S, ...), index (n,), out (..., n, ...)
  const kiln::detail::IndexOpName op = user_op("index_select");
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.dim() > 0 && a.is_contiguous() && out.is_contiguous()) {
      index_select_contiguous<T>(op, out, a, dim, index);
      return;
    }
    Strides index_strides(std::max<int64_t>(out.dim(), 1), 0);
    index_strides[dim] = index.dim() == 0 ? 0 : index.stride(0);
    gather_kernel<T>(op, out, a, dim, index.data_ptr<int64_t>(), index_strides);
  });
}

void CpuBackend::gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  const kiln::detail::IndexOpName op = user_op("gather");
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    gather_kernel<T>(op, out, a, dim, index.data_ptr<int64_t>(), index.strides());
  });
}

void CpuBackend::scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  const kiln::detail::IndexOpName op = user_op(accumulate ? "scatter_add" : "scatter");
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_kernel<T>(op, out, dim, index, src, accumulate);
  });
}

Tensor CpuBackend::nonzero(const Tensor& a) {
  // Two passes over fixed chunks: count per chunk, then each chunk writes its coordinates from its
  // prefix-sum position, so the rows come out in row-major order.
  const int64_t total = a.numel(), rank = a.dim();
  const int64_t chunks =
      std::max<int64_t>(1, std::min<int64_t>((total + kGrainSize - 1) / kGrainSize, 4 * num_threads()));
  std::vector<int64_t> counts(static_cast<size_t>(chunks) + 1, 0);
  Tensor result;
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Geometry g = geometry_of(a.shape(), a.strides());
    const T* p = a.data_ptr<T>();
    auto chunk_range = [&](int64_t c) {
      return std::pair<int64_t, int64_t>{total * c / chunks, total * (c + 1) / chunks};
    };
    parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        auto [begin, end] = chunk_range(c);
        StridedWalker<1> w(g.shape, {g.strides});
        w.seek(begin);
        int64_t n = 0;
        for (int64_t i = begin; i < end; ++i, w.next()) n += is_nonzero(p[w.offset(0)]);
        counts[c + 1] = n;
      }
    });
    for (int64_t c = 0; c < chunks; ++c) counts[c + 1] += counts[c];
    result = internal::empty({counts[chunks], rank}, {.dtype = DType::Int64, .device = a.device()});
    if (counts[chunks] == 0 || rank == 0) return;
    int64_t* out = result.data_ptr<int64_t>();
    parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        auto [begin, end] = chunk_range(c);
        StridedWalker<1> w(g.shape, {g.strides});
        w.seek(begin);
        int64_t* row = out + counts[c] * rank;
        for (int64_t i = begin; i < end; ++i, w.next()) {
          if (!is_nonzero(p[w.offset(0)])) continue;
          for (int64_t d = 0; d < rank; ++d) row[d] = w.index()[d];
          row += rank;
        }
      }
    });
  });
  return result;
}

}  // namespace kiln::cpu
