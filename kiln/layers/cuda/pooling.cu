// 2-d pooling on CUDA (pooling.h): kernels first, then the launchers. Element (n, c, h, w) of a 4-d tensor
// sits at n sN + c sC + h sH + w sW with the strides of NCHW or NHWC (Geometry); consecutive threads take
// consecutive elements of the layout, so NHWC threads read consecutive channels (coalesced). Max pooling of NHWC
// inputs whose channels fill 16-byte vectors takes V channels per thread (the ResNet stem's case).
#include "kiln/layers/cuda/pooling.h"
#include "kiln/tensor/trace.h"  // a range per kernel entry

#include <cuda_runtime.h>

#include <limits>

#include "kiln/layers/cuda/layer_kernels.cuh"  // grid_for, Vec, load_vec, vector_width
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

// Sizes of the input (H, W) and output (OH, OW) planes, N, C, and the layout both share.
struct Geometry {
  int64_t N, C, H, W, OH, OW;
  bool nhwc;
  int64_t kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
  // Linear index i of an element in a tensor (N, C, h_size, w_size) of this layout -> (n, c, h, w).
  __device__ __forceinline__ void split(int64_t i, int64_t hs, int64_t ws, int64_t& n, int64_t& c, int64_t& h,
                                        int64_t& w) const {
    if (nhwc) {
      c = i % C;
      i /= C;
      w = i % ws;
      i /= ws;
      h = i % hs;
      n = i / hs;
    } else {
      w = i % ws;
      i /= ws;
      h = i % hs;
      i /= hs;
      c = i % C;
      n = i / C;
    }
  }
  __device__ __forceinline__ int64_t offset(int64_t n, int64_t c, int64_t h, int64_t w, int64_t hs, int64_t ws) const {
    return nhwc ? ((n * hs + h) * ws + w) * C + c : ((n * C + c) * hs + h) * ws + w;
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
};

#define KILN_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void __launch_bounds__(kThreads)
    max_forward_kernel(const device_t<T>* x, device_t<T>* y, int32_t* idx, Geometry g, int64_t total) {
  using Acc = acc_t<T>;
  KILN_GRID_STRIDE(i, total) {
    int64_t n, c, oh, ow;
    g.split(i, g.OH, g.OW, n, c, oh, ow);
    const int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    const int64_t hs = max(h0, int64_t{0}), ws = max(w0, int64_t{0});
    const int64_t he = min(h0 + g.kh, g.H), we = min(w0 + g.kw, g.W);
    // PyTorch's rule: start at the window's first in-input position with -inf; strictly greater (or NaN) wins.
    Acc best = -INFINITY;
    int64_t best_at = hs * g.W + ws;
    for (int64_t h = hs; h < he; ++h) {
      for (int64_t w = ws; w < we; ++w) {
        const Acc v = static_cast<Acc>(to_compute<T>(x[g.offset(n, c, h, w, g.H, g.W)]));
        if (v > best || v != v) {
          best = v;
          best_at = h * g.W + w;
          if (v != v) break;
        }
      }
      if (best != best) break;
    }
    y[i] = from_compute<T>(static_cast<compute_t<T>>(best));
    idx[i] = static_cast<int32_t>(best_at);
  }
}

// The outputs along one dim whose window [o s - p, o s - p + k) holds input position h: [first, last).
__device__ __forceinline__ void windows_holding(int64_t h, int64_t k, int64_t s, int64_t p, int64_t out, int64_t& first,
                                                int64_t& last) {
  first = h + p < k ? 0 : (h + p - k) / s + 1;
  last = min((h + p) / s + 1, out);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    max_backward_kernel(const device_t<T>* dy, const int32_t* idx, device_t<T>* dx, Geometry g, int64_t total) {
  using Acc = acc_t<T>;
  KILN_GRID_STRIDE(i, total) {
    int64_t n, c, h, w;
    g.split(i, g.H, g.W, n, c, h, w);
    int64_t oh0, oh1, ow0, ow1;
    windows_holding(h, g.kh, g.sh, g.ph, g.OH, oh0, oh1);
    windows_holding(w, g.kw, g.sw, g.pw, g.OW, ow0, ow1);
    const int64_t me = h * g.W + w;
    Acc sum = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t o = g.offset(n, c, oh, ow, g.OH, g.OW);
        if (idx[o] == me) sum += static_cast<Acc>(to_compute<T>(dy[o]));
      }
    }
    dx[i] = from_compute<T>(static_cast<compute_t<T>>(sum));
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

// NHWC with C % V == 0 and 16-byte aligned pointers (the indices' too): a thread takes V consecutive channels of
// one pixel, so the pixel's coordinates are worked out once per V elements and every access is a vector (16 bytes
// of values; the V int32 indices in V / 4 int4). Same results as the kernels above: the same window order, first
// maximum (or first NaN) wins, gradients summed over the windows in the same order. I is the index type: int32
// where every element index fits (64-bit divisions cost more than the memory traffic of these kernels).
template <typename T, int V, typename I>
__global__ void __launch_bounds__(kThreads)
    max_forward_nhwc_kernel(const device_t<T>* x, device_t<T>* y, int32_t* idx, Geometry g64, I total_vecs) {
  using Acc = acc_t<T>;
  const I C = static_cast<I>(g64.C), H = static_cast<I>(g64.H), W = static_cast<I>(g64.W);
  const I OH = static_cast<I>(g64.OH), OW = static_cast<I>(g64.OW);
  const I cv = C / V;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total_vecs;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I c0 = (i % cv) * V;
    I p = i / cv;  // output pixel
    const I ow = p % OW;
    p /= OW;
    const I oh = p % OH, n = p / OH;
    const I h0 = oh * static_cast<I>(g64.sh) - static_cast<I>(g64.ph);
    const I w0 = ow * static_cast<I>(g64.sw) - static_cast<I>(g64.pw);
    const I hs = max(h0, I{0}), ws = max(w0, I{0});
    const I he = min(h0 + static_cast<I>(g64.kh), H), we = min(w0 + static_cast<I>(g64.kw), W);
    Acc best[V];
    int32_t at[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      best[j] = -INFINITY;
      at[j] = static_cast<int32_t>(hs * W + ws);
    }
    for (I h = hs; h < he; ++h) {
      for (I w = ws; w < we; ++w) {
        const Vec<T, V> v = load_vec<T, V>(x + ((n * H + h) * W + w) * C + c0);
        const auto here = static_cast<int32_t>(h * W + w);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const Acc a = static_cast<Acc>(to_compute<T>(v.v[j]));
          if (best[j] == best[j] && (a > best[j] || a != a)) {  // a NaN, once found, stays
            best[j] = a;
            at[j] = here;
          }
        }
      }
    }
    Vec<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_compute<T>(static_cast<compute_t<T>>(best[j]));
    const I o = i * V;  // y and idx are NHWC: output pixel p's channels c0.. at p C + c0 = i V
    store_vec<T, V>(y + o, out);
    store_indices<V>(idx + o, at);
  }
}

