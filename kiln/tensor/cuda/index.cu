// CUDA backend: index_select, gather, scatter (assign and accumulate) and nonzero over arbitrary strides.
//
// Bounds: a kernel cannot throw, so the first out-of-range index is recorded in the device's error slot and
// the host throws the CPU backend's message at its next index op or synchronisation, without waiting for the
// kernel (kiln/tensor/cuda/index_errors.h). Out-of-range indices are skipped by the kernel, so nothing is
// written outside the tensor.
//
// gather and index_select only move elements, so they run on unsigned integers of the element's size
// (4 instantiations in all); scatter with accumulate adds in the real type with atomics, except for
// floating-point types in deterministic mode (kiln/tensor/determinism.h): there the (target, position)
// pairs are radix-sorted by target (stably, so each target's contributions stay in index order) and one
// thread per target sums them in that order — the same bits on every run. Plain scatter in deterministic
// mode sorts the same way so that, of duplicate indices, the last in index order wins (as on the CPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <thrust/iterator/counting_iterator.h>
#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <type_traits>

#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/cuda/device_types.cuh"  // device_t, to_compute, from_compute
#include "kiln/tensor/cuda/index_errors.h"    // IndexReport, report_bad_index
#include "kiln/tensor/determinism.h"          // kiln::deterministic
#include "kiln/tensor/dispatch.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxDims = 16;
constexpr int kThreads = 256;

// A shape walked in row-major order with the strides of up to three tensors (in elements).
// A 0-d tensor is seen as 1-D of one element.
struct Walk {
  int rank = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[3][kMaxDims];
};

// Offsets of the three tensors at row-major position i of the walk.
__device__ __forceinline__ void walk_offsets(const Walk& w, int64_t i, int64_t (&off)[3]) {
  off[0] = off[1] = off[2] = 0;
  for (int d = w.rank - 1; d >= 0; --d) {
    const int64_t size = w.sizes[d];
    const int64_t c = i % size;
    i /= size;
    off[0] += c * w.strides[0][d];
    off[1] += c * w.strides[1][d];
    off[2] += c * w.strides[2][d];
  }
}

Walk make_walk(const char* op, const Shape& shape, const Strides& s0, const Strides& s1, const Strides& s2) {
  KILN_CHECK_AS(NotImplementedError, static_cast<int>(shape.size()) <= kMaxDims, op, ": tensors of more than ",
                kMaxDims, " dims are not supported on CUDA (got ", shape.size(), ")");
  Walk w{};
  if (shape.empty()) {
    w.rank = 1;
    w.sizes[0] = 1;
    w.strides[0][0] = w.strides[1][0] = w.strides[2][0] = 0;
    return w;
  }
  w.rank = static_cast<int>(shape.size());
  for (int d = 0; d < w.rank; ++d) {
    w.sizes[d] = shape[d];
    w.strides[0][d] = s0.empty() ? 0 : s0[d];
    w.strides[1][d] = s1.empty() ? 0 : s1[d];
    w.strides[2][d] = s2.empty() ? 0 : s2[d];
  }
  return w;
}

Strides strides_or_empty(const Tensor& t) { return t.dim() == 0 ? Strides{} : t.strides(); }

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(b, int64_t{1} << 30));
}

using detail::IndexReport;
using detail::report_bad_index;

// One op call's bounds report (kiln/tensor/cuda/index_errors.h): an earlier call's error is thrown here, and this
// call's kernels record theirs without the host waiting for them.
class IndexCheck {
 public:
  IndexCheck(const char* op, const Tensor& like, int64_t dim, int64_t size, cudaStream_t stream)
      : device_(like.device().index()), stream_(stream), report_(detail::begin_index_launch(device_, op, dim, size)) {}
  const IndexReport& report() const { return report_; }
  void done() const { detail::end_index_launch(device_, stream_); }

 private:
  int device_;
  cudaStream_t stream_;
  IndexReport report_;
};

