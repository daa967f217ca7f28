// 2-d pooling on CUDA (pooling.h): kernels first, then the launchers. Element (n, c, h, w) of a 4-d tensor
// sits at n sN + c sC + h sH + w sW with the strides of NCHW or NHWC (Geometry); consecutive threads take
// consecutive elements of the layout, so NHWC threads read consecutive channels (coalesced). Max pooling of NHWC
// inputs whose channels fill 16-byte vectors takes V channels per thread (the ResNet stem's case).
#include "kiln/layers/cuda/pooling.h"
#include "kiln/tensor/trace.h"  // a range per kernel entry

#include <cuda_runtime.h>

#include <limits>

#include "kiln/layers/cuda/layer_kernels.cuh"  // grid_for, Vec, load_vec, vector_width, kVecWidth
#include "kiln/tensor/cuda/cuda_backend.h"     // cuda::stream_for
#include "kiln/tensor/cuda/cuda_check.h"       // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/cuda/kernel_util.cuh"    // to_compute, from_compute
#include "kiln/tensor/dispatch.h"              // visit_floating_dtype, acc_t
#include "kiln/tensor/internal_ops.h"          // empty_strided, contiguous

namespace kiln::nn::cuda_impl {
namespace {

using cuda::from_compute;
using cuda::to_compute;

constexpr int kThreads = 256;

// i's last digit in radix r (i moves on to the next): the coordinates of a linear index, fastest first.
template <typename I>
__device__ __forceinline__ I pop_digit(I& i, I r) {
  const I d = i % r;
  i /= r;
  return d;
}

// Sizes of the input (H, W) and output (OH, OW) planes, N, C, and the layout both share.
struct Geometry {
  int64_t N, C, H, W, OH, OW;
  bool nhwc;
  int64_t kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
  // Linear index i of an element in a tensor (N, C, h_size, w_size) of this layout -> (n, c, h, w).
  __device__ __forceinline__ void split(int64_t i, int64_t hs, int64_t ws, int64_t& n, int64_t& c, int64_t& h,
                                        int64_t& w) const {
    if (nhwc) c = pop_digit(i, C);
    w = pop_digit(i, ws);
    h = pop_digit(i, hs);
    if (!nhwc) c = pop_digit(i, C);
    n = i;
  }
  __device__ __forceinline__ int64_t offset(int64_t n, int64_t c, int64_t h, int64_t w, int64_t hs, int64_t ws) const {
    return nhwc ? ((n * hs + h) * ws + w) * C + c : ((n * C + c) * hs + h) * ws + w;
  }
  // The window of output (oh, ow) within the input: rows [hs, he), columns [ws, we), in index type I.
  template <typename I>
  __device__ __forceinline__ void window(I oh, I ow, I& hs, I& he, I& ws, I& we) const {
    const I h0 = oh * static_cast<I>(sh) - static_cast<I>(ph), w0 = ow * static_cast<I>(sw) - static_cast<I>(pw);
    hs = max(h0, I{0});
    ws = max(w0, I{0});
    he = min(h0 + static_cast<I>(kh), static_cast<I>(H));
    we = min(w0 + static_cast<I>(kw), static_cast<I>(W));
  }
  // The outputs whose windows hold input position (h, w): rows [oh0, oh1), columns [ow0, ow1).
  template <typename I>
  __device__ __forceinline__ void holding(I h, I w, I& oh0, I& oh1, I& ow0, I& ow1) const {
    windows_holding<I>(h, static_cast<I>(kh), static_cast<I>(sh), static_cast<I>(ph), static_cast<I>(OH), oh0, oh1);
    windows_holding<I>(w, static_cast<I>(kw), static_cast<I>(sw), static_cast<I>(pw), static_cast<I>(OW), ow0, ow1);
  }
  // avg pooling's divisor of output (oh, ow), as PyTorch's.
  __device__ __forceinline__ int64_t divisor(int64_t oh, int64_t ow) const {
    int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
    int64_t h1 = min(h0 + kh, H + ph), w1 = min(w0 + kw, W + pw);
    if (count_include_pad) return (h1 - h0) * (w1 - w0);
    h0 = max(h0, int64_t{0});
    w0 = max(w0, int64_t{0});
    h1 = min(h1, H);
    w1 = min(w1, W);
    return (h1 - h0) * (w1 - w0);
  }