template <typename T, int V, typename I>
__global__ void __launch_bounds__(kThreads)
    max_backward_nhwc_kernel(const device_t<T>* dy, const int32_t* idx, device_t<T>* dx, Geometry g64, I total_vecs) {
  using Acc = acc_t<T>;
  const I C = static_cast<I>(g64.C), H = static_cast<I>(g64.H), W = static_cast<I>(g64.W);
  const I OH = static_cast<I>(g64.OH), OW = static_cast<I>(g64.OW);
  const I kh = static_cast<I>(g64.kh), kw = static_cast<I>(g64.kw), sh = static_cast<I>(g64.sh),
          sw = static_cast<I>(g64.sw), ph = static_cast<I>(g64.ph), pw = static_cast<I>(g64.pw);
  const I cv = C / V;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total_vecs;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I c0 = (i % cv) * V;
    I p = i / cv;  // input pixel
    const I w = p % W;
    p /= W;
    const I h = p % H, n = p / H;
    // The outputs whose windows hold (h, w), as windows_holding.
    const I oh0 = h + ph < kh ? I{0} : (h + ph - kh) / sh + 1, oh1 = min((h + ph) / sh + 1, OH);
    const I ow0 = w + pw < kw ? I{0} : (w + pw - kw) / sw + 1, ow1 = min((w + pw) / sw + 1, OW);
    const auto me = static_cast<int32_t>(h * W + w);
    Acc sum[V];
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] = Acc(0);
    for (I oh = oh0; oh < oh1; ++oh) {
      for (I ow = ow0; ow < ow1; ++ow) {
        const I o = ((n * OH + oh) * OW + ow) * C + c0;
        const Vec<T, V> d = load_vec<T, V>(dy + o);
        int32_t at[V];
        load_indices<V>(idx + o, at);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (at[j] == me) sum[j] += static_cast<Acc>(to_compute<T>(d.v[j]));
        }
      }
    }
    Vec<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_compute<T>(static_cast<compute_t<T>>(sum[j]));
    store_vec<T, V>(dx + i * V, out);
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
  KILN_GRID_STRIDE(i, total_vecs) {
    const int64_t n = i / cv, c0 = (i - n * cv) * V;
    const device_t<T>* base = x + n * HW * C + c0;
    Acc sum[V];
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] = Acc(0);
    for (int64_t q = 0; q < HW; ++q) {
      const Vec<T, V> v = load_vec<T, V>(base + q * C);
#pragma unroll
      for (int j = 0; j < V; ++j) sum[j] += static_cast<Acc>(to_compute<T>(v.v[j]));
    }
    Vec<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_compute<T>(static_cast<compute_t<T>>(sum[j] / static_cast<Acc>(HW)));
    store_vec<T, V>(y + i * V, out);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    global_avg_backward_nhwc_kernel(const device_t<T>* dy, device_t<T>* dx, int64_t C, int64_t HW, int64_t total_vecs) {
  using Acc = acc_t<T>;
  const int64_t cv = C / V, image_vecs = HW * cv;
  KILN_GRID_STRIDE(i, total_vecs) {
    const int64_t n = i / image_vecs, c0 = (i % cv) * V;
    const Vec<T, V> d = load_vec<T, V>(dy + n * C + c0);
    Vec<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const Acc sum = Acc(0) + static_cast<Acc>(to_compute<T>(d.v[j])) / static_cast<Acc>(HW);
      out.v[j] = from_compute<T>(static_cast<compute_t<T>>(sum));
    }
    store_vec<T, V>(dx + i * V, out);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    avg_forward_kernel(const device_t<T>* x, device_t<T>* y, Geometry g, int64_t total) {
  using Acc = acc_t<T>;
  KILN_GRID_STRIDE(i, total) {
    int64_t n, c, oh, ow;
    g.split(i, g.OH, g.OW, n, c, oh, ow);
    const int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    const int64_t hs = max(h0, int64_t{0}), ws = max(w0, int64_t{0});
    const int64_t he = min(h0 + g.kh, g.H), we = min(w0 + g.kw, g.W);
    Acc sum = 0;
    for (int64_t h = hs; h < he; ++h)
      for (int64_t w = ws; w < we; ++w) sum += static_cast<Acc>(to_compute<T>(x[g.offset(n, c, h, w, g.H, g.W)]));
    y[i] = from_compute<T>(static_cast<compute_t<T>>(sum / static_cast<Acc>(g.divisor(oh, ow))));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    avg_backward_kernel(const device_t<T>* dy, device_t<T>* dx, Geometry g, int64_t total) {
  using Acc = acc_t<T>;
  KILN_GRID_STRIDE(i, total) {
    int64_t n, c, h, w;
    g.split(i, g.H, g.W, n, c, h, w);
    int64_t oh0, oh1, ow0, ow1;
    windows_holding(h, g.kh, g.sh, g.ph, g.OH, oh0, oh1);
    windows_holding(w, g.kw, g.sw, g.pw, g.OW, ow0, ow1);
    Acc sum = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow)
        sum += static_cast<Acc>(to_compute<T>(dy[g.offset(n, c, oh, ow, g.OH, g.OW)])) /
               static_cast<Acc>(g.divisor(oh, ow));
    dx[i] = from_compute<T>(static_cast<compute_t<T>>(sum));
  }
}

__device__ __forceinline__ int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return o * in / out; }
__device__ __forceinline__ int64_t adaptive_end(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    adaptive_forward_kernel(const device_t<T>* x, device_t<T>* y, Geometry g, int64_t total) {
  using Acc = acc_t<T>;
  KILN_GRID_STRIDE(i, total) {
    int64_t n, c, oh, ow;
    g.split(i, g.OH, g.OW, n, c, oh, ow);
    const int64_t hs = adaptive_start(oh, g.H, g.OH), he = adaptive_end(oh, g.H, g.OH);
    const int64_t ws = adaptive_start(ow, g.W, g.OW), we = adaptive_end(ow, g.W, g.OW);
    Acc sum = 0;
    for (int64_t h = hs; h < he; ++h)
      for (int64_t w = ws; w < we; ++w) sum += static_cast<Acc>(to_compute<T>(x[g.offset(n, c, h, w, g.H, g.W)]));
    y[i] = from_compute<T>(static_cast<compute_t<T>>(sum / static_cast<Acc>((he - hs) * (we - ws))));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    adaptive_backward_kernel(const device_t<T>* dy, device_t<T>* dx, Geometry g, int64_t total) {
  using Acc = acc_t<T>;
  KILN_GRID_STRIDE(i, total) {
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
        sum += static_cast<Acc>(to_compute<T>(dy[g.offset(n, c, oh, ow, g.OH, g.OW)])) /
               static_cast<Acc>((he - hs) * (we - ws));
      }
    }
    dx[i] = from_compute<T>(static_cast<compute_t<T>>(sum));
  }
}

#undef KILN_GRID_STRIDE

// ---------------------------------------------------------------- launchers

bool is_nhwc(const Tensor& x) { return x.is_contiguous(MemoryFormat::ChannelsLast) && !x.is_contiguous(); }

// x as the kernels read it: NHWC stays, everything else is made NCHW-contiguous.
Tensor dense(const Tensor& x) { return is_nhwc(x) ? x : internal::contiguous(x); }

// An uninitialised (N, C, h, w) tensor of dtype in the layout nhwc says.
Tensor empty_4d(int64_t n, int64_t c, int64_t h, int64_t w, DType dtype, Device device, bool nhwc) {
  const Strides strides = nhwc ? Strides{h * w * c, 1, w * c, c} : Strides{c * h * w, h * w, w, 1};
  return internal::empty_strided({n, c, h, w}, strides, TensorOptions{.dtype = dtype, .device = device});
}

Geometry geometry(const Tensor& x, const PoolParams& p, std::array<int64_t, 2> out) {
  return {x.size(0),   x.size(1),   x.size(2),   x.size(3),   out[0],   out[1],   is_nhwc(x),
          p.kernel[0], p.kernel[1], p.stride[0], p.stride[1], p.pad[0], p.pad[1], p.count_include_pad};
}

// Runs kernel<T>(in, out, extra..., g, total) over `total` threads on x's stream.
template <typename Launch>
void dispatch(const Tensor& x, const char* op, Launch&& launch) {
  cudaStream_t stream = cuda::stream_for(x);
  visit_floating_dtype(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(T{}, stream);
  });
  KILN_CUDA_CHECK_LAUNCH(op);
}

template <typename T>
const device_t<T>* in_ptr(const Tensor& t) {
  return static_cast<const device_t<T>*>(t.data_ptr());
}
template <typename T>
device_t<T>* out_ptr(const Tensor& t) {
  return static_cast<device_t<T>*>(t.data_ptr());
}

// Whether every element index of t fits in int32 (the NHWC max-pooling kernels then index in 32 bits).
bool fits_int32(const Tensor& t) { return t.numel() <= std::numeric_limits<int32_t>::max(); }

// Global average pooling (output 1 x 1) of an NHWC input whose channels fill 16-byte vectors at the pointers.
template <typename T>
bool is_global_nhwc(const Geometry& g, std::initializer_list<const void*> ptrs) {
  constexpr int V = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
  return g.nhwc && g.OH == 1 && g.OW == 1 && V > 1 && vector_width<T>(ptrs, g.C) == V;
}

}  // namespace

