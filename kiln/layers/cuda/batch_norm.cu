// Batch norm on CUDA (batch_norm.h): kernels first, then the launchers.
//
// Two layouts cover every input the kernels take:
//   planes (N, C, S): NCHW-contiguous with S = prod(*) > 1; a block reduces one channel over (N, S);
//   rows   (M, C):    channels-last (M = N H W) or 2-d (M = N); a block reduces channels across rows, threads
//                     of a warp reading consecutive channels (coalesced).
// Reductions: per-thread State, merged in a fixed tree per block, one partial per (channel, split); a second
// kernel merges the splits of a channel in order. Elementwise passes use 16-byte vectors when the layout and
// the pointers allow (S % V == 0 for planes, C % V == 0 for rows).
#include "kiln/layers/cuda/batch_norm.h"
#include "kiln/tensor/trace.h"  // a range per kernel entry

#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "kiln/layers/cuda/layer_kernels.cuh"  // Vec, load_vec, vector_width, grid_for
#include "kiln/tensor/cuda/cuda_backend.h"     // cuda::stream_for
#include "kiln/tensor/cuda/cuda_check.h"       // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/cuda/kernel_util.cuh"    // to_compute, from_compute, sm_count
#include "kiln/tensor/dispatch.h"              // visit_floating_dtype, acc_t
#include "kiln/tensor/ops.h"                   // empty, contiguous

