// Fused softmax + cross-entropy kernels for class-index targets (cross_entropy.h), over rows of logits (R, C).
//
// A warp takes a row of up to 1024 classes (8 rows per block); a block of 512 threads takes a longer one.
// Forward: one pass keeps a running (max, sum of exp) per lane (online softmax), merged across the row into
// lse; with label smoothing a second pass sums w[c] (lse - x[c]) (every term >= 0: no cancellation). The
// re-read of a row mostly hits L2. Backward: one pass reads x and writes
//   grad[c] = g * (A softmax[c] - (1-s) w[t] [c == t] - s/C w[c]),   A = (1-s) w[t] + s/C sum_c w[c],
// the derivative of the forward's loss (A = 1 without weights). Rows with contiguous classes are read
// (and written) 16 bytes at a time after a short unaligned head.
#include "kiln/layers/cuda/cross_entropy.h"
#include "kiln/tensor/trace.h"  // a range per kernel entry

#include <cstdint>
#include <limits>

#include "kiln/tensor/cuda/kernel_util.cuh"  // load_compute, store_as, device_t, to_compute, stream_for
#include "kiln/tensor/internal_ops.h"        // internal::empty

namespace kiln::nn::cuda_impl {
namespace {

using cuda::device_t;
using cuda::kdetail::load_compute;
using cuda::kdetail::store_as;

inline constexpr int64_t kWarpRow = 1024;  // longest row one warp takes
inline constexpr int kRowsPerBlock = 8;    // warps (rows) per block for short rows
inline constexpr int kBlockThreads = 512;  // threads per row for long rows

struct Launch {
  dim3 grid, block;
};
Launch launch_for(int64_t c, int64_t rows) {
  const int64_t blocks = c <= kWarpRow ? (rows + kRowsPerBlock - 1) / kRowsPerBlock : rows;
  KILN_CHECK(blocks < (int64_t{1} << 31), "cross_entropy: too many rows (", rows, ") for one launch");
  if (c <= kWarpRow) return {dim3(static_cast<unsigned>(blocks)), dim3(32, kRowsPerBlock)};
  return {dim3(static_cast<unsigned>(blocks)), dim3(kBlockThreads)};
}

__device__ __forceinline__ int64_t row_index() {
  return blockDim.x > 32 ? static_cast<int64_t>(blockIdx.x)
                         : static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
}

// 16 bytes of T.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  device_t<T> v[kSize];
};

// Elements before the first 16-byte boundary at or after p (all of them when fewer than c).
template <typename T>
__device__ __forceinline__ int64_t aligned_head(const T* p, int64_t c) {
  const int64_t bytes = static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16);
  const int64_t head = bytes / static_cast<int64_t>(sizeof(T));
  return head < c ? head : c;
}

// Calls f(value in compute precision, class index) for this lane's share of the row x[k * step], k < c.
template <typename T, typename F>
__device__ __forceinline__ void for_each_in_row(const T* x, int64_t c, int64_t step, int lane, int lanes, F&& f) {
  if (step != 1) {
#pragma unroll 4
    for (int64_t k = lane; k < c; k += lanes) f(load_compute(x + k * step), k);
    return;
  }
  constexpr int kV = Pack<T>::kSize;
  const int64_t head = aligned_head(x, c);
  const int64_t packs = (c - head) / kV;
  for (int64_t k = lane; k < head; k += lanes) f(load_compute(x + k), k);
  const Pack<T>* body = reinterpret_cast<const Pack<T>*>(x + head);
#pragma unroll 2
  for (int64_t i = lane; i < packs; i += lanes) {
    const Pack<T> p = body[i];
#pragma unroll
    for (int j = 0; j < kV; ++j) f(cuda::to_compute<T>(p.v[j]), head + i * kV + j);
  }
  for (int64_t k = head + packs * kV + lane; k < c; k += lanes) f(load_compute(x + k), k);
}

// exp and log in A (kiln::nn's Tensor exp/log would hide the unqualified names here).
__device__ __forceinline__ float exp_a(float v) { return expf(v); }
__device__ __forceinline__ double exp_a(double v) { return ::exp(v); }
__device__ __forceinline__ float log_a(float v) { return logf(v); }
__device__ __forceinline__ double log_a(double v) { return ::log(v); }

// A running max and sum of exp(x - max).
template <typename A>
struct MaxSum {
  A m, s;
};

template <typename A>
__device__ __forceinline__ void add(MaxSum<A>& a, A v) {
  if (v > a.m) {
    a.s = a.s * exp_a(a.m - v) + A(1);
    a.m = v;
  } else if (v != -std::numeric_limits<A>::infinity()) {
    a.s += exp_a(v - a.m);  // NaN stays NaN through s
  }
}