 private:
  // The outputs along one dim whose window [o s - p, o s - p + k) holds input position h: [first, last).
  template <typename I>
  __device__ __forceinline__ static void windows_holding(I h, I k, I s, I p, I out, I& first, I& last) {
    first = h + p < k ? I{0} : (h + p - k) / s + 1;
    last = min((h + p) / s + 1, out);
  }
};

// An element read into the accumulation type, and an accumulated value rounded once back to T.
template <typename T>
__device__ __forceinline__ acc_t<T> to_acc(device_t<T> v) {
  return static_cast<acc_t<T>>(to_compute<T>(v));
}
template <typename T>
__device__ __forceinline__ device_t<T> from_acc(acc_t<T> a) {
  return from_compute<T>(static_cast<compute_t<T>>(a));
}

// V accumulated values rounded to T and stored as one vector at p.
template <typename T, int V>
__device__ __forceinline__ void store_acc(device_t<T>* p, const acc_t<T> (&a)[V]) {
  Vec<T, V> out;
#pragma unroll
  for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(a[j]);
  store_vec<T, V>(p, out);
}

// The sum of channel c of image n of x over input rows [hs, he) and columns [ws, we), row by row.
template <typename T>
__device__ __forceinline__ acc_t<T> window_sum(const device_t<T>* x, const Geometry& g, int64_t n, int64_t c,
                                               int64_t hs, int64_t he, int64_t ws, int64_t we) {
  acc_t<T> sum = 0;
  for (int64_t h = hs; h < he; ++h)
    for (int64_t w = ws; w < we; ++w) sum += to_acc<T>(x[g.offset(n, c, h, w, g.H, g.W)]);
  return sum;
}

// A grid-stride loop of index i of type I over [0, n).
#define KILN_GRID_STRIDE(I, i, n)                                            \
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<I>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void __launch_bounds__(kThreads)
    max_forward_kernel(const device_t<T>* x, device_t<T>* y, int32_t* idx, Geometry g, int64_t total) {
  using Acc = acc_t<T>;
  KILN_GRID_STRIDE(int64_t, i, total) {
    int64_t n, c, oh, ow, hs, he, ws, we;
    g.split(i, g.OH, g.OW, n, c, oh, ow);
    g.window(oh, ow, hs, he, ws, we);
    // PyTorch's rule: start at the window's first in-input position with -inf; strictly greater (or NaN) wins.
    Acc best = -INFINITY;
    int64_t best_at = hs * g.W + ws;
    for (int64_t h = hs; h < he; ++h) {
      for (int64_t w = ws; w < we; ++w) {
        const Acc v = to_acc<T>(x[g.offset(n, c, h, w, g.H, g.W)]);
        if (v > best || v != v) {
          best = v;
          best_at = h * g.W + w;
          if (v != v) break;
        }
      }
      if (best != best) break;
    }
    y[i] = from_acc<T>(best);
    idx[i] = static_cast<int32_t>(best_at);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    max_backward_kernel(const device_t<T>* dy, const int32_t* idx, device_t<T>* dx, Geometry g, int64_t total) {
  using Acc = acc_t<T>;
  KILN_GRID_STRIDE(int64_t, i, total) {
    int64_t n, c, h, w, oh0, oh1, ow0, ow1;
    g.split(i, g.H, g.W, n, c, h, w);
    g.holding(h, w, oh0, oh1, ow0, ow1);
    const int64_t me = h * g.W + w;
    Acc sum = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t o = g.offset(n, c, oh, ow, g.OH, g.OW);
        if (idx[o] == me) sum += to_acc<T>(dy[o]);
      }
    }
    dx[i] = from_acc<T>(sum);
  }
}

// A vector's V int32 indices as int4 (V % 4 == 0) or int2 (V == 2) accesses; idx is aligned to 4 V bytes.
template <int V>
__device__ __forceinline__ void store_indices(int32_t* idx, const int32_t (&at)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4)
      *reinterpret_cast<int4*>(idx + j) = make_int4(at[j], at[j + 1], at[j + 2], at[j + 3]);
  } else {
    static_assert(V == 2, "indices go out as int4 or int2 vectors");
    *reinterpret_cast<int2*>(idx) = make_int2(at[0], at[1]);
  }
}