namespace kiln::nn::cuda_impl {
namespace {

using cuda::from_compute;
using cuda::to_compute;
using cuda::kdetail::ceil_div;

constexpr int kThreads = 256;

// Three accumulators: Welford (count, mean, m2), or the two gradient sums (unused, sum dy, sum dy * xhat).
template <typename Acc>
struct State {
  Acc a, b, c;
};

template <typename Acc>
struct WelfordOp {
  __device__ static State<Acc> identity() { return {Acc(0), Acc(0), Acc(0)}; }
  __device__ void add(State<Acc>& s, Acc x, Acc, Acc, int64_t) const {
    s.a += Acc(1);
    const Acc d = x - s.b;
    s.b += d / s.a;
    s.c += d * (x - s.b);
  }
  __device__ static State<Acc> merge(const State<Acc>& p, const State<Acc>& q) {
    const Acc n = p.a + q.a;
    if (n == Acc(0)) return p;
    const Acc d = q.b - p.b, f = q.a / n;
    return {n, p.b + d * f, p.c + q.c + d * d * p.a * f};
  }
};

// Sums of dy and dy * xhat per channel, dy masked by y > 0 when ReLU was fused.
template <typename Acc>
struct GradSumOp {
  const Acc* mean;
  const Acc* invstd;
  bool relu;
  __device__ static State<Acc> identity() { return {Acc(0), Acc(0), Acc(0)}; }
  __device__ void add(State<Acc>& s, Acc x, Acc dy, Acc y, int64_t c) const {
    if (relu && !(y > Acc(0))) dy = Acc(0);
    s.b += dy;
    s.c += dy * (x - mean[c]) * invstd[c];
  }
  __device__ static State<Acc> merge(const State<Acc>& p, const State<Acc>& q) {
    return {p.a + q.a, p.b + q.b, p.c + q.c};
  }
};

// The element arrays a pass reads (same shape and layout); dy and y may be null.
template <typename T>
struct Inputs {
  const device_t<T>* x;
  const device_t<T>* dy;
  const device_t<T>* y;
};

template <typename Acc, typename Op>
__device__ __forceinline__ State<Acc> shfl_down(const State<Acc>& s, int d) {
  return {__shfl_down_sync(0xffffffffu, s.a, d), __shfl_down_sync(0xffffffffu, s.b, d),
          __shfl_down_sync(0xffffffffu, s.c, d)};
}

// Planes (N, C, S): block (channel c = blockIdx.x, split blockIdx.y) reduces vectors [k0, k1) of the
// channel's N * S / V vectors. partial[c * splits + split].
template <typename T, int V, typename Acc, typename Op>
__global__ void __launch_bounds__(kThreads)
    reduce_planes_kernel(Inputs<T> in, Op op, State<Acc>* partial, int64_t C, int64_t S, int64_t vecs, int64_t chunk) {
  const int64_t c = blockIdx.x;
  const int64_t split = blockIdx.y, splits = gridDim.y;
  const int64_t sv = S / V;
  const int64_t k1 = min(vecs, (split + 1) * chunk);
  State<Acc> st = Op::identity();
  for (int64_t k = split * chunk + threadIdx.x; k < k1; k += blockDim.x) {
    const int64_t n = k / sv;
    const int64_t off = (n * C + c) * S + (k - n * sv) * V;
    const Vec<T, V> vx = load_vec<T, V>(in.x + off);
    Vec<T, V> vdy{}, vy{};
    if (in.dy) vdy = load_vec<T, V>(in.dy + off);
    if (in.y) vy = load_vec<T, V>(in.y + off);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const Acc dy = in.dy ? static_cast<Acc>(to_compute<T>(vdy.v[j])) : Acc(0);
      const Acc y = in.y ? static_cast<Acc>(to_compute<T>(vy.v[j])) : Acc(0);
      op.add(st, static_cast<Acc>(to_compute<T>(vx.v[j])), dy, y, c);
    }
  }
  // Warp tree, then the warps' results merged in order by thread 0.
  for (int d = 16; d > 0; d >>= 1) st = Op::merge(st, shfl_down<Acc, Op>(st, d));
  __shared__ State<Acc> warp_states[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_states[warp] = st;
  __syncthreads();
  if (threadIdx.x == 0) {
    State<Acc> total = warp_states[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) total = Op::merge(total, warp_states[w]);
    partial[c * splits + split] = total;
  }
}

// Rows (M, C): thread (tx, ty) of block (bx, by) owns channels c0 .. c0 + V - 1, c0 = (blockIdx.x bx + tx) V,
// and rows split * rows_per_split + ty, stepping by by; the by states per channel merge in a tree in shared
// memory (by is a power of two). partial[c * splits + split].
template <typename T, int V, typename Acc, typename Op>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_kernel(Inputs<T> in, Op op, State<Acc>* partial, int64_t M, int64_t C, int64_t rows_per_split) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  State<Acc>* sm = reinterpret_cast<State<Acc>*>(smem_raw);  // (by, bx, V)
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int64_t split = blockIdx.y, splits = gridDim.y;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * bx + tx) * V;
  State<Acc> st[V];
#pragma unroll
  for (int j = 0; j < V; ++j) st[j] = Op::identity();
  if (c0 < C) {
    const int64_t r1 = min(M, (split + 1) * rows_per_split);
    for (int64_t r = split * rows_per_split + ty; r < r1; r += by) {
      const int64_t off = r * C + c0;
      const Vec<T, V> vx = load_vec<T, V>(in.x + off);
      Vec<T, V> vdy{}, vy{};
      if (in.dy) vdy = load_vec<T, V>(in.dy + off);
      if (in.y) vy = load_vec<T, V>(in.y + off);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const Acc dy = in.dy ? static_cast<Acc>(to_compute<T>(vdy.v[j])) : Acc(0);
        const Acc y = in.y ? static_cast<Acc>(to_compute<T>(vy.v[j])) : Acc(0);
        op.add(st[j], static_cast<Acc>(to_compute<T>(vx.v[j])), dy, y, c0 + j);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) sm[(ty * bx + tx) * V + j] = st[j];
  for (int half = by / 2; half > 0; half /= 2) {
    __syncthreads();
    if (ty < half) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int i = (ty * bx + tx) * V + j;
        sm[i] = Op::merge(sm[i], sm[i + half * bx * V]);
      }
    }
  }
  __syncthreads();
  if (ty == 0 && c0 < C) {
#pragma unroll
    for (int j = 0; j < V; ++j) partial[(c0 + j) * splits + split] = sm[tx * V + j];
  }
}

// One thread per channel: merges the splits in order into mean and invstd, and updates the running
// statistics as the composed path: running = (1 - momentum) running + momentum batch (unbiased variance).
template <typename Acc, typename R>
__global__ void finalize_stats_kernel(const State<Acc>* partial, int64_t splits, int64_t C, Acc count, Acc eps,
                                      Acc* mean, Acc* invstd, R* running_mean, R* running_var, Acc momentum) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  State<Acc> st = partial[c * splits];
  for (int64_t s = 1; s < splits; ++s) st = WelfordOp<Acc>::merge(st, partial[c * splits + s]);
  const Acc var = st.c / count;  // biased
  mean[c] = st.b;
  invstd[c] = Acc(1) / sqrt(var + eps);
  if (running_mean != nullptr) {
    using RC = compute_t<R>;
    const Acc rm = static_cast<Acc>(to_compute<R>(reinterpret_cast<const device_t<R>*>(running_mean)[c]));
    const Acc rv = static_cast<Acc>(to_compute<R>(reinterpret_cast<const device_t<R>*>(running_var)[c]));
    const Acc unbiased = var * (count / (count - Acc(1)));
    reinterpret_cast<device_t<R>*>(running_mean)[c] =
        from_compute<R>(static_cast<RC>((Acc(1) - momentum) * rm + momentum * st.b));
    reinterpret_cast<device_t<R>*>(running_var)[c] =
        from_compute<R>(static_cast<RC>((Acc(1) - momentum) * rv + momentum * unbiased));
  }
}