// Symmetric in a and b, so every lane of a butterfly ends with the same bits.
template <typename A>
__device__ __forceinline__ MaxSum<A> merge(MaxSum<A> a, MaxSum<A> b) {
  const A m = a.m > b.m ? a.m : b.m;
  if (m == -std::numeric_limits<A>::infinity()) return {m, A(0)};
  return {m, a.s * exp_a(a.m - m) + b.s * exp_a(b.m - m)};
}

// Combines over the lanes of a row (a warp, or the whole block when blockDim.x > 32); every lane gets the
// result. The warps' partials are combined in a fixed order, so all lanes agree exactly.
template <typename A>
__device__ __forceinline__ MaxSum<A> row_merge(MaxSum<A> v) {
  __shared__ A part_m[kBlockThreads / 32], part_s[kBlockThreads / 32];
  for (int d = 16; d > 0; d >>= 1) {
    const MaxSum<A> o{__shfl_xor_sync(0xffffffffu, v.m, d), __shfl_xor_sync(0xffffffffu, v.s, d)};
    v = merge(v, o);
  }
  if (blockDim.x > 32) {
    if (threadIdx.x % 32 == 0) part_m[threadIdx.x / 32] = v.m, part_s[threadIdx.x / 32] = v.s;
    __syncthreads();
    v = {part_m[0], part_s[0]};
    for (int k = 1; k < static_cast<int>(blockDim.x / 32); ++k) v = merge(v, MaxSum<A>{part_m[k], part_s[k]});
  }
  return v;
}

template <typename A>
__device__ __forceinline__ A row_sum(A v) {
  __shared__ A part[kBlockThreads / 32];
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  if (blockDim.x > 32) {
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    v = part[0];
    for (int k = 1; k < static_cast<int>(blockDim.x / 32); ++k) v += part[k];
  }
  return v;
}

// What one row's target says: its class, and whether it is ignored or out of range.
struct RowTarget {
  int64_t t;
  bool ignored, bad;
};
__device__ __forceinline__ RowTarget row_target(const int64_t* target, int64_t row, int64_t c, int64_t ignore_index) {
  const int64_t t = target[row];
  const bool ignored = t == ignore_index;
  return {t, ignored, !ignored && (t < 0 || t >= c)};
}

template <typename A>
struct ForwardArgs {
  int64_t rows, c, row_stride, col_stride;
  const int64_t* target;
  const A* weight;  // (C) or nullptr
  int64_t ignore_index;
  A smoothing;
  A* loss;  // (R)
  A* w;     // (R)
  A* lse;   // (R)
};

template <typename T, typename A>
__global__ void __launch_bounds__(kBlockThreads) cross_entropy_forward_kernel(const T* logits, ForwardArgs<A> a) {
  const int64_t row = row_index();
  if (row >= a.rows) return;  // whole warps (short rows only) leave together
  const T* x = logits + row * a.row_stride;
  const int lane = threadIdx.x, lanes = blockDim.x;
  constexpr A kInf = std::numeric_limits<A>::infinity();

  const RowTarget rt = row_target(a.target, row, a.c, a.ignore_index);
  if (rt.ignored) {  // nothing to read: no loss, no weight, and backward writes zeros without the lse
    if (lane == 0) a.loss[row] = a.w[row] = a.lse[row] = A(0);
    return;  // the whole row's lanes (a warp, or the block of a long row) leave together
  }
  MaxSum<A> ms{-kInf, A(0)};
  for_each_in_row(x, a.c, a.col_stride, lane, lanes, [&](A v, int64_t) { add(ms, v); });
  ms = row_merge(ms);
  const A lse = ms.m + log_a(ms.s);

  A smooth = 0;  // sum_c w[c] (lse - x[c])
  if (a.smoothing != A(0)) {
    A part = 0;
    for_each_in_row(x, a.c, a.col_stride, lane, lanes,
                    [&](A v, int64_t k) { part += (a.weight ? a.weight[k] : A(1)) * (lse - v); });
    smooth = row_sum(part);
  }
  if (lane != 0) return;
  A loss = 0, w = 0;
  if (rt.bad) {
    loss = w = std::numeric_limits<A>::quiet_NaN();
  } else {
    w = a.weight ? a.weight[rt.t] : A(1);
    loss = w * (lse - load_compute(x + rt.t * a.col_stride));
    if (a.smoothing != A(0)) loss = (A(1) - a.smoothing) * loss + a.smoothing / static_cast<A>(a.c) * smooth;
  }
  a.loss[row] = loss;
  a.w[row] = w;
  a.lse[row] = lse;
}

