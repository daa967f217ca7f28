// fused_sparse_update (fused.h): a row-sparse gradient applied to the rows it touches, without a host synchronisation.
// The entries are ordered by row with a stable device radix sort of their row ids (over only the bits a row id of the
// table needs; an id outside the table sorts last, as the table's row count); then one warp per entry that starts a run
// of equal rows finds the run's end (its 32 next entries at once, a binary search beyond), sums the run's values in the
// entries' order (what SparseRowGrad::coalesce computes: index_add into zeros, each sum rounded to the values' dtype)
// and updates that row of the parameter and of its state. A lane sums 4 columns at once and reads the values of 8
// entries ahead of adding them (their positions read 32 at a time, a lane each), so that a long run (a hot row of Zipf
// ids repeats hundreds of times in a batch) waits on memory once per 8 entries, not once per entry and column; the
// additions stay in the entries' order. Each step is one rounding, as the kiln ops of the unfused path (sgd.cpp,
// sparse_adam.cpp, rowwise_adagrad.cpp) round it, with the _rn intrinsics so that nothing is contracted into a fused
// multiply-add: SGD and SparseAdam give the unfused path's values bit for bit; row-wise Adagrad's row mean may add in
// another order. SGD's momentum instead marks the gradient's rows in its mask, then sweeps the mask (below). A step
// counter is read as steps + 1 and incremented by a last launch; with found_inf != 0 nothing is written.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>
#include <utility>

#include "kiln/optim/cuda/checks.h"          // check_scalar, is_fused_dtype
#include "kiln/optim/cuda/fused.h"           // fused_sparse_update
#include "kiln/tensor/cuda/cuda_check.h"     // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/cuda/kernel_util.cuh"  // load_as, store_as, ceil_div, stream_for
#include "kiln/tensor/dispatch.h"            // Half, BFloat16
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"  // empty, to
#include "kiln/tensor/trace.h"         // a range per kernel entry

namespace kiln::optim::cuda_impl {
namespace {

using cuda::kdetail::load_as;
using cuda::kdetail::store_as;

constexpr int kWarpsPerBlock = 8;

struct SparseArgs {
  SparseRule rule;
  int64_t k = 0, rows = 0, width = 0;  // entries, the table's rows, elements per row
  float neg_lr = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, eps = 0;
  double lr = 0, beta1 = 0, beta2 = 0;
  bool maximize = false;
  float momentum = 0, one_minus_dampening = 0;  // SgdMomentum
  bool nesterov = false, fresh = false;         // SgdMomentum
};

// x rounded to T and read back as float (identity for float).
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return cuda::to_compute<T>(cuda::from_compute<T>(x));
  }
}

constexpr int kCols = 4;   // columns a lane sums in one pass over a run: 128 per warp
constexpr int kAhead = 8;  // entries whose values a lane reads before adding them
constexpr int kTile = 32 * kCols;

// The run [begin, end) of sorted entries summed for the columns c0 + lane + 32 i (i < kCols) of a row of w: each
// column from zero in the entries' order, each sum rounded to T; then divided by the gradient scale and negated for
// maximize, in float. Columns at or past w read nothing and give 0. The warp reads the positions of 32 entries at
// once (a lane each) and passes them round by shuffles, so that reading an entry's values does not wait for reading
// its position first.
template <typename T>
__device__ __forceinline__ void run_grads(const T* values, const int64_t* order, int64_t begin, int64_t end, int64_t w,
                                          int64_t c0, int lane, const float* grad_scale, bool maximize,
                                          float (&g)[kCols]) {
  float acc[kCols];
  bool in[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    acc[i] = 0.f;
    in[i] = c0 + lane + 32 * i < w;
  }
  for (int64_t base = begin; base < end; base += 32) {
    const int n = static_cast<int>(end - base < 32 ? end - base : 32);  // the same in every lane
    const long long mine = lane < n ? order[base + lane] : 0;
    int u0 = 0;
    for (; u0 + kAhead <= n; u0 += kAhead) {
      float v[kAhead][kCols];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        const T* src = values + __shfl_sync(0xffffffffu, mine, u0 + u) * w + c0 + lane;
#pragma unroll
        for (int i = 0; i < kCols; ++i) v[u][i] = in[i] ? load_as<float>(src + 32 * i) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
#pragma unroll
        for (int i = 0; i < kCols; ++i) acc[i] = round_to<T>(__fadd_rn(acc[i], v[u][i]));
      }
    }
    for (; u0 < n; ++u0) {
      const T* src = values + __shfl_sync(0xffffffffu, mine, u0) * w + c0 + lane;
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        acc[i] = round_to<T>(__fadd_rn(acc[i], in[i] ? load_as<float>(src + 32 * i) : 0.f));
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    float x = acc[i];
    if (grad_scale != nullptr) x = __fdiv_rn(x, *grad_scale);
    g[i] = maximize ? -x : x;
  }
}