// One thread per channel: the gradient sums merged in order; grad_weight = sum dy xhat, grad_bias = sum dy,
// and the coefficients of the elementwise pass dx = (dy - a - (x - mean) k) g.
template <typename Acc>
__global__ void finalize_grads_kernel(const State<Acc>* partial, int64_t splits, int64_t C, Acc inv_count,
                                      const Acc* invstd, const Acc* weight, bool training, Acc* grad_weight,
                                      Acc* grad_bias, Acc* a, Acc* k, Acc* g) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  Acc sum_dy = 0, sum_dy_xhat = 0;
  for (int64_t s = 0; s < splits; ++s) {
    sum_dy += partial[c * splits + s].b;
    sum_dy_xhat += partial[c * splits + s].c;
  }
  if (grad_weight) grad_weight[c] = sum_dy_xhat;
  if (grad_bias) grad_bias[c] = sum_dy;
  if (g) {
    g[c] = invstd[c] * (weight ? weight[c] : Acc(1));
    if (training) {
      a[c] = sum_dy * inv_count;
      k[c] = sum_dy_xhat * inv_count * invstd[c];
    }
  }
}

// The channel of element e: rows (M, C) -> e % C; planes (N, C, S) -> (e / S) % C.
struct ChannelIndex {
  bool rows;
  int64_t C, S;
  __device__ __forceinline__ int64_t operator()(int64_t e) const { return rows ? e % C : (e / S) % C; }
};

// y = (x - mean) invstd w + b (then max(., 0) with relu), V elements per step; a vector never crosses a
// channel boundary in planes (S % V == 0) and covers channels c .. c + V - 1 in rows (C % V == 0).
template <typename T, int V, typename Acc>
__global__ void __launch_bounds__(kThreads)
    forward_apply_kernel(const device_t<T>* x, device_t<T>* y, const Acc* mean, const Acc* invstd, const Acc* weight,
                         const Acc* bias, bool relu, int64_t vecs, ChannelIndex ch) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i * V;
    const int64_t c0 = ch(e);
    const Vec<T, V> vx = load_vec<T, V>(x + e);
    Vec<T, V> vy;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t c = ch.rows ? c0 + j : c0;
      const Acc scale = invstd[c] * (weight ? weight[c] : Acc(1));
      Acc v = (static_cast<Acc>(to_compute<T>(vx.v[j])) - mean[c]) * scale + (bias ? bias[c] : Acc(0));
      if (relu) v = v > Acc(0) ? v : Acc(0);
      vy.v[j] = from_compute<T>(static_cast<compute_t<T>>(v));
    }
    store_vec<T, V>(y + e, vy);
  }
}

// dx = (dy' - a - (x - mean) k) g, dy' = dy masked by y > 0 (relu); a and k null in eval.
template <typename T, int V, typename Acc>
__global__ void __launch_bounds__(kThreads)
    backward_apply_kernel(const device_t<T>* x, const device_t<T>* dy, const device_t<T>* y, device_t<T>* dx,
                          const Acc* mean, const Acc* a, const Acc* k, const Acc* g, int64_t vecs, ChannelIndex ch) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i * V;
    const int64_t c0 = ch(e);
    const Vec<T, V> vdy = load_vec<T, V>(dy + e);
    Vec<T, V> vx{}, vy{}, out;
    if (a) vx = load_vec<T, V>(x + e);
    if (y) vy = load_vec<T, V>(y + e);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t c = ch.rows ? c0 + j : c0;
      Acc d = static_cast<Acc>(to_compute<T>(vdy.v[j]));
      if (y && !(static_cast<Acc>(to_compute<T>(vy.v[j])) > Acc(0))) d = Acc(0);
      if (a) d = d - a[c] - (static_cast<Acc>(to_compute<T>(vx.v[j])) - mean[c]) * k[c];
      out.v[j] = from_compute<T>(static_cast<compute_t<T>>(d * g[c]));
    }
    store_vec<T, V>(dx + e, out);
  }
}