// The loop of the index kernels, grid-stride over the n positions of the walk: v = index[off[kIndex]] where off
// are the position's offsets; body(i, off, v) when 0 <= v < dim_size, else v is reported (report_bad_index) and
// skip(i) runs instead, so nothing is written outside the tensor.
template <int kIndex, typename Body, typename Skip>
__device__ __forceinline__ void for_each_index(const Walk& w, int64_t n, const int64_t* index, int64_t dim_size,
                                               const IndexReport& err, Body&& body, Skip&& skip) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    walk_offsets(w, i, off);
    const int64_t v = index[off[kIndex]];
    if (v < 0 || v >= dim_size) {
      report_bad_index(err, v);
      skip(i);
      continue;
    }
    body(i, off, v);
  }
}

// out[p] = a[p with coordinate `dim` replaced by index[p]]; walk tensors: 0 out, 1 a (dim stride 0), 2 index.
template <typename U>
__global__ void gather_kernel(Walk w, int64_t n, U* out, const U* a, const int64_t* index, int64_t a_dim_stride,
                              int64_t a_dim_size, IndexReport err) {
  for_each_index<2>(
      w, n, index, a_dim_size, err,
      [&](int64_t, const int64_t* off, int64_t v) { out[off[0]] = a[off[1] + v * a_dim_stride]; }, [](int64_t) {});
}

template <typename F>
void visit_element_size(size_t size, F&& f) {
  switch (size) {
    case 1: f(TypeTag<uint8_t>{}); return;
    case 2: f(TypeTag<uint16_t>{}); return;
    case 4: f(TypeTag<uint32_t>{}); return;
    case 8: f(TypeTag<uint64_t>{}); return;
    default: KILN_FAIL("cuda index: unexpected element size ", size);
  }
}

// Shared by gather and index_select: index_strides has out's rank (0 where the index does not vary).
void run_gather(const char* op, const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index,
                const Strides& index_strides) {
  cudaStream_t stream = stream_for(out);
  const int64_t a_dim_size = a.dim() == 0 ? 1 : a.size(dim);
  const int64_t a_dim_stride = a.dim() == 0 ? 0 : a.stride(dim);
  Strides a_strides = strides_or_empty(a);
  if (!a_strides.empty()) a_strides[dim] = 0;  // the index supplies this coordinate
  const Walk w = make_walk(op, out.shape(), strides_or_empty(out), a_strides, index_strides);
  const int64_t n = out.numel();
  IndexCheck check(op, out, dim, a_dim_size, stream);
  visit_element_size(out.element_size(), [&](auto tag) {
    using U = typename decltype(tag)::type;
    gather_kernel<U><<<blocks_for(n), kThreads, 0, stream>>>(
        w, n, static_cast<U*>(out.data_ptr()), static_cast<const U*>(a.data_ptr()), index.data_ptr<int64_t>(),
        a_dim_stride, a_dim_size, check.report());
    KILN_CUDA_CHECK_LAUNCH(op);
  });
  check.done();
}

// ---- index_select along dim 0 of row-major rows (an embedding's lookup) ----

// out[r] = a[index[r]] for rows of `width` elements of U (U of 16 bytes where the rows allow), out's rows contiguous
// and a's `a_row_stride` apart: a block per row at a time (grid-stride over the rows), its threads across the row.
// A row whose index is out of range is reported and left unwritten.
template <typename U>
__global__ void __launch_bounds__(kThreads)
    select_rows_kernel(U* out, const U* a, int64_t a_row_stride, const int64_t* index, int64_t index_stride,
                       int64_t rows, int64_t width, int64_t a_rows, IndexReport err) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t v = index[r * index_stride];
    if (v < 0 || v >= a_rows) {
      if (threadIdx.x == 0) report_bad_index(err, v);
      continue;
    }
    const U* src = a + v * a_row_stride;
    U* dst = out + r * width;
    for (int64_t c = threadIdx.x; c < width; c += kThreads) dst[c] = src[c];
  }
}

// Whether index_select(out, a, 0, index) is an embedding's lookup that select_rows_kernel takes: a (V, d) with
// contiguous rows, out (N, d) contiguous, index 1-D.
bool select_rows_applies(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  return dim == 0 && a.dim() == 2 && out.dim() == 2 && index.dim() == 1 && a.stride(1) == 1 && out.is_contiguous() &&
         out.size(1) == a.size(1) && out.numel() > 0;
}