template <int V>
__device__ __forceinline__ void load_indices(const int32_t* idx, int32_t (&at)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      const int4 q = __ldg(reinterpret_cast<const int4*>(idx + j));
      at[j] = q.x;
      at[j + 1] = q.y;
      at[j + 2] = q.z;
      at[j + 3] = q.w;
    }
  } else {
    static_assert(V == 2, "indices come in as int4 or int2 vectors");
    const int2 q = __ldg(reinterpret_cast<const int2*>(idx));
    at[0] = q.x;
    at[1] = q.y;
  }
}

// g's extents in index type I, for the NHWC kernels that take V channels a thread (cv vectors a pixel).
template <int V, typename I>
struct VecExtents {
  I C, H, W, OH, OW, cv;
  __device__ __forceinline__ explicit VecExtents(const Geometry& g)
      : C(static_cast<I>(g.C)),
        H(static_cast<I>(g.H)),
        W(static_cast<I>(g.W)),
        OH(static_cast<I>(g.OH)),
        OW(static_cast<I>(g.OW)),
        cv(C / V) {}
  // Vector i of an NHWC tensor (N, C, h_size, w_size) -> its pixel (n, h, w) and first channel c0.
  __device__ __forceinline__ void split(I i, I h_size, I w_size, I& n, I& h, I& w, I& c0) const {
    c0 = pop_digit(i, cv) * V;
    w = pop_digit(i, w_size);
    h = pop_digit(i, h_size);
    n = i;
  }
};

// NHWC with C % V == 0 and 16-byte aligned pointers (the indices' too): a thread takes V consecutive channels of
// one pixel, so the pixel's coordinates are worked out once per V elements and every access is a vector (16 bytes
// of values; the V int32 indices in V / 4 int4). Same results as the kernels above: the same window order, first
// maximum (or first NaN) wins, gradients summed over the windows in the same order. I is the index type: int32
// where every element index fits (64-bit divisions cost more than the memory traffic of these kernels).
template <typename T, int V, typename I>
__global__ void __launch_bounds__(kThreads)
    max_forward_nhwc_kernel(const device_t<T>* x, device_t<T>* y, int32_t* idx, Geometry g64, I total_vecs) {
  using Acc = acc_t<T>;
  const VecExtents<V, I> e(g64);
  const I C = e.C, W = e.W;
  KILN_GRID_STRIDE(I, i, total_vecs) {
    I n, oh, ow, c0, hs, he, ws, we;
    e.split(i, e.OH, e.OW, n, oh, ow, c0);  // output pixel
    g64.window(oh, ow, hs, he, ws, we);
    Acc best[V];
    int32_t at[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      best[j] = -INFINITY;
      at[j] = static_cast<int32_t>(hs * W + ws);
    }
    for (I h = hs; h < he; ++h) {
      for (I w = ws; w < we; ++w) {
        const Vec<T, V> v = load_vec<T, V>(x + ((n * e.H + h) * W + w) * C + c0);
        const auto here = static_cast<int32_t>(h * W + w);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const Acc a = to_acc<T>(v.v[j]);
          if (best[j] == best[j] && (a > best[j] || a != a)) {  // a NaN, once found, stays
            best[j] = a;
            at[j] = here;
          }
        }
      }
    }
    const I o = i * V;  // y and idx are NHWC: output pixel p's channels c0.. at p C + c0 = i V
    store_acc<T, V>(y + o, best);
    store_indices<V>(idx + o, at);
  }
}

template <typename T, int V, typename I>
__global__ void __launch_bounds__(kThreads)
    max_backward_nhwc_kernel(const device_t<T>* dy, const int32_t* idx, device_t<T>* dx, Geometry g64, I total_vecs) {
  using Acc = acc_t<T>;
  const VecExtents<V, I> e(g64);
  KILN_GRID_STRIDE(I, i, total_vecs) {
    I n, h, w, c0, oh0, oh1, ow0, ow1;
    e.split(i, e.H, e.W, n, h, w, c0);  // input pixel
    g64.holding(h, w, oh0, oh1, ow0, ow1);
    const auto me = static_cast<int32_t>(h * e.W + w);
    Acc sum[V];
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] = Acc(0);
    for (I oh = oh0; oh < oh1; ++oh) {
      for (I ow = ow0; ow < ow1; ++ow) {
        const I o = ((n * e.OH + oh) * e.OW + ow) * e.C + c0;
        const Vec<T, V> d = load_vec<T, V>(dy + o);
        int32_t at[V];
        load_indices<V>(idx + o, at);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (at[j] == me) sum[j] += to_acc<T>(d.v[j]);
        }
      }
    }
    store_acc<T, V>(dx + i * V, sum);
  }
}