// The end of the run of `key` that starts at `begin` in the sorted keys: the warp compares the 32 next keys at once,
// and a run longer than that is ended by a binary search. All lanes return the same value.
__device__ __forceinline__ int64_t run_end(const uint64_t* keys, int64_t k, int64_t begin, uint64_t key, int lane) {
  const int64_t e = begin + 1 + lane;
  const unsigned same = __ballot_sync(0xffffffffu, e < k && keys[e] == key);
  if (same != 0xffffffffu) return begin + 1 + (__ffs(~same) - 1);  // sorted: the equal keys are a prefix
  int64_t lo = begin + 33, hi = k;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] <= key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// keys: the entries' row ids sorted (an id outside the table as `rows`), order: the entries in that order.
template <typename T>
__global__ void sparse_update_kernel(T* param, const T* values, const uint64_t* keys, const int64_t* order,
                                     float* state1, float* state2, const float* step, const float* grad_scale,
                                     const float* found_inf, SparseArgs a) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (j >= a.k) return;
  if (found_inf != nullptr && *found_inf != 0.f) return;
  const uint64_t key = keys[j];
  if (j > 0 && keys[j - 1] == key) return;  // not the first entry of its row's run
  // A row outside the table was recorded by the lookup's index check and is raised at the next synchronisation:
  // it is not written here.
  if (key >= static_cast<uint64_t>(a.rows)) return;
  const auto row = static_cast<int64_t>(key);
  const int64_t end = run_end(keys, a.k, j, key, lane);
  const int64_t w = a.width;
  T* p = param + row * w;
  float g[kCols];
  if (a.rule == SparseRule::Sgd) {
    for (int64_t c0 = 0; c0 < w; c0 += kTile) {
      run_grads(values, order, j, end, w, c0, lane, grad_scale, a.maximize, g);
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int64_t c = c0 + lane + 32 * i;
        if (c < w) store_as(p + c, __fadd_rn(load_as<float>(p + c), __fmul_rn(g[i], a.neg_lr)));
      }
    }
  } else if (a.rule == SparseRule::Adam) {
    // step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t) in double, as the unfused path's host computes it.
    const double t = static_cast<double>(*step) + 1;
    const double step_size = a.lr * sqrt(1 - pow(a.beta2, t)) / (1 - pow(a.beta1, t));
    const auto neg_step = static_cast<float>(-step_size);
    float* m = state1 + row * w;
    float* v = state2 + row * w;
    for (int64_t c0 = 0; c0 < w; c0 += kTile) {
      run_grads(values, order, j, end, w, c0, lane, grad_scale, a.maximize, g);
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int64_t c = c0 + lane + 32 * i;
        if (c >= w) continue;
        const float m_new = __fadd_rn(m[c], __fmul_rn(__fsub_rn(g[i], m[c]), a.one_minus_beta1));
        const float v_new = __fadd_rn(v[c], __fmul_rn(__fsub_rn(__fmul_rn(g[i], g[i]), v[c]), a.one_minus_beta2));
        m[c] = m_new;
        v[c] = v_new;
        const float denom = __fadd_rn(__fsqrt_rn(v_new), a.eps);
        store_as(p + c, __fadd_rn(load_as<float>(p + c), __fmul_rn(__fdiv_rn(m_new, denom), neg_step)));
      }
    }
  } else {  // row-wise Adagrad: sum[row] += mean over the row of g^2; p -= lr * g / (sqrt(sum[row]) + eps)
    // Each lane adds its columns' squares in increasing column order, then the warp sums the lanes.
    float squares = 0.f;
    for (int64_t c0 = 0; c0 < w; c0 += kTile) {
      run_grads(values, order, j, end, w, c0, lane, grad_scale, a.maximize, g);
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        if (c0 + lane + 32 * i < w) squares = __fadd_rn(squares, __fmul_rn(g[i], g[i]));
      }
    }
    for (int offset = 16; offset > 0; offset /= 2)
      squares = __fadd_rn(squares, __shfl_xor_sync(0xffffffffu, squares, offset));
    const float sum = __fadd_rn(state1[row], __fdiv_rn(squares, static_cast<float>(w)));
    __syncwarp();
    if (lane == 0) state1[row] = sum;
    const float denom = __fadd_rn(__fsqrt_rn(sum), a.eps);
    // A row of at most one tile keeps its sums in g; a wider one sums its run again (from L2).
    for (int64_t c0 = 0; c0 < w; c0 += kTile) {
      if (w > kTile) run_grads(values, order, j, end, w, c0, lane, grad_scale, a.maximize, g);
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int64_t c = c0 + lane + 32 * i;
        if (c < w) store_as(p + c, __fadd_rn(load_as<float>(p + c), __fmul_rn(__fdiv_rn(g[i], denom), a.neg_lr)));
      }
    }
  }
}