void select_rows(const Tensor& out, const Tensor& a, const Tensor& index, const IndexReport& err, cudaStream_t stream) {
  const int64_t rows = out.size(0), d = out.size(1), elem = static_cast<int64_t>(out.element_size());
  const auto launch = [&](auto tag, int64_t unit) {  // rows as units of `unit` bytes (U's size)
    using U = typename decltype(tag)::type;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 16));
    select_rows_kernel<U><<<blocks, kThreads, 0, stream>>>(
        static_cast<U*>(out.data_ptr()), static_cast<const U*>(a.data_ptr()), a.stride(0) * elem / unit,
        index.data_ptr<int64_t>(), index.stride(0), rows, d * elem / unit, a.size(0), err);
  };
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if ((d * elem) % 16 == 0 && (a.stride(0) * elem) % 16 == 0 && aligned16(out.data_ptr()) && aligned16(a.data_ptr())) {
    launch(TypeTag<uint4>{}, 16);
  } else {
    visit_element_size(out.element_size(), [&](auto tag) { launch(tag, elem); });
  }
  KILN_CUDA_CHECK_LAUNCH("index_select");
}

// ---- scatter ----

// Byte add through a compare-and-swap on the aligned 32-bit word holding it (allocations are at least
// 4-byte aligned, so the word lies inside the tensor's allocation). Wraps modulo 256 as the CPU does.
__device__ __forceinline__ void atomic_add_u8(uint8_t* address, uint8_t value) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(address);
  unsigned int* word = reinterpret_cast<unsigned int*>(addr & ~uintptr_t{3});
  const unsigned int shift = static_cast<unsigned int>(addr & 3) * 8;
  unsigned int old = *word, assumed;
  do {
    assumed = old;
    const unsigned int byte = ((assumed >> shift) + value) & 0xffu;
    const unsigned int next = (assumed & ~(0xffu << shift)) | (byte << shift);
    old = atomicCAS(word, assumed, next);
  } while (old != assumed);
}

template <typename D>
__device__ __forceinline__ void atomic_accumulate(D* target, D value) {
  if constexpr (std::is_same_v<D, bool>) {
    if (value) *target = true;  // Bool "+" is or: every racing writer stores the same value
  } else if constexpr (std::is_same_v<D, uint8_t>) {
    atomic_add_u8(target, value);
  } else if constexpr (std::is_same_v<D, int64_t>) {
    // Two's complement: unsigned addition wraps to the same bits as signed addition.
    atomicAdd(reinterpret_cast<unsigned long long*>(target), static_cast<unsigned long long>(value));
  } else {
    atomicAdd(target, value);  // int, float, double, __half, __nv_bfloat16 (sm_80+)
  }
}

// For every position q of index's shape: out[q with coordinate dim = index[q]] (+)= src[q].
// walk tensors: 0 out (dim stride 0), 1 index, 2 src.
template <typename D, bool kAccumulate>
__global__ void scatter_kernel(Walk w, int64_t n, D* out, const int64_t* index, const D* src, int64_t out_dim_stride,
                               int64_t out_dim_size, IndexReport err) {
  for_each_index<1>(
      w, n, index, out_dim_size, err,
      [&](int64_t, const int64_t* off, int64_t v) {
        D* target = out + off[0] + v * out_dim_stride;
        if constexpr (kAccumulate) atomic_accumulate(target, src[off[2]]);
        else *target = src[off[2]];  // duplicates: one of the writers wins, as in PyTorch
      },
      [](int64_t) {});
}

// ---- index_add along dim 0 of row-major rows (an embedding's gradient) ----

constexpr int kRowsPerBlock = 32;  // rows of src one block adds, in index order
constexpr int kRowThreads = 128;   // columns one block covers

