// CUDA backend: sort and topk along one dim with CUB radix sorts.
//
// The sorted dim is moved innermost (a contiguous copy through kiln::ops when it is not already), so
// the tensor is `rows` segments of n contiguous elements. Each element becomes an unsigned key whose
// unsigned order is the order kiln sorts by: floats flip their sign/magnitude bits, -0 is made +0 (it
// ties with +0, as on the CPU), every NaN becomes the largest key; signed integers flip the sign bit.
// Descending order inverts the keys (~key), so one ascending, stable radix sort serves both directions
// and ties keep their original order in both, as the CPU backend does (NaN first when descending).
// The sort carries each element's position; values are then read from the input by position, so
// they are the original elements bit for bit.
//
// One segment (a 1-D sort, or rows == 1) uses the device-wide DeviceRadixSort; several use
// DeviceSegmentedSort. topk sorts the whole dim and keeps the first k (simple, and fine for now; a
// radix select would do less work for small k).
#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>
#include <type_traits>

#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/dispatch.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(b, 1), int64_t{1} << 30));
}

enum class KeyKind : int { Unsigned, Signed, Float };

// keys[i] = the order-preserving unsigned key of x[i] (inverted when descending); positions[i] = i % n.
// U is the element's bits, K the key type (at least as wide as U).
template <typename U, typename K>
__global__ void make_keys_kernel(const U* x, int64_t total, int64_t n, KeyKind kind, U abs_inf, bool descending,
                                 K* keys, int64_t* positions) {
  constexpr U kSign = static_cast<U>(U{1} << (sizeof(U) * 8 - 1));
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    U u = x[i];
    K key;
    if (kind == KeyKind::Float) {
      const U mag = static_cast<U>(u & static_cast<U>(~kSign));
      if (mag > abs_inf) {
        key = static_cast<K>(~K{0});  // NaN: above every number, +inf included
      } else {
        if (mag == 0) u = 0;  // -0 ties with +0
        key = (u & kSign) ? static_cast<K>(static_cast<U>(~u)) : static_cast<K>(static_cast<U>(u | kSign));
      }
    } else if (kind == KeyKind::Signed) {
      key = static_cast<K>(static_cast<U>(u ^ kSign));
    } else {
      key = static_cast<K>(u);
    }
    keys[i] = descending ? static_cast<K>(~key) : key;
    positions[i] = i % n;
  }
}

// out[i] = x[row of i, position[i]]: the sorted values, copied bit for bit.
template <typename U>
__global__ void take_kernel(const U* x, const int64_t* positions, int64_t total, int64_t n, U* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = x[(i / n) * n + positions[i]];
  }
}

// offsets[r] = r * n for r <= rows: the segment boundaries.
__global__ void segment_offsets_kernel(int64_t rows, int64_t n, int64_t* offsets) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r <= rows; r += int64_t{gridDim.x} * blockDim.x) {
    offsets[r] = r * n;
  }
}

Tensor device_bytes(size_t bytes, Device device) {
  return internal::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, {.dtype = DType::UInt8, .device = device});
}

// Stable ascending sort of (key, position) pairs in `rows` segments of n.
template <typename K>
void sort_pairs(const K* keys_in, K* keys_out, const int64_t* pos_in, int64_t* pos_out, int64_t total, int64_t rows,
                int64_t n, Device device, cudaStream_t stream) {
  size_t bytes = 0;
  if (rows == 1) {
    KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys_in, keys_out, pos_in, pos_out, total, 0,
                                                    static_cast<int>(sizeof(K) * 8), stream),
                    "sort");
    Tensor temp = device_bytes(bytes, device);
    KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), bytes, keys_in, keys_out, pos_in, pos_out, total,
                                                    0, static_cast<int>(sizeof(K) * 8), stream),
                    "sort");
    return;
  }
  Tensor offsets = internal::empty({rows + 1}, {.dtype = DType::Int64, .device = device});
  int64_t* off = offsets.data_ptr<int64_t>();
  segment_offsets_kernel<<<blocks_for(rows + 1), kThreads, 0, stream>>>(rows, n, off);
  KILN_CUDA_CHECK_LAUNCH("sort");
  KILN_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(nullptr, bytes, keys_in, keys_out, pos_in, pos_out, total,
                                                            rows, off, off + 1, stream),
                  "sort");
  Tensor temp = device_bytes(bytes, device);
  KILN_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(temp.data_ptr(), bytes, keys_in, keys_out, pos_in, pos_out,
                                                            total, rows, off, off + 1, stream),
                  "sort");
}

// The unsigned integer of kSize bytes (void for any other size): the keys' type.
template <size_t kSize>
using bits_t = std::conditional_t<
    kSize == 1, uint8_t,
    std::conditional_t<kSize == 2, uint16_t,
                       std::conditional_t<kSize == 4, uint32_t, std::conditional_t<kSize == 8, uint64_t, void>>>>;