// SGD's sparse momentum covers every row a gradient ever touched (mask): first each row of this gradient joins it;
// then a sweep over the whole mask, one warp per 32 rows, updates each covered row as the unfused path does (sgd.cpp:
// buf = momentum * buf + (1 - dampening) * g, g the row's summed gradient or 0; p -= lr * (nesterov ? g + momentum *
// buf : buf); on a first step buf = g on the gradient's rows only, and the other rows leave the mask with a zero
// buffer).
__global__ void momentum_mark_kernel(const int64_t* indices, bool* mask, const float* found_inf, int64_t k,
                                     int64_t rows) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k || (found_inf != nullptr && *found_inf != 0.f)) return;
  const int64_t row = indices[j];
  if (row >= 0 && row < rows) mask[row] = true;
}

// The first position in [0, k) whose sorted key is >= row (> row with `after`).
__device__ __forceinline__ int64_t run_bound(const uint64_t* keys, int64_t k, uint64_t row, bool after) {
  int64_t lo = 0, hi = k;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    const uint64_t r = keys[mid];
    if (r < row || (after && r == row)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <typename T>
__global__ void momentum_sweep_kernel(T* param, const T* values, const uint64_t* keys, const int64_t* order, float* buf,
                                      bool* mask, const float* step, const float* grad_scale, const float* found_inf,
                                      SparseArgs a) {
  const int64_t base = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32) * 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (base >= a.rows) return;
  if (found_inf != nullptr && *found_inf != 0.f) return;
  const bool fresh = a.fresh || *step == 0.f;  // the unfused path's t == 1
  const int64_t w = a.width;
  unsigned covered = __ballot_sync(0xffffffffu, base + lane < a.rows && mask[base + lane]);
  while (covered != 0u) {
    const int64_t row = base + (__ffs(covered) - 1);
    covered &= covered - 1;
    const int64_t begin = run_bound(keys, a.k, static_cast<uint64_t>(row), false);
    const int64_t end = run_bound(keys, a.k, static_cast<uint64_t>(row), true);
    const bool in_grad = end > begin;
    float* b = buf + row * w;
    if (fresh && !in_grad) {  // a first step covers only its gradient's rows
      for (int64_t c = lane; c < w; c += 32) b[c] = 0.f;
      __syncwarp();
      if (lane == 0) mask[row] = false;
      continue;
    }
    T* p = param + row * w;
    float d[kCols];
    for (int64_t c0 = 0; c0 < w; c0 += kTile) {
      if (in_grad) {
        run_grads(values, order, begin, end, w, c0, lane, grad_scale, a.maximize, d);
      } else {
#pragma unroll
        for (int i = 0; i < kCols; ++i) d[i] = 0.f;
      }
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int64_t c = c0 + lane + 32 * i;
        if (c >= w) continue;
        float b_new, step_dir;
        if (fresh) {
          b_new = d[i];
          step_dir = a.nesterov ? __fadd_rn(d[i], __fmul_rn(b_new, a.momentum)) : b_new;
        } else {
          const float g = in_grad ? __fadd_rn(0.f, d[i]) : 0.f;  // the union's gradient: index_add into zeros
          b_new = __fadd_rn(__fmul_rn(b[c], a.momentum), __fmul_rn(g, a.one_minus_dampening));
          step_dir = a.nesterov ? __fadd_rn(g, __fmul_rn(b_new, a.momentum)) : b_new;
        }
        b[c] = b_new;
        store_as(p + c, __fadd_rn(load_as<float>(p + c), __fmul_rn(step_dir, a.neg_lr)));
      }
    }
  }
}