// out[index[r]] += src[r] for the rows r of src (N, d), out (V, d): rows d elements long with column stride 1, `index`
// read at r * index_stride. Block (x, y) takes columns x * kRowThreads + thread and rows y * kRowsPerBlock onwards.
// Each thread sums its column over consecutive rows that share an index, in compute precision, and adds the sum to
// out with one atomic where the index changes: an index that repeats in a run (a token-type table's 2 rows, a padded
// batch's padding token) costs one atomic per run instead of one per row, so the adds no longer queue up on a few
// addresses. Rows whose index is out of range are reported and skipped.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    index_add_rows_kernel(device_t<T>* out, int64_t out_row_stride, const device_t<T>* src, int64_t src_row_stride,
                          const int64_t* index, int64_t index_stride, int64_t rows, int64_t d, int64_t out_rows,
                          IndexReport err) {
  using C = compute_t<T>;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock;
  const int64_t r1 = r0 + kRowsPerBlock < rows ? r0 + kRowsPerBlock : rows;
  int64_t current = -1;  // the index of the run being summed
  C acc = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t v = index[r * index_stride];
    if (v < 0 || v >= out_rows) {
      if (threadIdx.x == 0 && blockIdx.x == 0) report_bad_index(err, v);
      continue;
    }
    if (c >= d) continue;
    if (v != current) {
      if (current >= 0) atomic_accumulate(out + current * out_row_stride + c, from_compute<T>(acc));
      current = v;
      acc = 0;
    }
    acc += to_compute<T>(src[r * src_row_stride + c]);
  }
  if (current >= 0 && c < d) atomic_accumulate(out + current * out_row_stride + c, from_compute<T>(acc));
}

// Whether scatter(out, 0, index, src, accumulate) is index_add's form that index_add_rows_kernel takes: out (V, d) and
// src (N, d) with contiguous rows, index (N, d) seen with stride 0 along the columns (one index per row).
bool index_add_rows_applies(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  return dim == 0 && out.dim() == 2 && src.dim() == 2 && index.dim() == 2 && index.shape() == src.shape() &&
         out.size(1) == src.size(1) && out.stride(1) == 1 && src.stride(1) == 1 && index.stride(1) == 0 &&
         src.size(0) > 0 && src.size(1) > 0;
}

template <typename T>
void index_add_rows(const Tensor& out, const Tensor& index, const Tensor& src, const IndexReport& err,
                    cudaStream_t stream) {
  const int64_t rows = src.size(0), d = src.size(1);
  const int64_t row_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t col_blocks = (d + kRowThreads - 1) / kRowThreads;
  for (int64_t y0 = 0; y0 < row_blocks; y0 += 65535) {  // gridDim.y's limit: launches of up to 65535 row blocks
    const int64_t ys = std::min<int64_t>(row_blocks - y0, 65535);
    const int64_t first = y0 * kRowsPerBlock;
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(ys));
    index_add_rows_kernel<T><<<grid, kRowThreads, 0, stream>>>(
        static_cast<device_t<T>*>(out.data_ptr()), out.stride(0),
        static_cast<const device_t<T>*>(src.data_ptr()) + first * src.stride(0), src.stride(0),
        index.data_ptr<int64_t>() + first * index.stride(0), index.stride(0),
        std::min<int64_t>(rows - first, ys * kRowsPerBlock), d, out.size(0), err);
    KILN_CUDA_CHECK_LAUNCH("index_add");
  }
}

// ---- deterministic mode: scatter through targets sorted by offset ----

// keys[i] = out offset of position i's target minus `lo` (so in [0, sentinel)), or `sentinel` for an
// out-of-range index (reported, then skipped); positions[i] = i. walk tensors: 0 out (dim stride 0), 1 index.
__global__ void scatter_keys_kernel(Walk w, int64_t n, const int64_t* index, int64_t out_dim_stride,
                                    int64_t out_dim_size, int64_t lo, uint64_t sentinel, uint64_t* keys,
                                    int64_t* positions, IndexReport err) {
  for_each_index<1>(
      w, n, index, out_dim_size, err,
      [&](int64_t i, const int64_t* off, int64_t v) {
        positions[i] = i;
        keys[i] = static_cast<uint64_t>(off[0] + v * out_dim_stride - lo);
      },
      [&](int64_t i) {
        positions[i] = i;
        keys[i] = sentinel;
      });
}