// Global average pooling (output 1 x 1) of NHWC inputs, V channels a thread: the forward sums a (n, channels)
// vector over the H W pixels in the generic kernel's order (h, then w) and divides once; the backward writes
// every pixel of image n the vector dy(n) / (H W), what the generic kernel's one-window sum makes of it.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    global_avg_forward_nhwc_kernel(const device_t<T>* x, device_t<T>* y, int64_t C, int64_t HW, int64_t total_vecs) {
  using Acc = acc_t<T>;
  const int64_t cv = C / V;
  KILN_GRID_STRIDE(int64_t, i, total_vecs) {
    const int64_t n = i / cv, c0 = (i - n * cv) * V;
    const device_t<T>* base = x + n * HW * C + c0;
    Acc sum[V];
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] = Acc(0);
    for (int64_t q = 0; q < HW; ++q) {
      const Vec<T, V> v = load_vec<T, V>(base + q * C);
#pragma unroll
      for (int j = 0; j < V; ++j) sum[j] += to_acc<T>(v.v[j]);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] /= static_cast<Acc>(HW);
    store_acc<T, V>(y + i * V, sum);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    global_avg_backward_nhwc_kernel(const device_t<T>* dy, device_t<T>* dx, int64_t C, int64_t HW, int64_t total_vecs) {
  using Acc = acc_t<T>;
  const int64_t cv = C / V, image_vecs = HW * cv;
  KILN_GRID_STRIDE(int64_t, i, total_vecs) {
    const int64_t n = i / image_vecs, c0 = (i % cv) * V;
    const Vec<T, V> d = load_vec<T, V>(dy + n * C + c0);
    Acc sum[V];
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] = Acc(0) + to_acc<T>(d.v[j]) / static_cast<Acc>(HW);
    store_acc<T, V>(dx + i * V, sum);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    avg_forward_kernel(const device_t<T>* x, device_t<T>* y, Geometry g, int64_t total) {
  KILN_GRID_STRIDE(int64_t, i, total) {
    int64_t n, c, oh, ow, hs, he, ws, we;
    g.split(i, g.OH, g.OW, n, c, oh, ow);
    g.window(oh, ow, hs, he, ws, we);
    y[i] = from_acc<T>(window_sum<T>(x, g, n, c, hs, he, ws, we) / static_cast<acc_t<T>>(g.divisor(oh, ow)));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    avg_backward_kernel(const device_t<T>* dy, device_t<T>* dx, Geometry g, int64_t total) {
  using Acc = acc_t<T>;
  KILN_GRID_STRIDE(int64_t, i, total) {
    int64_t n, c, h, w, oh0, oh1, ow0, ow1;
    g.split(i, g.H, g.W, n, c, h, w);
    g.holding(h, w, oh0, oh1, ow0, ow1);
    Acc sum = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow)
        sum += to_acc<T>(dy[g.offset(n, c, oh, ow, g.OH, g.OW)]) / static_cast<Acc>(g.divisor(oh, ow));
    dx[i] = from_acc<T>(sum);
  }
}

__device__ __forceinline__ int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return o * in / out; }
__device__ __forceinline__ int64_t adaptive_end(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    adaptive_forward_kernel(const device_t<T>* x, device_t<T>* y, Geometry g, int64_t total) {
  KILN_GRID_STRIDE(int64_t, i, total) {
    int64_t n, c, oh, ow;
    g.split(i, g.OH, g.OW, n, c, oh, ow);
    const int64_t hs = adaptive_start(oh, g.H, g.OH), he = adaptive_end(oh, g.H, g.OH);
    const int64_t ws = adaptive_start(ow, g.W, g.OW), we = adaptive_end(ow, g.W, g.OW);
    y[i] = from_acc<T>(window_sum<T>(x, g, n, c, hs, he, ws, we) / static_cast<acc_t<T>>((he - hs) * (we - ws)));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    adaptive_backward_kernel(const device_t<T>* dy, device_t<T>* dx, Geometry g, int64_t total) {
  using Acc = acc_t<T>;
  KILN_GRID_STRIDE(int64_t, i, total) {
    int64_t n, c, h, w;
    g.split(i, g.H, g.W, n, c, h, w);
    // Output o holds h exactly when floor(h OH / H) <= o < ceil((h + 1) OH / H).
    const int64_t oh0 = h * g.OH / g.H, oh1 = min(((h + 1) * g.OH + g.H - 1) / g.H, g.OH);
    const int64_t ow0 = w * g.OW / g.W, ow1 = min(((w + 1) * g.OW + g.W - 1) / g.W, g.OW);
    Acc sum = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const int64_t hs = adaptive_start(oh, g.H, g.OH), he = adaptive_end(oh, g.H, g.OH);
      if (h < hs || h >= he) continue;
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t ws = adaptive_start(ow, g.W, g.OW), we = adaptive_end(ow, g.W, g.OW);
        if (w < ws || w >= we) continue;
        sum += to_acc<T>(dy[g.offset(n, c, oh, ow, g.OH, g.OW)]) / static_cast<Acc>((he - hs) * (we - ws));
      }
    }
    dx[i] = from_acc<T>(sum);
  }
}

#undef KILN_GRID_STRIDE

// ---------------------------------------------------------------- launchers

bool is_nhwc(const Tensor& x) { return x.is_contiguous(MemoryFormat::ChannelsLast) && !x.is_contiguous(); }

// An uninitialised (N, C, h, w) tensor of dtype in the layout nhwc says.
Tensor empty_4d(int64_t n, int64_t c, int64_t h, int64_t w, DType dtype, Device device, bool nhwc) {
  const Strides strides = nhwc ? Strides{h * w * c, 1, w * c, c} : Strides{c * h * w, h * w, w, 1};
  return internal::empty_strided({n, c, h, w}, strides, TensorOptions{.dtype = dtype, .device = device});
}

// What every op starts from: x as the kernels read it (NHWC stays, everything else is made NCHW-contiguous) and
// the geometry of its pooling to `out`; the tensors the op makes take x's layout.
struct Pooling {
  Tensor x;  // (N, C, H, W)
  Geometry g;

  Pooling(const Tensor& x0, const PoolParams& p, std::array<int64_t, 2> out)
      : x(is_nhwc(x0) ? x0 : internal::contiguous(x0)),
        g{x.size(0),   x.size(1),   x.size(2),   x.size(3),   out[0],   out[1],   is_nhwc(x),
          p.kernel[0], p.kernel[1], p.stride[0], p.stride[1], p.pad[0], p.pad[1], p.count_include_pad} {}

  // An uninitialised output (N, C, OH, OW) of dtype.
  Tensor output(DType dtype) const { return empty_4d(g.N, g.C, g.OH, g.OW, dtype, x.device(), g.nhwc); }
  // An uninitialised input gradient (N, C, H, W).
  Tensor input_grad() const { return empty_4d(g.N, g.C, g.H, g.W, x.dtype(), x.device(), g.nhwc); }
  // t (N, C, OH, OW) (the indices, a gradient already in x's dtype) dense in x's layout.
  Tensor in_layout(const Tensor& t) const {
    return g.nhwc ? internal::contiguous(t, MemoryFormat::ChannelsLast) : internal::contiguous(t);
  }
  // The gradient of the output in x's dtype and layout.
  Tensor output_grad(const Tensor& grad_out) const { return in_layout(grad_out.to(x.dtype())); }

  // Runs body(T{}, stream) with T the kiln type of x's dtype, on x's stream, unless there is nothing to
  // compute (total == 0).
  template <typename Body>
  void dispatch(int64_t total, const char* op, Body&& body) const {
    if (total == 0) return;
    cudaStream_t stream = cuda::stream_for(x);
    visit_floating_dtype(x.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      body(T{}, stream);
    });
    KILN_CUDA_CHECK_LAUNCH(op);
  }

  // The output y of a forward pass that body(T{}, stream, y, total) computes from x, total = y.numel().
  template <typename Body>
  Tensor forward(const char* op, Body&& body) const {
    Tensor y = output(x.dtype());
    const int64_t total = y.numel();
    dispatch(total, op, [&](auto t, cudaStream_t stream) { body(t, stream, y, total); });
    return y;
  }
  // The input gradient dx of a backward pass that body(T{}, stream, dy, dx, total) computes from dy (grad_out in
  // x's dtype and layout), total = dx.numel().
  template <typename Body>
  Tensor backward(const Tensor& grad_out, const char* op, Body&& body) const {
    const Tensor dy = output_grad(grad_out);
    Tensor dx = input_grad();
    const int64_t total = dx.numel();
    dispatch(total, op, [&](auto t, cudaStream_t stream) { body(t, stream, dy, dx, total); });
    return dx;
  }

  // Whether the NHWC vector kernels (V = kVecWidth<T> channels a thread) take tensors at these pointers.
  template <typename T>
  bool vectorizable(std::initializer_list<const void*> ptrs) const {
    return g.nhwc && kVecWidth<T> > 1 && vector_width<T>(ptrs, g.C) == kVecWidth<T>;
  }
  // Global average pooling (output 1 x 1) that the NHWC vector kernels take.
  template <typename T>
  bool is_global_nhwc(std::initializer_list<const void*> ptrs) const {
    return g.OH == 1 && g.OW == 1 && vectorizable<T>(ptrs);
  }
};

// kernel<<<the grid for a grid-stride loop over `items`, kThreads>>>(args...) on stream.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), int64_t items, cudaStream_t stream, const Args&... args) {
  kernel<<<grid_for(items, kThreads), kThreads, 0, stream>>>(args...);
}