// ---------------------------------------------------------------- launchers

// How x is laid out for the kernels, after contiguous_for_kernels.
struct Layout {
  bool rows;
  int64_t C;
  int64_t outer;                                              // planes: N; rows: M
  int64_t S;                                                  // planes: prod(*); rows: 1
  int64_t count() const { return rows ? outer : outer * S; }  // values per channel
  ChannelIndex channel_index() const { return {rows, C, S}; }
};

bool is_channels_last_4d(const Tensor& x) {
  return x.dim() == 4 && x.is_contiguous(MemoryFormat::ChannelsLast) && !x.is_contiguous();
}

// x as the kernels read it: channels-last 4-d inputs stay NHWC; everything else is made NCHW-contiguous.
Tensor contiguous_for_kernels(const Tensor& x) { return is_channels_last_4d(x) ? x : ops::contiguous(x); }

Layout layout_of(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t s = c == 0 || n == 0 ? 1 : x.numel() / (n * c);
  if (is_channels_last_4d(x)) return {true, c, n * s, 1};
  if (s == 1) return {true, c, n, 1};
  return {false, c, n, s};
}

// The tensor `t` (same shape) in `like`'s layout.
Tensor in_layout_of(const Tensor& t, const Tensor& like) {
  return is_channels_last_4d(like) ? ops::contiguous(t, MemoryFormat::ChannelsLast) : ops::contiguous(t);
}

DType acc_dtype(DType t) { return t == DType::Float64 ? DType::Float64 : DType::Float32; }

// A (C) tensor in dtype, contiguous (undefined stays undefined).
Tensor per_channel_as(const Tensor& t, DType dtype) { return t.defined() ? ops::contiguous(t.to(dtype)) : t; }

template <typename A>
A* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<A>() : nullptr;
}

// Runs a per-channel reduction of Op over `in` (layout L) and returns the partials (C, splits) as a flat
// tensor of 3 * C * splits Acc values, with `splits` set.
template <typename T, typename Acc, typename Op>
Tensor reduce_channels(const Tensor& like, const Layout& L, const Inputs<T>& in, const Op& op, int64_t& splits,
                       cudaStream_t stream, const char* name) {
  const int sms = cuda::kdetail::sm_count();
  const int v = vector_width<T>({in.x, in.dy, in.y}, L.rows ? L.C : L.S);
  const DType adt = std::is_same_v<Acc, double> ? DType::Float64 : DType::Float32;
  Tensor partial;
  auto run = [&](auto width) {
    constexpr int V = decltype(width)::value;
    if (!L.rows) {
      const int64_t vecs = L.outer * L.S / V;
      const int64_t max_splits = std::max<int64_t>(1, vecs / (kThreads * 8));  // >= 8 vectors per thread
      splits = std::clamp<int64_t>(ceil_div(int64_t{sms} * 8, L.C), 1, std::min<int64_t>(max_splits, 65535));
      const int64_t chunk = ceil_div(vecs, splits);
      splits = ceil_div(vecs, chunk);
      partial = ops::empty({L.C * splits * 3}, TensorOptions{.dtype = adt, .device = like.device()});
      reduce_planes_kernel<T, V, Acc, Op>
          <<<dim3(static_cast<unsigned>(L.C), static_cast<unsigned>(splits)), kThreads, 0, stream>>>(
              in, op, reinterpret_cast<State<Acc>*>(partial.data_ptr()), L.C, L.S, vecs, chunk);
    } else {
      const int64_t cvecs = L.C / V;
      int bx = 1;
      while (bx < 32 && bx < cvecs) bx *= 2;
      const int by = kThreads / bx;
      const int64_t grid_x = ceil_div(cvecs, bx);
      const int64_t max_splits = std::max<int64_t>(1, L.outer / (int64_t{by} * 8));  // >= 8 rows per thread
      splits = std::clamp<int64_t>(ceil_div(int64_t{sms} * 4, grid_x), 1, std::min<int64_t>(max_splits, 65535));
      const int64_t rows_per_split = ceil_div(L.outer, splits);
      splits = ceil_div(L.outer, rows_per_split);
      partial = ops::empty({L.C * splits * 3}, TensorOptions{.dtype = adt, .device = like.device()});
      const size_t smem = sizeof(State<Acc>) * static_cast<size_t>(kThreads) * V;
      reduce_rows_kernel<T, V, Acc, Op>
          <<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(splits)), dim3(bx, by), smem, stream>>>(
              in, op, reinterpret_cast<State<Acc>*>(partial.data_ptr()), L.outer, L.C, rows_per_split);
    }
    KILN_CUDA_CHECK_LAUNCH(name);
  };
  constexpr int kWide = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
  if (v == kWide) run(std::integral_constant<int, kWide>{});
  else run(std::integral_constant<int, 1>{});
  return partial;
}