__global__ void increment_step_kernel(float* step, const float* found_inf) {
  if (found_inf == nullptr || *found_inf == 0.f) *step += 1.f;
}

// keys[e] = indices[e] as an unsigned sort key, an id outside [0, rows) as rows (sorted after every row, skipped by
// the update); positions[e] = e.
__global__ void sort_keys_kernel(const int64_t* indices, int64_t k, int64_t rows, uint64_t* keys, int64_t* positions) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= k) return;
  const int64_t row = indices[e];
  keys[e] = static_cast<uint64_t>(row >= 0 && row < rows ? row : rows);
  positions[e] = e;
}

// The entries sorted by row, stably (CUB's LSD radix sort over the bits of 0..rows): {sorted keys, entry order}.
std::pair<Tensor, Tensor> sort_by_row(const Tensor& indices, int64_t rows, cudaStream_t stream) {
  const int64_t k = indices.numel();
  const Device dev = indices.device();
  const TensorOptions i64{.dtype = DType::Int64, .device = dev};  // the keys' bits are read as uint64_t
  Tensor keys_in = internal::empty({k}, i64), keys = internal::empty({k}, i64);
  Tensor pos_in = internal::empty({k}, i64), order = internal::empty({k}, i64);
  sort_keys_kernel<<<static_cast<unsigned>(cuda::kdetail::ceil_div(k, int64_t{256})), 256, 0, stream>>>(
      indices.data_ptr<int64_t>(), k, rows, static_cast<uint64_t*>(keys_in.data_ptr()), pos_in.data_ptr<int64_t>());
  KILN_CUDA_CHECK_LAUNCH("fused_sparse_update (sort keys)");
  int end_bit = 1;  // the bits of the largest key, rows
  while (end_bit < 64 && (static_cast<uint64_t>(rows) >> end_bit) != 0) ++end_bit;
  const auto* k_in = static_cast<const uint64_t*>(keys_in.data_ptr());
  auto* k_out = static_cast<uint64_t*>(keys.data_ptr());
  const int64_t* p_in = pos_in.data_ptr<int64_t>();
  int64_t* p_out = order.data_ptr<int64_t>();
  size_t bytes = 0;
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k_in, k_out, p_in, p_out, k, 0, end_bit, stream),
                  "fused_sparse_update (sort)");
  const Tensor temp =
      internal::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, {.dtype = DType::UInt8, .device = dev});
  KILN_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(temp.data_ptr(), bytes, k_in, k_out, p_in, p_out, k, 0, end_bit, stream),
      "fused_sparse_update (sort)");
  return {keys, order};
}

const char* rule_name(SparseRule r) {
  return r == SparseRule::Sgd           ? "SGD"
         : r == SparseRule::SgdMomentum ? "SGD with momentum"
         : r == SparseRule::Adam        ? "SparseAdam"
                                        : "RowWiseAdagrad";
}

}  // namespace

bool fuses_sparse(const Tensor& param, Device device) {
  return param.defined() && device.is_cuda() && (param.device() == device || (param.is_cpu() && param.is_pinned())) &&
         param.is_contiguous() && param.dim() >= 1 && is_fused_dtype(param.dtype());
}