// Over keys sorted ascending (positions in index order within equal keys): the thread at the start of each
// run of equal keys adds the run's src values to out[key + lo] one after another, in compute precision.
// walk tensors: 2 src.
template <typename T>
__global__ void scatter_add_sorted_kernel(Walk w, int64_t n, const uint64_t* keys, const int64_t* positions,
                                          uint64_t sentinel, int64_t lo, device_t<T>* out, const device_t<T>* src) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n; j += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t key = keys[j];
    if (key == sentinel || (j > 0 && keys[j - 1] == key)) continue;
    device_t<T>* target = out + (static_cast<int64_t>(key) + lo);
    compute_t<T> acc = to_compute<T>(*target);
    for (int64_t m = j; m < n && keys[m] == key; ++m) {
      int64_t off[3];
      walk_offsets(w, positions[m], off);
      acc += to_compute<T>(src[off[2]]);
    }
    *target = from_compute<T>(acc);
  }
}

// The lowest and highest element offsets (from data_ptr) that `t` can address.
std::pair<int64_t, int64_t> offset_range(const Tensor& t) {
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t span = (t.size(d) - 1) * t.stride(d);
    (span < 0 ? lo : hi) += span;
  }
  return {lo, hi};
}

// Number of low bits that hold every value in [0, v].
int bits_for(uint64_t v) {
  int bits = 1;
  while (bits < 64 && (v >> bits) != 0) ++bits;
  return bits;
}

// The (target, position) pairs of one scatter, sorted by target; positions of one target stay in index
// order (the radix sort is stable). w, n and the out arguments as scatter_kernel's.
struct SortedTargets {
  Tensor keys, positions;  // (n,) each: keys ascending (uint64 bits in Int64 tensors)
  int64_t lo = 0;          // key + lo = the target's element offset in out
  uint64_t sentinel = 0;   // the key of an out-of-range index (sorts last, skipped)

  SortedTargets(const char* op, const Tensor& out, const Tensor& index, const Walk& w, int64_t n,
                int64_t out_dim_stride, int64_t out_dim_size, const IndexReport& err, cudaStream_t stream) {
    const auto [low, high] = offset_range(out);
    lo = low;
    sentinel = static_cast<uint64_t>(high - low) + 1;
    const int end_bit = bits_for(sentinel);
    const TensorOptions i64{.dtype = DType::Int64, .device = out.device()};
    Tensor keys_in = internal::empty({n}, i64), pos_in = internal::empty({n}, i64);
    keys = internal::empty({n}, i64);
    positions = internal::empty({n}, i64);
    auto* k_in = static_cast<uint64_t*>(keys_in.data_ptr());
    auto* k_out = static_cast<uint64_t*>(keys.data_ptr());
    auto* p_in = pos_in.data_ptr<int64_t>();
    auto* p_out = positions.data_ptr<int64_t>();
    scatter_keys_kernel<<<blocks_for(n), kThreads, 0, stream>>>(w, n, index.data_ptr<int64_t>(), out_dim_stride,
                                                                out_dim_size, lo, sentinel, k_in, p_in, err);
    KILN_CUDA_CHECK_LAUNCH(op);
    size_t temp_bytes = 0;
    KILN_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k_in, k_out, p_in, p_out, n, 0, end_bit, stream), op);
    Tensor temp = internal::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))},
                                  {.dtype = DType::UInt8, .device = out.device()});
    KILN_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, k_in, k_out, p_in, p_out, n, 0, end_bit, stream),
        op);
  }
  const uint64_t* key_data() const { return static_cast<const uint64_t*>(keys.data_ptr()); }
  const int64_t* position_data() const { return positions.data_ptr<int64_t>(); }
};

// Over sorted targets: the thread at the start of each run of equal keys writes the run's last src value
// (the last in index order wins, as on the CPU). walk tensors: 2 src.
template <typename U>
__global__ void scatter_assign_sorted_kernel(Walk w, int64_t n, const uint64_t* keys, const int64_t* positions,
                                             uint64_t sentinel, int64_t lo, U* out, const U* src) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n; j += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t key = keys[j];
    if (key == sentinel || (j > 0 && keys[j - 1] == key)) continue;
    int64_t last = j;
    while (last + 1 < n && keys[last + 1] == key) ++last;
    int64_t off[3];
    walk_offsets(w, positions[last], off);
    out[static_cast<int64_t>(key) + lo] = src[off[2]];
  }
}