template <typename T>
void launch_forward(const Tensor& x, const Tensor& y, const Layout& L, const Tensor& weight, const Tensor& bias,
                    const Tensor& running_mean, const Tensor& running_var, bool training, double momentum, double eps,
                    bool relu, Tensor& mean, Tensor& invstd, cudaStream_t stream) {
  using Acc = acc_t<T>;
  using D = device_t<T>;
  const DType adt = acc_dtype(x.dtype());
  const auto* xp = static_cast<const D*>(x.data_ptr());
  if (training) {
    int64_t splits = 1;
    const Tensor partial = reduce_channels<T, Acc>(x, L, Inputs<T>{xp, nullptr, nullptr}, WelfordOp<Acc>{}, splits,
                                                   stream, "batch_norm (statistics)");
    mean = ops::empty({L.C}, TensorOptions{.dtype = adt, .device = x.device()});
    invstd = ops::empty({L.C}, TensorOptions{.dtype = adt, .device = x.device()});
    const unsigned blocks = static_cast<unsigned>(ceil_div(L.C, kThreads));
    const auto* part = reinterpret_cast<const State<Acc>*>(partial.data_ptr());
    const Acc count = static_cast<Acc>(L.count());
    if (running_mean.defined()) {
      visit_floating_dtype(running_mean.dtype(), "batch_norm", [&](auto tag) {
        using R = typename decltype(tag)::type;
        finalize_stats_kernel<Acc, R><<<blocks, kThreads, 0, stream>>>(
            part, splits, L.C, count, static_cast<Acc>(eps), mean.data_ptr<Acc>(), invstd.data_ptr<Acc>(),
            running_mean.data_ptr<R>(), running_var.data_ptr<R>(), static_cast<Acc>(momentum));
      });
    } else {
      finalize_stats_kernel<Acc, Acc><<<blocks, kThreads, 0, stream>>>(part, splits, L.C, count, static_cast<Acc>(eps),
                                                                       mean.data_ptr<Acc>(), invstd.data_ptr<Acc>(),
                                                                       nullptr, nullptr, Acc(0));
    }
    KILN_CUDA_CHECK_LAUNCH("batch_norm (finalize statistics)");
  } else {
    mean = per_channel_as(running_mean, adt);
    invstd = ops::contiguous(ops::rsqrt(ops::add(running_var.to(adt), eps)));
  }
  const Tensor w = per_channel_as(weight, adt), b = per_channel_as(bias, adt);
  auto* yp = static_cast<D*>(y.data_ptr());
  const int v = vector_width<T>({xp, yp}, L.rows ? L.C : L.S);
  auto apply = [&](auto width) {
    constexpr int V = decltype(width)::value;
    const int64_t vecs = x.numel() / V;
    forward_apply_kernel<T, V, Acc><<<grid_for(vecs, kThreads), kThreads, 0, stream>>>(
        xp, yp, mean.data_ptr<Acc>(), invstd.data_ptr<Acc>(), ptr_or_null<Acc>(w), ptr_or_null<Acc>(b), relu, vecs,
        L.channel_index());
    KILN_CUDA_CHECK_LAUNCH("batch_norm (normalize)");
  };
  constexpr int kWide = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
  if (v == kWide) apply(std::integral_constant<int, kWide>{});
  else apply(std::integral_constant<int, 1>{});
}