// Calls fn(I{}) with I = int32_t where every element index of t fits in it (the NHWC max-pooling kernels then
// index in 32 bits), else int64_t.
template <typename Fn>
void with_index_type(const Tensor& t, Fn&& fn) {
  if (t.numel() <= std::numeric_limits<int32_t>::max()) {
    fn(int32_t{});
  } else {
    fn(int64_t{});
  }
}

template <typename T>
const device_t<T>* in_ptr(const Tensor& t) {
  return static_cast<const device_t<T>*>(t.data_ptr());
}
template <typename T>
device_t<T>* out_ptr(const Tensor& t) {
  return static_cast<device_t<T>*>(t.data_ptr());
}

}  // namespace

std::pair<Tensor, Tensor> max_pool2d_forward(const Tensor& x0, const PoolParams& p) {
  trace::Scope range(trace::Kind::Op, "max_pool2d_forward", x0.device(), {&x0});
  const Pooling s(x0, p, p.out);
  const Tensor& x = s.x;
  const Geometry& g = s.g;
  // The indices (saved for backward only) are positions h W + w in the input plane, as int32.
  KILN_CHECK(g.H * g.W <= std::numeric_limits<int32_t>::max(), "max_pool2d: input planes of ", g.H, " x ", g.W,
             " positions are more than this kernel indexes (2^31 - 1)");
  Tensor y = s.output(x.dtype());
  Tensor idx = s.output(DType::Int32);
  const int64_t total = y.numel();
  s.dispatch(total, "max_pool2d", [&](auto t, cudaStream_t stream) {
    using T = decltype(t);
    constexpr int V = kVecWidth<T>;
    if (!s.vectorizable<T>({x.data_ptr(), y.data_ptr(), idx.data_ptr()})) {
      return launch(max_forward_kernel<T>, total, stream, in_ptr<T>(x), out_ptr<T>(y), idx.data_ptr<int32_t>(), g,
                    total);
    }
    with_index_type(x, [&](auto index) {
      using I = decltype(index);
      launch(max_forward_nhwc_kernel<T, V, I>, total / V, stream, in_ptr<T>(x), out_ptr<T>(y), idx.data_ptr<int32_t>(),
             g, static_cast<I>(total / V));
    });
  });
  return {y, idx};
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const PoolParams& p, const Tensor& x0) {
  trace::Scope range(trace::Kind::Op, "max_pool2d_backward", x0.device(), {&grad_out, &x0});
  const Pooling s(x0, p, p.out);
  const Tensor idx = s.in_layout(indices);
  return s.backward(grad_out, "max_pool2d backward",
                    [&](auto t, cudaStream_t stream, const Tensor& dy, const Tensor& dx, int64_t total) {
                      using T = decltype(t);
                      constexpr int V = kVecWidth<T>;
                      const int32_t* at = idx.data_ptr<int32_t>();
                      if (!s.vectorizable<T>({dy.data_ptr(), dx.data_ptr(), at})) {
                        return launch(max_backward_kernel<T>, total, stream, in_ptr<T>(dy), at, out_ptr<T>(dx), s.g,
                                      total);
                      }
                      with_index_type(dx, [&](auto index) {
                        using I = decltype(index);
                        launch(max_backward_nhwc_kernel<T, V, I>, total / V, stream, in_ptr<T>(dy), at, out_ptr<T>(dx),
                               s.g, static_cast<I>(total / V));
                      });
                    });
}