// Deterministic mode's scatter: out[q with coordinate dim = index[q]] (+)= src[q] for every position q of
// index's shape, through sorted targets (see the top of the file). Adds in compute precision in index
// order; assignment keeps the last value in index order. w as scatter_kernel's.
template <typename T, bool kAccumulate>
void deterministic_scatter(const char* op, const Tensor& out, const Tensor& index, const Tensor& src, const Walk& w,
                           int64_t n, int64_t out_dim_stride, int64_t out_dim_size, const IndexReport& err,
                           cudaStream_t stream) {
  const SortedTargets sorted(op, out, index, w, n, out_dim_stride, out_dim_size, err, stream);
  if constexpr (kAccumulate) {
    scatter_add_sorted_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        w, n, sorted.key_data(), sorted.position_data(), sorted.sentinel, sorted.lo,
        static_cast<device_t<T>*>(out.data_ptr()), static_cast<const device_t<T>*>(src.data_ptr()));
  } else {
    scatter_assign_sorted_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        w, n, sorted.key_data(), sorted.position_data(), sorted.sentinel, sorted.lo, static_cast<T*>(out.data_ptr()),
        static_cast<const T*>(src.data_ptr()));
  }
  KILN_CUDA_CHECK_LAUNCH(op);
}

// ---- nonzero ----

// Whether the element at row-major position i is nonzero, on the raw bits: floats ignore the sign bit
// (so -0 is zero and NaN is nonzero), integers and Bool use every bit.
template <typename U>
struct NonzeroAt {
  Walk w;
  const U* data;
  U mask;
  __device__ bool operator()(int64_t i) const {
    int64_t off[3];
    walk_offsets(w, i, off);
    return (data[off[0]] & mask) != 0;
  }
};

// coords[r][d] = the row-major coordinates in `w` of linear position positions[r].
__global__ void unravel_kernel(Walk w, const int64_t* positions, int64_t count, int64_t* coords) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < count; r += int64_t{gridDim.x} * blockDim.x) {
    int64_t i = positions[r];
    for (int d = w.rank - 1; d >= 0; --d) {
      coords[r * w.rank + d] = i % w.sizes[d];
      i /= w.sizes[d];
    }
  }
}

}  // namespace

void CudaBackend::index_select(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  // a (..., S, ...), index (n,), out (..., n, ...): index strides are 0 except along dim.
  Strides index_strides(static_cast<size_t>(std::max<int64_t>(out.dim(), 1)), 0);
  index_strides[dim] = index.dim() == 0 ? 0 : index.stride(0);
  if (out.dim() == 0) index_strides.clear();
  if (select_rows_applies(out, a, dim, index)) {  // an embedding's lookup: whole rows, no per-element walk
    IndexCheck check("index_select", out, dim, a.size(0), stream_for(out));
    select_rows(out, a, index, check.report(), stream_for(out));
    check.done();
    return;
  }
  run_gather("index_select", out, a, dim, index, index_strides);
}

void CudaBackend::gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  // out and index share a shape; a may be larger in dims other than dim.
  run_gather("gather", out, a, dim, index, strides_or_empty(index));
}