// x: contiguous (..., n), sorted along its last dim into values_out (x's dtype) and indices_out (Int64),
// both contiguous with x's shape.
void sort_rows(const Tensor& x, int64_t n, bool descending, const Tensor& values_out, const Tensor& indices_out,
               cudaStream_t stream) {
  const int64_t total = x.numel(), rows = total / n;
  const Device device = x.device();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using U = bits_t<sizeof(T)>;
    using K = std::conditional_t<sizeof(U) == 1, uint16_t, U>;  // one sort instantiation fewer
    KeyKind kind = KeyKind::Unsigned;
    U abs_inf = 0;
    if constexpr (std::is_same_v<T, Half>) kind = KeyKind::Float, abs_inf = static_cast<U>(0x7c00u);
    else if constexpr (std::is_same_v<T, BFloat16>) kind = KeyKind::Float, abs_inf = static_cast<U>(0x7f80u);
    else if constexpr (std::is_same_v<T, float>) kind = KeyKind::Float, abs_inf = static_cast<U>(0x7f800000u);
    else if constexpr (std::is_same_v<T, double>)
      kind = KeyKind::Float, abs_inf = static_cast<U>(0x7ff0000000000000ull);
    else if constexpr (std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) kind = KeyKind::Signed;

    Tensor keys_in = device_bytes(static_cast<size_t>(total) * sizeof(K), device);
    Tensor keys_out = device_bytes(static_cast<size_t>(total) * sizeof(K), device);
    Tensor pos_in = internal::empty({total}, {.dtype = DType::Int64, .device = device});
    K* kin = static_cast<K*>(keys_in.data_ptr());
    K* kout = static_cast<K*>(keys_out.data_ptr());
    int64_t* pin = pos_in.data_ptr<int64_t>();
    int64_t* pout = indices_out.data_ptr<int64_t>();

    make_keys_kernel<U, K><<<blocks_for(total), kThreads, 0, stream>>>(static_cast<const U*>(x.data_ptr()), total, n,
                                                                       kind, abs_inf, descending, kin, pin);
    KILN_CUDA_CHECK_LAUNCH("sort");
    sort_pairs<K>(kin, kout, pin, pout, total, rows, n, device, stream);
    take_kernel<U><<<blocks_for(total), kThreads, 0, stream>>>(static_cast<const U*>(x.data_ptr()), pout, total, n,
                                                               static_cast<U*>(values_out.data_ptr()));
    KILN_CUDA_CHECK_LAUNCH("sort");
  });
}

// `a` with `dim` moved last, as a view (0-d stays 0-d).
Tensor dim_last(const Tensor& t, int64_t dim) { return t.dim() == 0 ? t : internal::transpose(t, dim, -1); }

}  // namespace

void CudaBackend::sort(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, bool descending,
                       bool stable) {
  // Always stable: the radix sort is, at no extra cost.
  cudaStream_t stream = stream_for(a);
  const int64_t n = a.dim() == 0 ? 1 : a.size(dim);
  const Tensor x = internal::contiguous(dim_last(a, dim));  // (..., n)
  Tensor vt = dim_last(values, dim), it = dim_last(indices, dim);
  // Write straight into the outputs when their moved views are contiguous, else into scratch and copy.
  const Tensor v_dst = vt.is_contiguous() ? vt : internal::empty(x.shape(), x.options());
  const Tensor i_dst =
      it.is_contiguous() ? it : internal::empty(x.shape(), {.dtype = DType::Int64, .device = x.device()});
  sort_rows(x, n, descending, v_dst, i_dst, stream);
  if (!v_dst.is_same(vt)) internal::copy_(vt, v_dst);
  if (!i_dst.is_same(it)) internal::copy_(it, i_dst);
}

void CudaBackend::topk(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t k, int64_t dim,
                       bool largest, bool sorted) {
  // Sorts the whole dim and keeps the first k: always sorted, ties in original order (as on the CPU).
  cudaStream_t stream = stream_for(a);
  const int64_t n = a.dim() == 0 ? 1 : a.size(dim);
  const Tensor x = internal::contiguous(dim_last(a, dim));  // (..., n)
  const Tensor v_all = internal::empty(x.shape(), x.options());
  const Tensor i_all = internal::empty(x.shape(), {.dtype = DType::Int64, .device = x.device()});
  sort_rows(x, n, largest, v_all, i_all, stream);
  Tensor vt = dim_last(values, dim), it = dim_last(indices, dim);
  if (a.dim() == 0) {
    internal::copy_(vt, v_all);
    internal::copy_(it, i_all);
    return;
  }
  internal::copy_(vt, internal::narrow(v_all, -1, 0, k));
  internal::copy_(it, internal::narrow(i_all, -1, 0, k));
}

}  // namespace kiln::cuda