template <typename A>
struct BackwardArgs {
  int64_t rows, c, row_stride, col_stride;
  int64_t out_row_stride;  // grad_logits' row stride: c, or the logits' padded row stride
  bool packed;  // unit column stride, one row stride for logits and grad_logits, both base pointers 16-byte aligned
  const int64_t* target;
  const A* weight;
  const A* weight_sum;
  const A* lse;
  const A* grad;  // g per row (grad_step 1) or one g (grad_step 0)
  int64_t grad_step;
  const A* denominator;  // divides g (Mean), or nullptr
  int64_t ignore_index;
  A smoothing;
};

template <typename T, typename A>
__global__ void __launch_bounds__(kBlockThreads)
    cross_entropy_backward_kernel(const T* logits, T* grad_logits, BackwardArgs<A> a) {
  const int64_t row = row_index();
  if (row >= a.rows) return;
  const T* x = logits + row * a.row_stride;
  T* y = grad_logits + row * a.out_row_stride;
  const int lane = threadIdx.x, lanes = blockDim.x;
  const RowTarget rt = row_target(a.target, row, a.c, a.ignore_index);
  if (rt.ignored || rt.bad) {
    const A fill = rt.bad ? std::numeric_limits<A>::quiet_NaN() : A(0);
    for (int64_t k = lane; k < a.c; k += lanes) store_as(y + k, fill);
    return;
  }
  A g = a.grad[row * a.grad_step];
  if (a.denominator) g /= *a.denominator;
  const A s = a.smoothing, lse = a.lse[row];
  const A w_t = a.weight ? a.weight[rt.t] : A(1);
  const A w_sum = a.weight_sum ? *a.weight_sum : static_cast<A>(a.c);
  const A scale = g * ((A(1) - s) * w_t + s / static_cast<A>(a.c) * w_sum);  // g A
  const A hit = g * (A(1) - s) * w_t;                                        // at c == t
  const A spread = g * s / static_cast<A>(a.c);                              // times w[c]
  auto value = [&](A v, int64_t k) {
    A r = scale * exp_a(v - lse) - spread * (a.weight ? a.weight[k] : A(1));
    return k == rt.t ? r - hit : r;
  };
  if (!a.packed) {
    for (int64_t k = lane; k < a.c; k += lanes) store_as(y + k, value(load_compute(x + k * a.col_stride), k));
    return;
  }
  // x and y rows start at the same offset from a 16-byte boundary: one head, then whole packs.
  constexpr int kV = Pack<T>::kSize;
  const int64_t head = aligned_head(x, a.c);
  const int64_t packs = (a.c - head) / kV;
  for (int64_t k = lane; k < head; k += lanes) store_as(y + k, value(load_compute(x + k), k));
  const Pack<T>* in = reinterpret_cast<const Pack<T>*>(x + head);
  Pack<T>* out = reinterpret_cast<Pack<T>*>(y + head);
#pragma unroll 2
  for (int64_t i = lane; i < packs; i += lanes) {
    const Pack<T> p = in[i];
    Pack<T> q;
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      q.v[j] = cuda::from_compute<T>(value(cuda::to_compute<T>(p.v[j]), head + i * kV + j));
    }
    out[i] = q;
  }
  for (int64_t k = head + packs * kV + lane; k < a.c; k += lanes) store_as(y + k, value(load_compute(x + k), k));
}

template <typename A>
const A* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<A>() : nullptr;
}

void check_rows(const char* op, const Tensor& logits, const Tensor& target, const Tensor& weight) {
  KILN_CHECK(logits.dim() == 2 && logits.is_cuda(), op, ": expected CUDA logits (R, C), got ", logits.shape(), " on ",
             logits.device());
  KILN_CHECK(target.dtype() == DType::Int64 && target.dim() == 1 && target.size(0) == logits.size(0) &&
                 target.is_contiguous() && target.device() == logits.device(),
             op, ": expected a contiguous Int64 target (", logits.size(0), ") on ", logits.device(), ", got ",
             target.dtype(), " ", target.shape(), " on ", target.device());
  KILN_CHECK(!weight.defined() || (weight.dim() == 1 && weight.size(0) == logits.size(1) && weight.is_contiguous() &&
                                   weight.device() == logits.device()),
             op, ": expected a contiguous class weight (", logits.size(1), ") on ", logits.device());
}

}  // namespace