void CudaBackend::scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  // index and src share a shape (src may be a view into a larger tensor); out may be larger outside dim.
  const char* op = accumulate ? "scatter_add" : "scatter";
  cudaStream_t stream = stream_for(out);
  const int64_t out_dim_size = out.dim() == 0 ? 1 : out.size(dim);
  const int64_t out_dim_stride = out.dim() == 0 ? 0 : out.stride(dim);
  Strides out_strides = strides_or_empty(out);
  if (!out_strides.empty()) out_strides[dim] = 0;
  const Walk w = make_walk(op, index.shape(), out_strides, strides_or_empty(index), strides_or_empty(src));
  const int64_t n = index.numel();
  IndexCheck check(op, out, dim, out_dim_size, stream);
  if (!accumulate) {
    visit_element_size(out.element_size(), [&](auto tag) {
      using U = typename decltype(tag)::type;
      if (deterministic()) {  // duplicates: the last in index order wins, not whichever thread ran last
        deterministic_scatter<U, false>(op, out, index, src, w, n, out_dim_stride, out_dim_size, check.report(),
                                        stream);
        return;
      }
      scatter_kernel<U, false><<<blocks_for(n), kThreads, 0, stream>>>(
          w, n, static_cast<U*>(out.data_ptr()), index.data_ptr<int64_t>(), static_cast<const U*>(src.data_ptr()),
          out_dim_stride, out_dim_size, check.report());
      KILN_CUDA_CHECK_LAUNCH(op);
    });
  } else {
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        if (deterministic()) {
          deterministic_scatter<T, true>(op, out, index, src, w, n, out_dim_stride, out_dim_size, check.report(),
                                         stream);
          return;
        }
      }
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        if (index_add_rows_applies(out, dim, index, src)) {  // an embedding's gradient: index_add by rows
          index_add_rows<T>(out, index, src, check.report(), stream);
          return;
        }
      }
      using D = std::conditional_t<std::is_same_v<T, int32_t>, int, device_t<T>>;
      scatter_kernel<D, true><<<blocks_for(n), kThreads, 0, stream>>>(
          w, n, static_cast<D*>(out.data_ptr()), index.data_ptr<int64_t>(), static_cast<const D*>(src.data_ptr()),
          out_dim_stride, out_dim_size, check.report());
      KILN_CUDA_CHECK_LAUNCH(op);
    });
  }
  check.done();
}

Tensor CudaBackend::nonzero(const Tensor& a) {
  // Select the row-major positions i of nonzero elements with CUB (order kept), read the count back
  // (nonzero's output shape depends on it, so it synchronises by nature), then turn positions into
  // (count, rank) coordinates.
  cudaStream_t stream = stream_for(a);
  const int64_t total = a.numel(), rank = a.dim();
  if (total == 0) return internal::empty({0, rank}, {.dtype = DType::Int64, .device = a.device()});
  const Walk w = make_walk("nonzero", a.shape(), strides_or_empty(a), {}, {});
  Tensor positions = internal::empty({total}, {.dtype = DType::Int64, .device = a.device()});
  Tensor count_buf = internal::empty({1}, {.dtype = DType::Int64, .device = a.device()});
  const bool floating = is_floating_point(a.dtype());
  visit_element_size(a.element_size(), [&](auto tag) {
    using U = typename decltype(tag)::type;
    const U all = static_cast<U>(~U{0});
    const U mask = floating ? static_cast<U>(all >> 1) : all;  // drop the sign bit of floats
    NonzeroAt<U> pred{w, static_cast<const U*>(a.data_ptr()), mask};
    thrust::counting_iterator<int64_t> first(0);
    size_t temp_bytes = 0;
    KILN_CUDA_CHECK(cub::DeviceSelect::If(nullptr, temp_bytes, first, positions.data_ptr<int64_t>(),
                                          count_buf.data_ptr<int64_t>(), total, pred, stream),
                    "nonzero");
    Tensor temp = internal::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))},
                                  {.dtype = DType::UInt8, .device = a.device()});
    KILN_CUDA_CHECK(cub::DeviceSelect::If(temp.data_ptr(), temp_bytes, first, positions.data_ptr<int64_t>(),
                                          count_buf.data_ptr<int64_t>(), total, pred, stream),
                    "nonzero");
  });
  int64_t count = 0;
  KILN_CUDA_CHECK(cudaMemcpyAsync(&count, count_buf.data_ptr(), sizeof count, cudaMemcpyDeviceToHost, stream),
                  "nonzero");
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream), "nonzero");
  detail::throw_index_error(a.device().index());
  Tensor result = internal::empty({count, rank}, {.dtype = DType::Int64, .device = a.device()});
  if (count == 0 || rank == 0) return result;
  unravel_kernel<<<blocks_for(count), kThreads, 0, stream>>>(w, positions.data_ptr<int64_t>(), count,
                                                             result.data_ptr<int64_t>());
  KILN_CUDA_CHECK_LAUNCH("nonzero");
  return result;
}

}  // namespace kiln::cuda