template <typename T>
BatchNormGrads launch_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Layout& L,
                               const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training,
                               BatchNormNeeds needs, cudaStream_t stream) {
  using Acc = acc_t<T>;
  using D = device_t<T>;
  const DType adt = acc_dtype(x.dtype());
  const Tensor w = per_channel_as(weight, adt);
  const auto* xp = static_cast<const D*>(x.data_ptr());
  const auto* dyp = static_cast<const D*>(dy.data_ptr());
  const D* yp = y.defined() ? static_cast<const D*>(y.data_ptr()) : nullptr;
  BatchNormGrads out;
  const TensorOptions opts = TensorOptions{.dtype = adt, .device = x.device()};
  Tensor a, k, g;
  if (training || needs.weight || needs.bias) {
    int64_t splits = 1;
    const GradSumOp<Acc> op{mean.data_ptr<Acc>(), invstd.data_ptr<Acc>(), yp != nullptr};
    const Tensor partial =
        reduce_channels<T, Acc>(x, L, Inputs<T>{xp, dyp, yp}, op, splits, stream, "batch_norm backward (sums)");
    if (needs.weight) out.weight = ops::empty({L.C}, opts);
    if (needs.bias) out.bias = ops::empty({L.C}, opts);
    if (needs.input) {
      g = ops::empty({L.C}, opts);
      if (training) {
        a = ops::empty({L.C}, opts);
        k = ops::empty({L.C}, opts);
      }
    }
    finalize_grads_kernel<Acc><<<static_cast<unsigned>(ceil_div(L.C, kThreads)), kThreads, 0, stream>>>(
        reinterpret_cast<const State<Acc>*>(partial.data_ptr()), splits, L.C, Acc(1) / static_cast<Acc>(L.count()),
        invstd.data_ptr<Acc>(), ptr_or_null<Acc>(w), training, ptr_or_null<Acc>(out.weight), ptr_or_null<Acc>(out.bias),
        ptr_or_null<Acc>(a), ptr_or_null<Acc>(k), ptr_or_null<Acc>(g));
    KILN_CUDA_CHECK_LAUNCH("batch_norm backward (finalize)");
  } else if (needs.input) {
    g = w.defined() ? ops::mul(invstd, w) : invstd;
  }
  if (!needs.input) return out;
  out.input = ops::empty_like(x);  // x's layout
  auto* dxp = static_cast<D*>(out.input.data_ptr());
  const int v = vector_width<T>({xp, dyp, yp, dxp}, L.rows ? L.C : L.S);
  auto apply = [&](auto width) {
    constexpr int V = decltype(width)::value;
    const int64_t vecs = x.numel() / V;
    backward_apply_kernel<T, V, Acc><<<grid_for(vecs, kThreads), kThreads, 0, stream>>>(
        xp, dyp, yp, dxp, mean.data_ptr<Acc>(), ptr_or_null<Acc>(a), ptr_or_null<Acc>(k), g.data_ptr<Acc>(), vecs,
        L.channel_index());
    KILN_CUDA_CHECK_LAUNCH("batch_norm backward (input)");
  };
  constexpr int kWide = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
  if (v == kWide) apply(std::integral_constant<int, kWide>{});
  else apply(std::integral_constant<int, 1>{});
  return out;
}

}  // namespace

BatchNormForward batch_norm_forward(const Tensor& x0, const Tensor& weight, const Tensor& bias,
                                    const Tensor& running_mean, const Tensor& running_var, bool training,
                                    double momentum, double eps, bool relu) {
  trace::Scope range(trace::Kind::Op, "batch_norm_forward", x0.device(), {&x0, &weight});
  const Tensor x = contiguous_for_kernels(x0);
  const Layout L = layout_of(x);
  if (running_mean.defined()) {
    KILN_CHECK(
        running_mean.is_contiguous() && running_var.is_contiguous() && running_mean.dtype() == running_var.dtype(),
        "batch_norm: running_mean and running_var must be contiguous and of one dtype, got ", running_mean.dtype(),
        " and ", running_var.dtype());
  }
  BatchNormForward out;
  out.y = ops::empty_like(x);  // x's layout (NCHW or NHWC, both dense)
  cudaStream_t stream = cuda::stream_for(x);
  visit_floating_dtype(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_forward<T>(x, out.y, L, weight, bias, running_mean, running_var, training, momentum, eps, relu, out.mean,
                      out.invstd, stream);
  });
  return out;
}

BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x0, const Tensor& y0, const Tensor& weight,
                                   const Tensor& mean, const Tensor& invstd, bool training, BatchNormNeeds needs) {
  trace::Scope range(trace::Kind::Op, "batch_norm_backward", x0.device(), {&grad_out, &x0});
  const Tensor x = contiguous_for_kernels(x0);
  const Layout L = layout_of(x);
  const Tensor dy = in_layout_of(grad_out.to(x.dtype()), x);
  const Tensor y = y0.defined() ? in_layout_of(y0, x) : y0;
  cudaStream_t stream = cuda::stream_for(x);
  return visit_floating_dtype(x.dtype(), "batch_norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_backward<T>(dy, x, y, L, weight, mean, invstd, training, needs, stream);
  });
}

}  // namespace kiln::nn::cuda_impl