CrossEntropyRows cross_entropy_rows(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                    int64_t ignore_index, double smoothing) {
  trace::Scope range(trace::Kind::Op, "cross_entropy_rows", logits.device(), {&logits, &target});
  check_rows("cross_entropy", logits, target, weight);
  const int64_t rows = logits.size(0), c = logits.size(1);
  const DType acc = logits.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;
  const TensorOptions opts{.dtype = acc, .device = logits.device()};
  CrossEntropyRows out{internal::empty({rows}, opts), internal::empty({rows}, opts), internal::empty({rows}, opts)};
  if (rows == 0) return out;
  KILN_CHECK(!weight.defined() || weight.dtype() == acc, "cross_entropy: the class weight must be ", acc);
  const Launch l = launch_for(c, rows);
  cudaStream_t stream = cuda::stream_for(logits);
  visit_floating_dtype(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    const ForwardArgs<A> args{rows,
                              c,
                              logits.stride(0),
                              logits.stride(1),
                              target.data_ptr<int64_t>(),
                              ptr_or_null<A>(weight),
                              ignore_index,
                              static_cast<A>(smoothing),
                              out.loss.data_ptr<A>(),
                              out.weights.data_ptr<A>(),
                              out.lse.data_ptr<A>()};
    cross_entropy_forward_kernel<T, A><<<l.grid, l.block, 0, stream>>>(logits.data_ptr<T>(), args);
    KILN_CUDA_CHECK_LAUNCH("cross_entropy");
  });
  return out;
}

Tensor cross_entropy_rows_backward(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                   const Tensor& weight_sum, const Tensor& lse, const Tensor& grad,
                                   const Tensor& denominator, int64_t ignore_index, double smoothing) {
  trace::Scope range(trace::Kind::Op, "cross_entropy_rows_backward", logits.device(), {&logits, &target});
  check_rows("cross_entropy backward", logits, target, weight);
  const int64_t rows = logits.size(0), c = logits.size(1);
  // The gradient gets the logits' rows: where those are padded to a 16-byte pitch (a product's output,
  // Backend::matmul_row_pitch), so are its own, for the products that read it next.
  const TensorOptions grad_options{.dtype = logits.dtype(), .device = logits.device()};
  const int64_t per_16 = 16 / static_cast<int64_t>(element_size(logits.dtype()));
  const int64_t pitch = logits.stride(0);
  const bool padded = rows > 1 && logits.stride(1) == 1 && pitch > c && pitch % per_16 == 0 && pitch - c < per_16;
  Tensor grad_logits = padded ? internal::narrow(internal::empty({rows, pitch}, grad_options), 1, 0, c)
                              : internal::empty({rows, c}, grad_options);
  if (rows == 0 || c == 0) return grad_logits;
  KILN_CHECK(grad.is_contiguous() && (grad.numel() == rows || grad.numel() == 1),
             "cross_entropy backward: expected a contiguous gradient of ", rows, " or 1 elements, got ", grad.shape());
  const int64_t grad_step = grad.numel() == rows && grad.dim() == 1 ? 1 : 0;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t out_row_stride = padded ? pitch : c;
  const bool packed = logits.stride(1) == 1 && (rows == 1 || logits.stride(0) == out_row_stride) &&
                      aligned(logits.data_ptr()) && aligned(grad_logits.data_ptr());
  const Launch l = launch_for(c, rows);
  cudaStream_t stream = cuda::stream_for(logits);
  visit_floating_dtype(logits.dtype(), "cross_entropy backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    KILN_CHECK(
        lse.dtype() == grad.dtype() && grad.dtype() == (std::is_same_v<A, double> ? DType::Float64 : DType::Float32),
        "cross_entropy backward: lse and the gradient must be in the compute dtype");
    const BackwardArgs<A> args{rows,
                               c,
                               logits.stride(0),
                               logits.stride(1),
                               out_row_stride,
                               packed,
                               target.data_ptr<int64_t>(),
                               ptr_or_null<A>(weight),
                               ptr_or_null<A>(weight_sum),
                               lse.data_ptr<A>(),
                               grad.data_ptr<A>(),
                               grad_step,
                               ptr_or_null<A>(denominator),
                               ignore_index,
                               static_cast<A>(smoothing)};
    cross_entropy_backward_kernel<T, A>
        <<<l.grid, l.block, 0, stream>>>(logits.data_ptr<T>(), grad_logits.data_ptr<T>(), args);
    KILN_CUDA_CHECK_LAUNCH("cross_entropy backward");
  });
  return grad_logits;
}

}  // namespace kiln::nn::cuda_impl