std::pair<Tensor, Tensor> max_pool2d_forward(const Tensor& x0, const PoolParams& p) {
  trace::Scope range(trace::Kind::Op, "max_pool2d_forward", x0.device(), {&x0});
  const Tensor x = dense(x0);
  const Geometry g = geometry(x, p, p.out);
  // The indices (saved for backward only) are positions h W + w in the input plane, as int32.
  KILN_CHECK(g.H * g.W <= std::numeric_limits<int32_t>::max(), "max_pool2d: input planes of ", g.H, " x ", g.W,
             " positions are more than this kernel indexes (2^31 - 1)");
  Tensor y = empty_4d(g.N, g.C, g.OH, g.OW, x.dtype(), x.device(), g.nhwc);
  Tensor idx = empty_4d(g.N, g.C, g.OH, g.OW, DType::Int32, x.device(), g.nhwc);
  const int64_t total = y.numel();
  if (total == 0) return {y, idx};
  dispatch(x, "max_pool2d", [&](auto t, cudaStream_t stream) {
    using T = decltype(t);
    constexpr int V = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
    if (g.nhwc && V > 1 && vector_width<T>({x.data_ptr(), y.data_ptr(), idx.data_ptr()}, g.C) == V) {
      if (fits_int32(x)) {
        max_forward_nhwc_kernel<T, V, int32_t><<<grid_for(total / V, kThreads), kThreads, 0, stream>>>(
            in_ptr<T>(x), out_ptr<T>(y), idx.data_ptr<int32_t>(), g, static_cast<int32_t>(total / V));
      } else {
        max_forward_nhwc_kernel<T, V, int64_t><<<grid_for(total / V, kThreads), kThreads, 0, stream>>>(
            in_ptr<T>(x), out_ptr<T>(y), idx.data_ptr<int32_t>(), g, total / V);
      }
    } else {
      max_forward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(in_ptr<T>(x), out_ptr<T>(y),
                                                                                idx.data_ptr<int32_t>(), g, total);
    }
  });
  return {y, idx};
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const PoolParams& p, const Tensor& x0) {
  trace::Scope range(trace::Kind::Op, "max_pool2d_backward", x0.device(), {&grad_out, &x0});
  const Tensor x = dense(x0);
  const Geometry g = geometry(x, p, p.out);
  const Tensor dy = g.nhwc ? internal::contiguous(grad_out.to(x.dtype()), MemoryFormat::ChannelsLast)
                           : internal::contiguous(grad_out.to(x.dtype()));
  const Tensor idx = g.nhwc ? internal::contiguous(indices, MemoryFormat::ChannelsLast) : internal::contiguous(indices);
  Tensor dx = empty_4d(g.N, g.C, g.H, g.W, x.dtype(), x.device(), g.nhwc);
  const int64_t total = dx.numel();
  if (total == 0) return dx;
  dispatch(x, "max_pool2d backward", [&](auto t, cudaStream_t stream) {
    using T = decltype(t);
    constexpr int V = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
    if (g.nhwc && V > 1 && vector_width<T>({dy.data_ptr(), dx.data_ptr(), idx.data_ptr()}, g.C) == V) {
      if (fits_int32(dx)) {
        max_backward_nhwc_kernel<T, V, int32_t><<<grid_for(total / V, kThreads), kThreads, 0, stream>>>(
            in_ptr<T>(dy), idx.data_ptr<int32_t>(), out_ptr<T>(dx), g, static_cast<int32_t>(total / V));
      } else {
        max_backward_nhwc_kernel<T, V, int64_t><<<grid_for(total / V, kThreads), kThreads, 0, stream>>>(
            in_ptr<T>(dy), idx.data_ptr<int32_t>(), out_ptr<T>(dx), g, total / V);
      }
    } else {
      max_backward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(in_ptr<T>(dy), idx.data_ptr<int32_t>(),
                                                                                 out_ptr<T>(dx), g, total);
    }
  });
  return dx;
}