void fused_sparse_update(const Tensor& param, const Tensor& indices_in, const Tensor& values, const TensorVec& states,
                         const Tensor& step, const SparseHyper& h, const Tensor& grad_scale, const Tensor& found_inf) {
  const char* op = "fused_sparse_update";
  KILN_CHECK(indices_in.defined() && indices_in.is_cuda(), op,
             ": the indices must be on the GPU that runs the update, got ",
             indices_in.defined() ? indices_in.device() : Device::cpu());
  const Tensor indices = internal::contiguous(indices_in);  // the kernels read it as a plain array
  const Device dev = indices.device();
  KILN_CHECK(fuses_sparse(param, dev), op, ": the parameter must be a contiguous float32, float16 or bfloat16 tensor ",
             "on ", dev, " or in page-locked host memory, got ", param.shape(), " ", param.dtype(), " on ",
             param.device(), param.is_cpu() && !param.is_pinned() ? " (pageable)" : "");
  // Where the parameter lives (dev, or page-locked host memory): its states and step counter live there too.
  const Device home = param.device();
  const auto at_home = [&](const Tensor& t) { return t.device() == home && (home.is_cuda() || t.is_pinned()); };
  const int64_t k = indices.numel();
  KILN_CHECK(indices.dim() == 1 && indices.dtype() == DType::Int64, op, ": indices must be 1-D Int64, got ",
             indices.shape(), " ", indices.dtype());
  Shape value_shape = param.shape();
  value_shape[0] = k;
  KILN_CHECK(values.shape() == value_shape && values.dtype() == param.dtype() && values.device() == dev &&
                 values.is_contiguous(),
             op, ": values must be contiguous ", value_shape, " ", param.dtype(), " on ", dev, ", got ", values.shape(),
             " ", values.dtype(), " on ", values.device());
  const char* where = home.is_cuda() ? "" : " (page-locked)";
  const size_t want = h.rule == SparseRule::Sgd ? 0 : h.rule == SparseRule::RowWiseAdagrad ? 1 : 2;
  KILN_CHECK(states.size() == want, op, ": ", rule_name(h.rule), " takes ", want, " state tensors, got ",
             states.size());
  if (h.rule == SparseRule::SgdMomentum) {  // {buffer beside the parameter, mask on the GPU}
    const Tensor& mask = states[1];
    KILN_CHECK(mask.shape() == Shape{param.size(0)} && mask.dtype() == DType::Bool && mask.device() == dev &&
                   mask.is_contiguous(),
               op, ": state 1 (the momentum's mask) must be a contiguous (", param.size(0), ") Bool tensor on ", dev,
               ", got ", mask.shape(), " ", mask.dtype(), " on ", mask.device());
  }
  const size_t floats = h.rule == SparseRule::SgdMomentum ? 1 : states.size();
  for (size_t i = 0; i < floats; ++i) {
    const bool full = h.rule == SparseRule::Adam || h.rule == SparseRule::SgdMomentum;
    const Shape expected = full ? param.shape() : Shape{param.size(0)};
    KILN_CHECK(states[i].shape() == expected && states[i].dtype() == DType::Float32 && at_home(states[i]) &&
                   states[i].is_contiguous(),
               op, ": state ", i, " must be a contiguous float32 ", expected, " on ", home, where, ", got ",
               states[i].shape(), " ", states[i].dtype(), " on ", states[i].device());
  }
  KILN_CHECK(step.defined() && step.numel() == 1 && step.dtype() == DType::Float32 && at_home(step), op,
             ": step must be a 1-element float32 tensor on ", home, where, ", got ",
             step.defined()
                 ? ::kiln::detail::str_cat(step.numel(), " elements of ", step.dtype(), " on ", step.device())
                 : std::string("an undefined tensor"));
  check_scalar(grad_scale, op, "grad_scale", dev, /*required=*/false);
  check_scalar(found_inf, op, "found_inf", dev, /*required=*/false);
  // Page-locked host memory is mapped for every device at its host address under unified addressing (every 64-bit
  // platform CUDA supports; gather_host_rows relies on the same), so its pointers are used as they are.
  const float* scale_ptr = grad_scale.defined() ? grad_scale.data_ptr<float>() : nullptr;
  const float* inf_ptr = found_inf.defined() ? found_inf.data_ptr<float>() : nullptr;
  const cudaStream_t stream = cuda::stream_for(indices);
  // The kernels' warps read the step count; one kept in page-locked memory is first copied to the GPU (in stream
  // order, without a wait), so that they read device memory, not the bus. The last launch increments the count itself.
  const Tensor step_read = step.device() == dev ? step : internal::to(step, dev, {}, /*non_blocking=*/true);
  trace::Scope range(trace::Kind::Op, op, dev, {&param, &indices, &values});
  // Momentum moves every covered row, also on a step whose gradient holds no row.
  const bool momentum = h.rule == SparseRule::SgdMomentum;
  if ((k > 0 || momentum) && param.numel() > 0) {
    // stable: runs of a row keep the entries' order
    const auto [keys, order] = k > 0 ? sort_by_row(indices, param.size(0), stream) : std::pair<Tensor, Tensor>{};
    const auto* key_ptr = keys.defined() ? static_cast<const uint64_t*>(keys.data_ptr()) : nullptr;
    const int64_t* order_ptr = order.defined() ? order.data_ptr<int64_t>() : nullptr;
    SparseArgs a{.rule = h.rule,
                 .k = k,
                 .rows = param.size(0),
                 .width = param.numel() / param.size(0),
                 .neg_lr = static_cast<float>(-h.lr),
                 .one_minus_beta1 = static_cast<float>(1 - h.beta1),
                 .one_minus_beta2 = static_cast<float>(1 - h.beta2),
                 .eps = static_cast<float>(h.eps),
                 .lr = h.lr,
                 .beta1 = h.beta1,
                 .beta2 = h.beta2,
                 .maximize = h.maximize};
    a.momentum = static_cast<float>(h.momentum);
    a.one_minus_dampening = static_cast<float>(1 - h.dampening);
    a.nesterov = h.nesterov;
    a.fresh = h.fresh;
    float* s1 = states.size() > 0 ? states[0].data_ptr<float>() : nullptr;
    float* s2 = states.size() > 1 && !momentum ? states[1].data_ptr<float>() : nullptr;
    const auto blocks = static_cast<unsigned>(cuda::kdetail::ceil_div(k, kWarpsPerBlock));
    const auto launch = [&](auto tag) {
      using T = decltype(tag);
      if (momentum) {
        bool* mask = static_cast<bool*>(states[1].data_ptr());
        if (k > 0) {
          const auto mark_blocks = static_cast<unsigned>(cuda::kdetail::ceil_div(k, int64_t{256}));
          momentum_mark_kernel<<<mark_blocks, 256, 0, stream>>>(indices.data_ptr<int64_t>(), mask, inf_ptr, k, a.rows);
          KILN_CUDA_CHECK_LAUNCH("fused_sparse_update (momentum rows)");
        }
        const auto sweep_blocks = static_cast<unsigned>(
            cuda::kdetail::ceil_div(cuda::kdetail::ceil_div(a.rows, int64_t{32}), int64_t{kWarpsPerBlock}));
        momentum_sweep_kernel<T><<<sweep_blocks, kWarpsPerBlock * 32, 0, stream>>>(
            param.data_ptr<T>(), values.data_ptr<T>(), key_ptr, order_ptr, s1, mask, step_read.data_ptr<float>(),
            scale_ptr, inf_ptr, a);
        KILN_CUDA_CHECK_LAUNCH("fused_sparse_update (momentum)");
        return;
      }
      sparse_update_kernel<T>
          <<<blocks, kWarpsPerBlock * 32, 0, stream>>>(param.data_ptr<T>(), values.data_ptr<T>(), key_ptr, order_ptr,
                                                       s1, s2, step_read.data_ptr<float>(), scale_ptr, inf_ptr, a);
      KILN_CUDA_CHECK_LAUNCH("fused_sparse_update");
    };
    switch (param.dtype()) {
      case DType::Float32: launch(float{}); break;
      case DType::Float16: launch(Half{}); break;
      default: launch(BFloat16{}); break;  // fuses_sparse admitted only these three
    }
    param.impl().storage()->bump_version();
    for (const Tensor& s : states) s.impl().storage()->bump_version();
  }
  increment_step_kernel<<<1, 1, 0, stream>>>(step.data_ptr<float>(), inf_ptr);
  KILN_CUDA_CHECK_LAUNCH("fused_sparse_update (step)");
  step.impl().storage()->bump_version();
}

}  // namespace kiln::optim::cuda_impl