Tensor avg_pool2d_forward(const Tensor& x0, const PoolParams& p) {
  trace::Scope range(trace::Kind::Op, "avg_pool2d_forward", x0.device(), {&x0});
  const Pooling s(x0, p, p.out);
  return s.forward("avg_pool2d", [&](auto t, cudaStream_t stream, const Tensor& y, int64_t total) {
    using T = decltype(t);
    launch(avg_forward_kernel<T>, total, stream, in_ptr<T>(s.x), out_ptr<T>(y), s.g, total);
  });
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const PoolParams& p, const Tensor& x0) {
  trace::Scope range(trace::Kind::Op, "avg_pool2d_backward", x0.device(), {&grad_out, &x0});
  const Pooling s(x0, p, p.out);
  return s.backward(grad_out, "avg_pool2d backward",
                    [&](auto t, cudaStream_t stream, const Tensor& dy, const Tensor& dx, int64_t total) {
                      using T = decltype(t);
                      launch(avg_backward_kernel<T>, total, stream, in_ptr<T>(dy), out_ptr<T>(dx), s.g, total);
                    });
}

Tensor adaptive_avg_pool2d_forward(const Tensor& x0, std::array<int64_t, 2> out) {
  trace::Scope range(trace::Kind::Op, "adaptive_avg_pool2d_forward", x0.device(), {&x0});
  const Pooling s(x0, PoolParams{}, out);
  return s.forward("adaptive_avg_pool2d", [&](auto t, cudaStream_t stream, const Tensor& y, int64_t total) {
    using T = decltype(t);
    constexpr int V = kVecWidth<T>;
    if (s.is_global_nhwc<T>({s.x.data_ptr(), y.data_ptr()})) {
      return launch(global_avg_forward_nhwc_kernel<T, V>, total / V, stream, in_ptr<T>(s.x), out_ptr<T>(y), s.g.C,
                    s.g.H * s.g.W, total / V);
    }
    launch(adaptive_forward_kernel<T>, total, stream, in_ptr<T>(s.x), out_ptr<T>(y), s.g, total);
  });
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Tensor& x0) {
  trace::Scope range(trace::Kind::Op, "adaptive_avg_pool2d_backward", x0.device(), {&grad_out, &x0});
  const Pooling s(x0, PoolParams{}, {grad_out.size(2), grad_out.size(3)});
  return s.backward(grad_out, "adaptive_avg_pool2d backward",
                    [&](auto t, cudaStream_t stream, const Tensor& dy, const Tensor& dx, int64_t total) {
                      using T = decltype(t);
                      constexpr int V = kVecWidth<T>;
                      if (s.is_global_nhwc<T>({dy.data_ptr(), dx.data_ptr()})) {
                        return launch(global_avg_backward_nhwc_kernel<T, V>, total / V, stream, in_ptr<T>(dy),
                                      out_ptr<T>(dx), s.g.C, s.g.H * s.g.W, total / V);
                      }
                      launch(adaptive_backward_kernel<T>, total, stream, in_ptr<T>(dy), out_ptr<T>(dx), s.g, total);
                    });
}

}  // namespace kiln::nn::cuda_impl