Tensor avg_pool2d_forward(const Tensor& x0, const PoolParams& p) {
  trace::Scope range(trace::Kind::Op, "avg_pool2d_forward", x0.device(), {&x0});
  const Tensor x = dense(x0);
  const Geometry g = geometry(x, p, p.out);
  Tensor y = empty_4d(g.N, g.C, g.OH, g.OW, x.dtype(), x.device(), g.nhwc);
  const int64_t total = y.numel();
  if (total == 0) return y;
  dispatch(x, "avg_pool2d", [&](auto t, cudaStream_t stream) {
    using T = decltype(t);
    avg_forward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(in_ptr<T>(x), out_ptr<T>(y), g, total);
  });
  return y;
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const PoolParams& p, const Tensor& x0) {
  trace::Scope range(trace::Kind::Op, "avg_pool2d_backward", x0.device(), {&grad_out, &x0});
  const Tensor x = dense(x0);
  const Geometry g = geometry(x, p, p.out);
  const Tensor dy = g.nhwc ? internal::contiguous(grad_out.to(x.dtype()), MemoryFormat::ChannelsLast)
                           : internal::contiguous(grad_out.to(x.dtype()));
  Tensor dx = empty_4d(g.N, g.C, g.H, g.W, x.dtype(), x.device(), g.nhwc);
  const int64_t total = dx.numel();
  if (total == 0) return dx;
  dispatch(x, "avg_pool2d backward", [&](auto t, cudaStream_t stream) {
    using T = decltype(t);
    avg_backward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(in_ptr<T>(dy), out_ptr<T>(dx), g, total);
  });
  return dx;
}

