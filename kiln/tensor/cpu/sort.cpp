// CPU kernels: sort and topk along one dim, one row (a 1-D line along dim) per task.
//
// Each row is copied into (key, original position) pairs and ordered with a comparator that puts NaN
// above every number (as PyTorch does) and breaks ties by position. With that total order std::sort
// gives the same result as a stable sort, so `stable` costs nothing extra and results never depend on
// the thread count.
#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/parallel.h"
#include "kiln/tensor/cpu/strided_loop.h"
#include "kiln/tensor/dispatch.h"

namespace kiln::cpu {
namespace {

template <typename K>
bool is_nan(K v) {
  if constexpr (std::is_floating_point_v<K>) return std::isnan(v);
  else return false;
}

// Ascending order with NaN last, ties by position.
template <typename K>
struct Ascending {
  bool operator()(const std::pair<K, int64_t>& x, const std::pair<K, int64_t>& y) const {
    const bool xn = is_nan(x.first), yn = is_nan(y.first);
    if (xn || yn) return xn == yn ? x.second < y.second : yn;
    if (x.first != y.first) return x.first < y.first;
    return x.second < y.second;
  }
};

// Descending order with NaN first, ties by position.
template <typename K>
struct Descending {
  bool operator()(const std::pair<K, int64_t>& x, const std::pair<K, int64_t>& y) const {
    const bool xn = is_nan(x.first), yn = is_nan(y.first);
    if (xn || yn) return xn == yn ? x.second < y.second : xn;
    if (x.first != y.first) return x.first > y.first;
    return x.second < y.second;
  }
};

// Calls fn(row, a_base, values_base, indices_base) for every row along `dim`, spread over the pool.
// Each task gets its own scratch vector of (key, position) pairs sized to the row.
template <typename T, typename Fn>
void for_each_row(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, const Fn& fn) {
  Geometry ag = geometry_of(a.shape(), a.strides());
  Geometry vg = geometry_of(values.shape(), values.strides());
  Geometry ig = geometry_of(indices.shape(), indices.strides());
  const Shape rows_shape = erase_dim(ag.shape, dim);
  const int64_t rows = numel(rows_shape), n = ag.shape[dim];
  const int64_t grain = std::max<int64_t>(1, kGrainSize / 8 / std::max<int64_t>(n, 1));
  parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    StridedWalker<3> w(rows_shape,
                       {erase_dim(ag.strides, dim), erase_dim(vg.strides, dim), erase_dim(ig.strides, dim)});
    w.seek(begin);
    std::vector<std::pair<compute_t<T>, int64_t>> scratch(static_cast<size_t>(n));
    for (int64_t r = begin; r < end; ++r, w.next()) fn(scratch, w.offset(0), w.offset(1), w.offset(2));
  });
}

// Orders each row along dim (descending, or ascending) and writes its first k elements, with their positions, to
// values and indices: the whole row for sort (k absent), the k extremes for topk. A topk result is always sorted:
// the order is free when sorted == false, and a sorted result costs little more.
template <typename T>
void sort_kernel(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, std::optional<int64_t> k,
                 bool descending) {
  using K = compute_t<T>;
  const int64_t n = geometry_of(a.shape(), a.strides()).shape[dim], count = k.value_or(n);
  const int64_t as = a.dim() ? a.stride(dim) : 1, vs = a.dim() ? values.stride(dim) : 1,
                is = a.dim() ? indices.stride(dim) : 1;
  const T* src = a.data_ptr<T>();
  T* vp = values.data_ptr<T>();
  int64_t* ip = indices.data_ptr<int64_t>();
  const auto order = [&](auto& row, auto less) {
    if (count == n) std::sort(row.begin(), row.end(), less);
    else std::partial_sort(row.begin(), row.begin() + count, row.end(), less);
  };
  for_each_row<T>(values, indices, a, dim, [&](auto& row, int64_t a0, int64_t v0, int64_t i0) {
    for (int64_t j = 0; j < n; ++j) row[j] = {static_cast<K>(src[a0 + j * as]), j};
    if (descending) order(row, Descending<K>{});
    else order(row, Ascending<K>{});
    for (int64_t j = 0; j < count; ++j) {
      vp[v0 + j * vs] = src[a0 + row[j].second * as];  // the original element: no rounding through K
      ip[i0 + j * is] = row[j].second;
    }
  });
}

}  // namespace

void CpuBackend::sort(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, bool descending,
                      bool stable) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    sort_kernel<T>(values, indices, a, dim, std::nullopt, descending);
  });
}

void CpuBackend::topk(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t k, int64_t dim,
                      bool largest, bool sorted) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    sort_kernel<T>(values, indices, a, dim, k, largest);
  });
}

}  // namespace kiln::cpu