Tensor adaptive_avg_pool2d_forward(const Tensor& x0, std::array<int64_t, 2> out) {
  trace::Scope range(trace::Kind::Op, "adaptive_avg_pool2d_forward", x0.device(), {&x0});
  const Tensor x = dense(x0);
  const Geometry g = geometry(x, PoolParams{}, out);
  Tensor y = empty_4d(g.N, g.C, g.OH, g.OW, x.dtype(), x.device(), g.nhwc);
  const int64_t total = y.numel();
  if (total == 0) return y;
  dispatch(x, "adaptive_avg_pool2d", [&](auto t, cudaStream_t stream) {
    using T = decltype(t);
    constexpr int V = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
    if (is_global_nhwc<T>(g, {x.data_ptr(), y.data_ptr()})) {
      global_avg_forward_nhwc_kernel<T, V><<<grid_for(total / V, kThreads), kThreads, 0, stream>>>(
          in_ptr<T>(x), out_ptr<T>(y), g.C, g.H * g.W, total / V);
      return;
    }
    adaptive_forward_kernel<T>
        <<<grid_for(total, kThreads), kThreads, 0, stream>>>(in_ptr<T>(x), out_ptr<T>(y), g, total);
  });
  return y;
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Tensor& x0) {
  trace::Scope range(trace::Kind::Op, "adaptive_avg_pool2d_backward", x0.device(), {&grad_out, &x0});
  const Tensor x = dense(x0);
  const Geometry g = geometry(x, PoolParams{}, {grad_out.size(2), grad_out.size(3)});
  const Tensor dy = g.nhwc ? internal::contiguous(grad_out.to(x.dtype()), MemoryFormat::ChannelsLast)
                           : internal::contiguous(grad_out.to(x.dtype()));
  Tensor dx = empty_4d(g.N, g.C, g.H, g.W, x.dtype(), x.device(), g.nhwc);
  const int64_t total = dx.numel();
  if (total == 0) return dx;
  dispatch(x, "adaptive_avg_pool2d backward", [&](auto t, cudaStream_t stream) {
    using T = decltype(t);
    constexpr int V = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
    if (is_global_nhwc<T>(g, {dy.data_ptr(), dx.data_ptr()})) {
      global_avg_backward_nhwc_kernel<T, V><<<grid_for(total / V, kThreads), kThreads, 0, stream>>>(
          in_ptr<T>(dy), out_ptr<T>(dx), g.C, g.H * g.W, total / V);
      return;
    }
    adaptive_backward_kernel<T>
        <<<grid_for(total, kThreads), kThreads, 0, stream>>>(in_ptr<T>(dy), out_ptr<T>(dx), g, total);
  });
  return dx;
}

}  // namespace kiln::nn::cuda_impl
