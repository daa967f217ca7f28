// Batch norm on CUDA (batch_norm.h): kernels first, then the launchers.
//
// Two layouts cover every input the kernels take:
//   planes (N, C, S): NCHW-contiguous with S = prod(*) > 1; a block reduces one channel over (N, S);
//   rows   (M, C):    channels-last (M = N H W) or 2-d (M = N); a block reduces channels across rows, threads
//                     of a warp reading consecutive channels (coalesced).
// Reductions: per-thread sums, added in a fixed tree per block, one partial per (channel, split); a second
// kernel (a warp per channel) adds the splits of a channel in a fixed order and turns the sums into the
// per-channel coefficients of the elementwise pass. Elementwise passes use 16-byte vectors when the layout and
// the pointers allow (S % V == 0 for planes, C % V == 0 for rows); in rows each thread keeps its channels'
// coefficients in registers and issues the loads of several rows before their math (memory-level parallelism:
// one 16-byte load in flight per thread leaves an H200 at about half its bandwidth); the reductions walk the rows
// back to front and the elementwise passes front to back, each starting where L2 still holds what the pass before
// it touched last. Kernels whose optional inputs (y, the residual) are absent are compiled without them: fewer
// registers, more blocks per SM. The forward pass can add a residual before the ReLU (ResNet's block tail), and the
// backward pass then writes its gradient beside dx.
// (One cooperative kernel per training pass, with grid-wide barriers between sums, finalisation and the elementwise
// pass, was measured on an H200 and dropped: in whole ResNet-50 training steps it cost 0.5 ms a step more than the
// three kernels, as a cooperative launch waits for the whole GPU and overlaps nothing.)
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
#include "kiln/tensor/internal_ops.h"          // empty, contiguous

namespace kiln::nn::cuda_impl {
namespace {

using cuda::from_compute;
using cuda::to_compute;
using cuda::kdetail::ceil_div;

constexpr int kThreads = 256;
// The blocks per SM the rows kernels are compiled for with 16-bit inputs: without the bound the elementwise pass with
// a residual took 87 registers and the backward pass 108, two blocks of 256 threads an SM; the layers of a few MB
// (ResNet-18/CIFAR's 256 and 512 channels) are bound by the latency of their few rows per thread, and more warps in
// flight is what shortens them. Wider types keep the compiler's choice.
template <typename T>
constexpr int kRowsMinBlocks = sizeof(T) == 2 ? 3 : 1;

// Two sums per channel, added in a fixed order (deterministic, no atomics, no divisions per element):
//   statistics: (sum (x - K), sum (x - K)^2), K the channel's first value, a shift that keeps the variance
//               sum(x - K)^2 / n - (sum(x - K) / n)^2 free of cancellation as long as that value is within a few
//               deviations of the mean (it is one of the values); n, the values per channel, comes from the
//               launcher (exact, where a float count would stop at 2^24);
//   gradients:  (sum dy, sum dy (x - mean)), dy masked by y > 0 when ReLU was fused.
// Both ops subtract a per-channel center from x: K for the statistics, the batch mean for the gradients.
constexpr int64_t kStateSums = 2;  // the values of a State: a partials tensor holds kStateSums * C * splits
template <typename Acc>
struct State {
  Acc s1, s2;
  __device__ __forceinline__ void operator+=(const State& o) {
    s1 += o.s1;
    s2 += o.s2;
  }
};
static_assert(sizeof(State<float>) == kStateSums * sizeof(float) &&
              sizeof(State<double>) == kStateSums * sizeof(double));

// kRowsInFlight: the rows of the rows layout a thread loads before it adds any of them (reduce_rows_kernel).
// One 16-byte load per array in flight per thread kept the statistics at about half the memory bandwidth. The
// gradient sums read two arrays a row and the ReLU's mask bits: two rows take 78 registers at 8 bf16 channels per
// thread (three blocks per SM), four rows 102 (two blocks); eight rows for the statistics and four for the gradient
// sums ran ResNet-18/CIFAR's and ResNet-50's steps no faster on the H200 than these.
template <typename Acc>
struct StatsOp {
  static constexpr bool kCenterIsFirstValue = true;
  static constexpr int kRowsInFlight = 4;
  __device__ __forceinline__ void add(State<Acc>& s, Acc x, Acc, bool, Acc center) const {
    const Acc d = x - center;
    s.s1 += d;
    s.s2 += d * d;
  }
};

template <typename Acc>
struct GradSumOp {
  static constexpr bool kCenterIsFirstValue = false;
  static constexpr int kRowsInFlight = 2;
  const Acc* mean;
  // pass: the ReLU let this element through (always true without a fused ReLU)
  __device__ __forceinline__ void add(State<Acc>& s, Acc x, Acc dy, bool pass, Acc center) const {
    if (!pass) dy = Acc(0);
    s.s1 += dy;
    s.s2 += dy * (x - center);
  }
};

// The element arrays a pass reads (same shape and layout); dy, y and relu_mask may be null. The fused ReLU's
// mask is either y (an element passed where y > 0) or relu_mask, one byte per kVecWidth<T> elements (bit e % W of
// byte e / W, W = kVecWidth<T>: 8 for 16-bit inputs, 4 for float32, 2 for float64), which the forward writes where
// it runs at that width: backward then reads 1/16 of what y would cost, twice.
template <typename T>
struct Inputs {
  const device_t<T>* x;
  const device_t<T>* dy;
  const device_t<T>* y;
  const uint8_t* relu_mask = nullptr;
};

// The mask bits of the V elements from element `off` on (off % V == 0, V divides W = kVecWidth<T> <= 8: they lie
// in one byte, whatever width the pass reading them runs at).
template <typename T, int V>
__device__ __forceinline__ unsigned mask_bits(const uint8_t* relu_mask, int64_t off) {
  constexpr int W = kVecWidth<T>;
  static_assert(W <= 8 && W % V == 0, "a vector's mask bits must lie in one byte");
  return static_cast<unsigned>(__ldg(relu_mask + off / W)) >> (off % W);
}

// The vectors of element `off` on that a pass reads: `first` always (x for the statistics, dy for the gradients),
// `second` and y where their pointers are set, and the mask's bits where there is a mask; the others are left as
// they are.
template <typename T, int V>
__device__ __forceinline__ void load_at(int64_t off, const device_t<T>* first, const device_t<T>* second,
                                        const device_t<T>* y, const uint8_t* relu_mask, Vec<T, V>& v_first,
                                        Vec<T, V>& v_second, Vec<T, V>& vy, unsigned& bits) {
  v_first = load_vec<T, V>(first + off);
  if (second) v_second = load_vec<T, V>(second + off);
  if (y) vy = load_vec<T, V>(y + off);
  if (relu_mask) bits = mask_bits<T, V>(relu_mask, off);
}

// Whether element j of a vector passed the fused ReLU: by its mask bit, or by its y, or (no ReLU) always.
template <typename T, typename Acc>
__device__ __forceinline__ bool passed(bool has_mask, unsigned bits, bool has_y, device_t<T> y, int j) {
  if (has_mask) return (bits >> j) & 1u;
  return !has_y || static_cast<Acc>(to_compute<T>(y)) > Acc(0);
}

template <typename Acc>
__device__ __forceinline__ State<Acc> shfl_down(const State<Acc>& s, int d) {
  return {__shfl_down_sync(0xffffffffu, s.s1, d), __shfl_down_sync(0xffffffffu, s.s2, d)};
}

// The center of channel c: its first value (statistics; `first` is the index step between channels' first
// values: 1 for rows, S for planes) or the op's mean (gradients).
template <typename T, typename Acc, typename Op>
__device__ __forceinline__ Acc center_of(const Op& op, const device_t<T>* x, int64_t c, int64_t first) {
  if constexpr (Op::kCenterIsFirstValue) {
    return static_cast<Acc>(to_compute<T>(x[c * first]));
  } else {
    return op.mean[c];
  }
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
  const Acc center = center_of<T, Acc>(op, in.x, c, S);
  State<Acc> st{Acc(0), Acc(0)};
  for (int64_t k = split * chunk + threadIdx.x; k < k1; k += blockDim.x) {
    const int64_t n = k / sv;
    const int64_t off = (n * C + c) * S + (k - n * sv) * V;
    Vec<T, V> vx, vdy{}, vy{};
    unsigned bits = 0;
    load_at<T, V>(off, in.x, in.dy, in.y, in.relu_mask, vx, vdy, vy, bits);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const Acc dy = in.dy ? static_cast<Acc>(to_compute<T>(vdy.v[j])) : Acc(0);
      const bool pass = passed<T, Acc>(in.relu_mask != nullptr, bits, in.y != nullptr, vy.v[j], j);
      op.add(st, static_cast<Acc>(to_compute<T>(vx.v[j])), dy, pass, center);
    }
  }
  // Warp tree, then the warps' sums added in order by thread 0.
  for (int d = 16; d > 0; d >>= 1) st += shfl_down(st, d);
  __shared__ State<Acc> warp_states[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_states[warp] = st;
  __syncthreads();
  if (threadIdx.x == 0) {
    State<Acc> total = warp_states[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) total += warp_states[w];
    partial[c * splits + split] = total;
  }
}

// Adds one vector of each input array (x, and dy / y when the op reads them) to the channels' states.
template <typename T, int V, typename Acc, typename Op>
__device__ __forceinline__ void add_vectors(const Op& op, const Inputs<T>& in, State<Acc> (&st)[V],
                                            const Acc (&center)[V], const Vec<T, V>& vx, const Vec<T, V>& vdy,
                                            const Vec<T, V>& vy, unsigned bits) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const Acc dy = in.dy ? static_cast<Acc>(to_compute<T>(vdy.v[j])) : Acc(0);
    const bool pass = passed<T, Acc>(in.relu_mask != nullptr, bits, in.y != nullptr, vy.v[j], j);
    op.add(st[j], static_cast<Acc>(to_compute<T>(vx.v[j])), dy, pass, center[j]);
  }
}

// The rows of the rows layout a thread walks: first, first + step, ... (count of them; step is negative back to
// front). The passes' loops take several of them a step.
struct RowWalk {
  int64_t first, step, count;
  __device__ __forceinline__ int64_t row(int64_t k) const { return first + k * step; }
};

// Rows (M, C): thread (tx, ty) of block (bx, by) owns channels c0 .. c0 + V - 1, c0 = (blockIdx.x bx + tx) V,
// and the rows of w; the by sums per channel add up in a tree in shared memory (by is a power of two), into
// partial[c * splits + split], split = blockIdx.y. A thread loads Op::kRowsInFlight rows' vectors first and then
// adds them in row order, so its sums are the same as row by row: the order of every addition is fixed by the
// launch configuration alone.
// (The block's part of reduce_rows_kernel; sm holds by * bx * V states.)
template <typename T, int V, typename Acc, typename Op, bool kY = true>
__device__ __forceinline__ void reduce_rows_block(Inputs<T> in, const Op& op, State<Acc>* partial, int64_t C, RowWalk w,
                                                  State<Acc>* sm) {
  if constexpr (!kY) in.y = nullptr;  // known at compile time: no registers for y's vectors
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int64_t split = blockIdx.y, splits = gridDim.y;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * bx + tx) * V;
  State<Acc> st[V];
#pragma unroll
  for (int j = 0; j < V; ++j) st[j] = {Acc(0), Acc(0)};
  if (c0 < C) {
    Acc center[V];
#pragma unroll
    for (int j = 0; j < V; ++j) center[j] = center_of<T, Acc>(op, in.x, c0 + j, 1);
    constexpr int U = Op::kRowsInFlight;
    int64_t k = 0;
    for (; k + U <= w.count; k += U) {
      Vec<T, V> vx[U], vdy[U] = {}, vy[U] = {};
      unsigned bits[U] = {};
#pragma unroll
      for (int u = 0; u < U; ++u) {
        load_at<T, V>(w.row(k + u) * C + c0, in.x, in.dy, in.y, in.relu_mask, vx[u], vdy[u], vy[u], bits[u]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) add_vectors<T, V, Acc>(op, in, st, center, vx[u], vdy[u], vy[u], bits[u]);
    }
    for (; k < w.count; ++k) {  // the last rows, fewer than U
      Vec<T, V> vx, vdy{}, vy{};
      unsigned bits = 0;
      load_at<T, V>(w.row(k) * C + c0, in.x, in.dy, in.y, in.relu_mask, vx, vdy, vy, bits);
      add_vectors<T, V, Acc>(op, in, st, center, vx, vdy, vy, bits);
    }
  }
  // sm holds V planes of by x bx states, plane j for each thread's channel c0 + j: neighbouring threads of a warp
  // touch neighbouring states, free of bank conflicts (states interleaved per thread put a warp's 32 accesses 8 V
  // bytes apart: 16-way conflicts at V = 8 in float, which Nsight Compute showed stalling the tree on its barriers).
  const int plane = by * bx;
#pragma unroll
  for (int j = 0; j < V; ++j) sm[j * plane + ty * bx + tx] = st[j];
  for (int half = by / 2; half > 0; half /= 2) {
    __syncthreads();
    if (ty < half) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int i = j * plane + ty * bx + tx;
        sm[i] += sm[i + half * bx];
      }
    }
  }
  __syncthreads();
  if (ty == 0 && c0 < C) {
#pragma unroll
    for (int j = 0; j < V; ++j) partial[(c0 + j) * splits + split] = sm[j * plane + tx];
  }
}

// The rows of thread row ty of a 2-d grid's blocks in the stand-alone passes: one wave of blocks loops over all
// M rows, grid-strided (blockIdx.y by + ty, stepping by gridDim.y by), front to back or back to front (from row
// M - 1 - (blockIdx.y by + ty) down). The whole grid moves through the rows together, so what it read last is the
// front (or back) of the array, which L2 still holds when the next pass starts there.
__device__ __forceinline__ RowWalk grid_strided_rows(int64_t M, bool back_to_front) {
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  const int64_t count = i < M ? (M - 1 - i) / step + 1 : 0;
  return back_to_front ? RowWalk{M - 1 - i, -step, count} : RowWalk{i, step, count};
}

// The reductions walk back to front: their input was just written (by a convolution forward, by the gradient's
// producer backward) front to back, so its back is what L2 holds; the elementwise pass after them walks front to
// back and starts on what the reduction read last.
// kY: whether in.y may be set (the fused ReLU's mask read from y); without it in.y is ignored.
template <typename T, int V, typename Acc, typename Op, bool kY>
__global__ void __launch_bounds__(kThreads, kRowsMinBlocks<T>)
    reduce_rows_kernel(Inputs<T> in, Op op, State<Acc>* partial, int64_t M, int64_t C) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  reduce_rows_block<T, V, Acc, Op, kY>(in, op, partial, C, grid_strided_rows(M, true),
                                       reinterpret_cast<State<Acc>*>(smem_raw));
}

// One warp per channel: lane l adds splits l, l + 32, ... in order, then a fixed warp tree; lane 0 gets the
// channel's total (c is the same across the warp). (A thread per channel walking every split in turn took longer
// than the reduction itself on small inputs, where the splits are many and the channels few.)
template <typename Acc>
__device__ __forceinline__ State<Acc> channel_total(const State<Acc>* partial, int64_t splits, int64_t c, int lane) {
  State<Acc> st{Acc(0), Acc(0)};
  for (int64_t s = lane; s < splits; s += 32) st += partial[c * splits + s];
  for (int d = 16; d > 0; d >>= 1) st += shfl_down(st, d);
  return st;
}

// The statistics of channel c from its sums: mean and invstd (saved for backward), the normalisation's scale
// (y = (x - mean) scale + bias), and the running statistics updated as the composed path does:
// running = (1 - momentum) running + momentum batch (unbiased variance).
template <typename T, typename Acc, typename R>
__device__ __forceinline__ void finalize_stats_channel(const State<Acc>& st, int64_t c, Acc count, const device_t<T>* x,
                                                       int64_t first, Acc eps, const Acc* weight, Acc* mean,
                                                       Acc* invstd, Acc* scale, R* running_mean, R* running_var,
                                                       Acc momentum) {
  const Acc center = static_cast<Acc>(to_compute<T>(x[c * first]));
  const Acc d = st.s1 / count;                         // mean - center
  const Acc var = max(st.s2 / count - d * d, Acc(0));  // biased
  const Acc m = center + d, is = Acc(1) / sqrt(var + eps);
  mean[c] = m;
  invstd[c] = is;
  scale[c] = is * (weight ? weight[c] : Acc(1));
  if (running_mean != nullptr) {
    using RC = compute_t<R>;
    const Acc rm = static_cast<Acc>(to_compute<R>(reinterpret_cast<const device_t<R>*>(running_mean)[c]));
    const Acc rv = static_cast<Acc>(to_compute<R>(reinterpret_cast<const device_t<R>*>(running_var)[c]));
    const Acc unbiased = var * (count / (count - Acc(1)));
    reinterpret_cast<device_t<R>*>(running_mean)[c] =
        from_compute<R>(static_cast<RC>((Acc(1) - momentum) * rm + momentum * m));
    reinterpret_cast<device_t<R>*>(running_var)[c] =
        from_compute<R>(static_cast<RC>((Acc(1) - momentum) * rv + momentum * unbiased));
  }
}

// A warp per channel (blocks of kThreads threads).
template <typename T, typename Acc, typename R>
__global__ void finalize_stats_kernel(const State<Acc>* partial, int64_t splits, int64_t C, Acc count,
                                      const device_t<T>* x, int64_t first, Acc eps, const Acc* weight, Acc* mean,
                                      Acc* invstd, Acc* scale, R* running_mean, R* running_var, Acc momentum,
                                      int64_t* batches) {
  if (batches != nullptr && blockIdx.x == 0 && threadIdx.x == 0) ++*batches;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (c >= C) return;  // whole warps leave together
  const State<Acc> st = channel_total(partial, splits, c, static_cast<int>(threadIdx.x % 32));
  if (threadIdx.x % 32 == 0) {
    finalize_stats_channel<T, Acc, R>(st, c, count, x, first, eps, weight, mean, invstd, scale, running_mean,
                                      running_var, momentum);
  }
}

// The gradient sums of channel c: grad_weight = sum dy xhat, grad_bias = sum dy, and the coefficients of the
// elementwise pass dx = dy' p + (x - mean) q + r (dy' masked by the ReLU), from dx = (dy' - a - (x - mean) k) g
// with a = sum dy / n, k = sum dy xhat / n invstd, g = invstd w: p = g, q = -k g, r = -a g. In eval the
// statistics are constants: p = g, q = r = 0. (x - mean) stays a difference: x q + (r - mean q) would lose it
// to rounding when the mean is large beside the deviation.)
template <typename Acc>
__device__ __forceinline__ void finalize_grads_channel(const State<Acc>& st, int64_t c, Acc inv_count, const Acc* mean,
                                                       const Acc* invstd, const Acc* weight, bool training,
                                                       Acc* grad_weight, Acc* grad_bias, Acc* p, Acc* q, Acc* r) {
  const Acc sum_dy = st.s1, sum_dy_xhat = st.s2 * invstd[c];
  if (grad_weight) grad_weight[c] = sum_dy_xhat;
  if (grad_bias) grad_bias[c] = sum_dy;
  if (p) {
    const Acc g = invstd[c] * (weight ? weight[c] : Acc(1));
    p[c] = g;
    if (training) {
      const Acc a = sum_dy * inv_count, k = sum_dy_xhat * inv_count * invstd[c];
      q[c] = -k * g;
      r[c] = -a * g;
    } else {
      q[c] = Acc(0);
      r[c] = Acc(0);
    }
  }
}

template <typename Acc>
__global__ void finalize_grads_kernel(const State<Acc>* partial, int64_t splits, int64_t C, Acc inv_count,
                                      const Acc* mean, const Acc* invstd, const Acc* weight, bool training,
                                      Acc* grad_weight, Acc* grad_bias, Acc* p, Acc* q, Acc* r) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (c >= C) return;
  const State<Acc> st = channel_total(partial, splits, c, static_cast<int>(threadIdx.x % 32));
  if (threadIdx.x % 32 == 0) {
    finalize_grads_channel<Acc>(st, c, inv_count, mean, invstd, weight, training, grad_weight, grad_bias, p, q, r);
  }
}

// The elementwise passes, per vector of V elements of one channel run (coefficients c0 .. c0 + V - 1 of the
// rows layout, or one channel's repeated for planes):
//   forward:  y = (x - mean) scale + bias (+ residual) (then max(., 0) with relu)
//   backward: dy' = dy masked by y > 0 (relu); dx = dy' p + (x - mean) q + r; d_residual = dy'
// `bits` gets bit j set where output j is > 0 (as stored: the ReLU's mask, the same test backward makes on y).
template <typename T, int V, typename Acc>
__device__ __forceinline__ Vec<T, V> normalize_vec(const Vec<T, V>& vx, const Vec<T, V>& vres, bool has_res, bool relu,
                                                   const Acc* mu, const Acc* sc, const Acc* bi, int step,
                                                   unsigned& bits) {
  Vec<T, V> out;
  bits = 0;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int k = j * step;
    Acc v = (static_cast<Acc>(to_compute<T>(vx.v[j])) - mu[k]) * sc[k] + bi[k];
    if (has_res) v += static_cast<Acc>(to_compute<T>(vres.v[j]));
    if (relu) v = v > Acc(0) ? v : Acc(0);
    out.v[j] = from_compute<T>(static_cast<compute_t<T>>(v));
    if (static_cast<Acc>(to_compute<T>(out.v[j])) > Acc(0)) bits |= 1u << j;
  }
  return out;
}

// Writes a vector's mask byte (V == kVecWidth<T> > 1 only: the launcher asks for a mask only then, so no two threads
// share a byte).
template <typename T, int V>
__device__ __forceinline__ void store_mask(uint8_t* relu_mask, int64_t off, unsigned bits) {
  if constexpr (V == kVecWidth<T> && V > 1) {
    if (relu_mask) relu_mask[off / V] = static_cast<uint8_t>(bits);
  }
}

// The outputs of the backward pass: dx and / or d_residual (either may be null).
template <typename T>
struct GradOutputs {
  device_t<T>* dx;
  device_t<T>* dres;
};

template <typename T, int V, typename Acc>
__device__ __forceinline__ void backward_vec(const Vec<T, V>& vx, const Vec<T, V>& vdy, const Vec<T, V>& vy, bool has_y,
                                             bool has_mask, unsigned bits, bool training, const Acc* mu, const Acc* cp,
                                             const Acc* cq, const Acc* cr, int step, GradOutputs<T> out, int64_t off) {
  Vec<T, V> vdx, vdres;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int k = j * step;
    const bool pass = passed<T, Acc>(has_mask, bits, has_y, vy.v[j], j);
    const Acc d = pass ? static_cast<Acc>(to_compute<T>(vdy.v[j])) : Acc(0);
    vdres.v[j] = pass ? vdy.v[j] : from_compute<T>(compute_t<T>(0));
    Acc v = d * cp[k];
    if (training) v += (static_cast<Acc>(to_compute<T>(vx.v[j])) - mu[k]) * cq[k] + cr[k];
    vdx.v[j] = from_compute<T>(static_cast<compute_t<T>>(v));
  }
  if (out.dx) store_vec<T, V>(out.dx + off, vdx);
  if (out.dres) store_vec<T, V>(out.dres + off, vdres);
}

// Rows per loop step of the rows passes: every load of a step is issued before its math. (Four rows per step
// took the forward to 105 registers at 8 bf16 channels per thread, two blocks per SM; two rows take 69.)
constexpr int kForwardRowsPerStep = 2;   // 1 or 2 arrays read per row
constexpr int kBackwardRowsPerStep = 2;  // up to 3 arrays read per row

template <typename T, int V, typename Acc, bool kRes = true>
__device__ __forceinline__ void forward_rows(const device_t<T>* x, const device_t<T>* res, device_t<T>* y,
                                             uint8_t* relu_mask, const Acc* mean, const Acc* scale, const Acc* bias,
                                             bool relu, int64_t C, int64_t c0, RowWalk w) {
  if constexpr (!kRes) res = nullptr;  // known at compile time: no registers for the residual's vectors
  Acc mu[V], sc[V], bi[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    mu[j] = mean[c0 + j];
    sc[j] = scale[c0 + j];
    bi[j] = bias ? bias[c0 + j] : Acc(0);
  }
  constexpr int U = kForwardRowsPerStep;
  int64_t k = 0;
  for (; k + U <= w.count; k += U) {
    Vec<T, V> vx[U], vres[U] = {};
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t off = w.row(k + u) * C + c0;
      vx[u] = load_vec<T, V>(x + off);
      if (res) vres[u] = load_vec<T, V>(res + off);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t off = w.row(k + u) * C + c0;
      unsigned bits = 0;
      store_vec<T, V>(y + off, normalize_vec<T, V, Acc>(vx[u], vres[u], res != nullptr, relu, mu, sc, bi, 1, bits));
      store_mask<T, V>(relu_mask, off, bits);
    }
  }
  for (; k < w.count; ++k) {
    const int64_t off = w.row(k) * C + c0;
    Vec<T, V> vres{};
    const Vec<T, V> vx = load_vec<T, V>(x + off);
    if (res) vres = load_vec<T, V>(res + off);
    unsigned bits = 0;
    store_vec<T, V>(y + off, normalize_vec<T, V, Acc>(vx, vres, res != nullptr, relu, mu, sc, bi, 1, bits));
    store_mask<T, V>(relu_mask, off, bits);
  }
}

// dx is written when out.dx is set (p, and in training mean, q and r, are then defined), d_residual when
// out.dres is; x is read only for dx in training, y only with a fused ReLU.
template <typename T, int V, typename Acc, bool kY = true>
__device__ __forceinline__ void backward_rows(const device_t<T>* x, const device_t<T>* dy, const device_t<T>* y,
                                              const uint8_t* relu_mask, GradOutputs<T> out, const Acc* mean,
                                              const Acc* p, const Acc* q, const Acc* r, bool training, int64_t C,
                                              int64_t c0, RowWalk w) {
  if constexpr (!kY) y = nullptr;  // known at compile time: no registers for y's vectors
  const bool need_x = training && out.dx;
  const device_t<T>* x_read = need_x ? x : nullptr;
  Acc mu[V], cp[V], cq[V], cr[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    mu[j] = need_x ? mean[c0 + j] : Acc(0);
    cp[j] = out.dx ? p[c0 + j] : Acc(0);
    cq[j] = need_x ? q[c0 + j] : Acc(0);
    cr[j] = need_x ? r[c0 + j] : Acc(0);
  }
  constexpr int U = kBackwardRowsPerStep;
  int64_t k = 0;
  for (; k + U <= w.count; k += U) {
    Vec<T, V> vdy[U], vx[U] = {}, vy[U] = {};
    unsigned bits[U] = {};
#pragma unroll
    for (int u = 0; u < U; ++u) {
      load_at<T, V>(w.row(k + u) * C + c0, dy, x_read, y, relu_mask, vdy[u], vx[u], vy[u], bits[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      backward_vec<T, V, Acc>(vx[u], vdy[u], vy[u], y != nullptr, relu_mask != nullptr, bits[u], need_x, mu, cp, cq, cr,
                              1, out, w.row(k + u) * C + c0);
    }
  }
  for (; k < w.count; ++k) {
    const int64_t off = w.row(k) * C + c0;
    Vec<T, V> vdy, vx{}, vy{};
    unsigned bits = 0;
    load_at<T, V>(off, dy, x_read, y, relu_mask, vdy, vx, vy, bits);
    backward_vec<T, V, Acc>(vx, vdy, vy, y != nullptr, relu_mask != nullptr, bits, need_x, mu, cp, cq, cr, 1, out, off);
  }
}

// kRes: whether res may be set (a residual added before the ReLU); without it res is ignored.
template <typename T, int V, typename Acc, bool kRes>
__global__ void __launch_bounds__(kThreads, kRowsMinBlocks<T>)
    forward_rows_kernel(const device_t<T>* x, const device_t<T>* res, device_t<T>* y, uint8_t* relu_mask,
                        const Acc* mean, const Acc* scale, const Acc* bias, bool relu, int64_t M, int64_t C) {
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c0 >= C) return;
  forward_rows<T, V, Acc, kRes>(x, res, y, relu_mask, mean, scale, bias, relu, C, c0, grid_strided_rows(M, false));
}

// kY: whether y may be set (the fused ReLU's mask read from y); without it y is ignored.
template <typename T, int V, typename Acc, bool kY>
__global__ void __launch_bounds__(kThreads, kRowsMinBlocks<T>)
    backward_rows_kernel(const device_t<T>* x, const device_t<T>* dy, const device_t<T>* y, const uint8_t* relu_mask,
                         GradOutputs<T> out, const Acc* mean, const Acc* p, const Acc* q, const Acc* r, bool training,
                         int64_t M, int64_t C) {
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c0 >= C) return;
  backward_rows<T, V, Acc, kY>(x, dy, y, relu_mask, out, mean, p, q, r, training, C, c0, grid_strided_rows(M, false));
}

// Planes (N, C, S): a grid-stride loop over vectors; a vector never crosses a plane (S % V == 0), so its
// elements share channel c (the coefficients are read with step 0).
template <typename T, int V, typename Acc>
__global__ void __launch_bounds__(kThreads)
    forward_planes_kernel(const device_t<T>* x, const device_t<T>* res, device_t<T>* y, uint8_t* relu_mask,
                          const Acc* mean, const Acc* scale, const Acc* bias, bool relu, int64_t vecs, int64_t C,
                          int64_t S) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i * V;
    const int64_t c = (e / S) % C;
    const Acc mu = mean[c], sc = scale[c], bi = bias ? bias[c] : Acc(0);
    Vec<T, V> vres{};
    const Vec<T, V> vx = load_vec<T, V>(x + e);
    if (res) vres = load_vec<T, V>(res + e);
    unsigned bits = 0;
    store_vec<T, V>(y + e, normalize_vec<T, V, Acc>(vx, vres, res != nullptr, relu, &mu, &sc, &bi, 0, bits));
    store_mask<T, V>(relu_mask, e, bits);
  }
}

template <typename T, int V, typename Acc>
__global__ void __launch_bounds__(kThreads)
    backward_planes_kernel(const device_t<T>* x, const device_t<T>* dy, const device_t<T>* y, const uint8_t* relu_mask,
                           GradOutputs<T> out, const Acc* mean, const Acc* p, const Acc* q, const Acc* r, bool training,
                           int64_t vecs, int64_t C, int64_t S) {
  const bool need_x = training && out.dx;
  const device_t<T>* x_read = need_x ? x : nullptr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i * V;
    const int64_t c = (e / S) % C;
    const Acc mu = need_x ? mean[c] : Acc(0), cp = out.dx ? p[c] : Acc(0), cq = need_x ? q[c] : Acc(0),
              cr = need_x ? r[c] : Acc(0);
    Vec<T, V> vdy, vx{}, vy{};
    unsigned bits = 0;
    load_at<T, V>(e, dy, x_read, y, relu_mask, vdy, vx, vy, bits);
    backward_vec<T, V, Acc>(vx, vdy, vy, y != nullptr, relu_mask != nullptr, bits, need_x, &mu, &cp, &cq, &cr, 0, out,
                            e);
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
  int64_t first() const { return rows ? 1 : S; }              // index step between channels' first values
};

bool is_channels_last_4d(const Tensor& x) {
  return x.dim() == 4 && x.is_contiguous(MemoryFormat::ChannelsLast) && !x.is_contiguous();
}

// x as the kernels read it: channels-last 4-d inputs stay NHWC; everything else is made NCHW-contiguous.
Tensor contiguous_for_kernels(const Tensor& x) { return is_channels_last_4d(x) ? x : internal::contiguous(x); }

Layout layout_of(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t s = c == 0 || n == 0 ? 1 : x.numel() / (n * c);
  if (is_channels_last_4d(x)) return {true, c, n * s, 1};
  if (s == 1) return {true, c, n, 1};
  return {false, c, n, s};
}

// The tensor `t` (same shape) in `like`'s layout.
Tensor in_layout_of(const Tensor& t, const Tensor& like) {
  return is_channels_last_4d(like) ? internal::contiguous(t, MemoryFormat::ChannelsLast) : internal::contiguous(t);
}

DType acc_dtype(DType t) { return t == DType::Float64 ? DType::Float64 : DType::Float32; }

// A (C) tensor in dtype, contiguous (undefined stays undefined).
Tensor per_channel_as(const Tensor& t, DType dtype) { return t.defined() ? internal::contiguous(t.to(dtype)) : t; }

// The blocks of `kernel` (kThreads threads, `smem` bytes of shared memory) one SM runs at once, on this GPU. The
// grids below are sized to whole waves of them: a grid of 1.33 waves (528 blocks where 396 fit) spends half its
// time on its last third.
template <typename Kernel>
int blocks_per_sm(Kernel kernel, int threads, size_t smem) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  return std::max(n, 1);
}

template <typename A>
A* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<A>() : nullptr;
}

// Runs a per-channel reduction of Op over `in` (layout L) and returns the partials (C, splits) as a flat
// tensor of kStateSums * C * splits Acc values, with `splits` set.
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
      static const int per_sm = blocks_per_sm(reduce_planes_kernel<T, V, Acc, Op>, kThreads, 0);
      splits = std::clamp<int64_t>(int64_t{sms} * per_sm / L.C, 1, std::min<int64_t>(max_splits, 65535));
      const int64_t chunk = ceil_div(vecs, splits);
      splits = ceil_div(vecs, chunk);
      partial = internal::empty({L.C * splits * kStateSums}, TensorOptions{.dtype = adt, .device = like.device()});
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
      const size_t smem = sizeof(State<Acc>) * static_cast<size_t>(kThreads) * V;
      // Without y (the fused ReLU's mask is bits or absent) the kernel holds no y vectors: fewer registers, more
      // blocks per SM.
      auto kernel = in.y ? reduce_rows_kernel<T, V, Acc, Op, true> : reduce_rows_kernel<T, V, Acc, Op, false>;
      static const int per_sm_y = blocks_per_sm(reduce_rows_kernel<T, V, Acc, Op, true>, kThreads, smem);
      static const int per_sm_no_y = blocks_per_sm(reduce_rows_kernel<T, V, Acc, Op, false>, kThreads, smem);
      const int per_sm = in.y ? per_sm_y : per_sm_no_y;
      splits = std::clamp<int64_t>(int64_t{sms} * per_sm / grid_x, 1, std::min<int64_t>(max_splits, 65535));
      partial = internal::empty({L.C * splits * kStateSums}, TensorOptions{.dtype = adt, .device = like.device()});
      kernel<<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(splits)), dim3(bx, by), smem, stream>>>(
          in, op, reinterpret_cast<State<Acc>*>(partial.data_ptr()), L.outer, L.C);
    }
    KILN_CUDA_CHECK_LAUNCH(name);
  };
  constexpr int kWide = kVecWidth<T>;
  if (v == kWide) run(std::integral_constant<int, kWide>{});
  else run(std::integral_constant<int, 1>{});
  return partial;
}

// The 2-d grid of the rows kernels: x over channel vectors (bx threads), y over rows (by threads), one wave of
// the blocks (per_sm of them on each SM) looping over the rows.
struct RowsGrid {
  dim3 grid, block;
};
RowsGrid rows_grid(int64_t M, int64_t C, int V, int per_sm) {
  const int64_t cvecs = C / V;
  int bx = 1;
  while (bx < 32 && bx < cvecs) bx *= 2;
  const int by = kThreads / bx;
  const int64_t grid_x = ceil_div(cvecs, bx);
  const int64_t want_y = std::max<int64_t>(1, int64_t{cuda::kdetail::sm_count()} * per_sm / grid_x);
  const int64_t grid_y = std::clamp<int64_t>(ceil_div(M, by), 1, std::min<int64_t>(want_y, 65535));
  return {dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)), dim3(bx, by)};
}

template <typename T>
void launch_forward(const Tensor& x, const Tensor& y, const Layout& L, const Tensor& weight, const Tensor& bias,
                    const Tensor& running_mean, const Tensor& running_var, bool training, double momentum, double eps,
                    bool relu, const Tensor& res, int64_t* batches, Tensor& mean, Tensor& invstd, Tensor& relu_mask,
                    cudaStream_t stream) {
  using Acc = acc_t<T>;
  using D = device_t<T>;
  const DType adt = acc_dtype(x.dtype());
  const TensorOptions opts{.dtype = adt, .device = x.device()};
  const auto* xp = static_cast<const D*>(x.data_ptr());
  const Tensor w = per_channel_as(weight, adt), b = per_channel_as(bias, adt);
  Tensor scale;  // (C): y = (x - mean) scale + bias
  if (training) {
    int64_t splits = 1;
    trace::Scope stats_range(trace::Kind::Op, "batch_norm_forward.statistics", x.device());
    const Tensor partial = reduce_channels<T, Acc>(x, L, Inputs<T>{xp, nullptr, nullptr}, StatsOp<Acc>{}, splits,
                                                   stream, "batch_norm (statistics)");
    mean = internal::empty({L.C}, opts);
    invstd = internal::empty({L.C}, opts);
    scale = internal::empty({L.C}, opts);
    const unsigned blocks = static_cast<unsigned>(ceil_div(L.C * 32, kThreads));  // a warp per channel
    const auto* part = reinterpret_cast<const State<Acc>*>(partial.data_ptr());
    auto finalize = [&](auto* rm, auto* rv, Acc mom) {
      using R = std::remove_pointer_t<decltype(rm)>;
      finalize_stats_kernel<T, Acc, R><<<blocks, kThreads, 0, stream>>>(
          part, splits, L.C, static_cast<Acc>(L.count()), xp, L.first(), static_cast<Acc>(eps), ptr_or_null<Acc>(w),
          mean.data_ptr<Acc>(), invstd.data_ptr<Acc>(), scale.data_ptr<Acc>(), rm, rv, mom, batches);
    };
    if (running_mean.defined()) {
      visit_floating_dtype(running_mean.dtype(), "batch_norm", [&](auto tag) {
        using R = typename decltype(tag)::type;
        finalize(running_mean.data_ptr<R>(), running_var.data_ptr<R>(), static_cast<Acc>(momentum));
      });
    } else {
      finalize(static_cast<Acc*>(nullptr), static_cast<Acc*>(nullptr), Acc(0));
    }
    KILN_CUDA_CHECK_LAUNCH("batch_norm (finalize statistics)");
  } else {
    mean = per_channel_as(running_mean, adt);
    invstd = internal::contiguous(internal::rsqrt(internal::add(running_var.to(adt), eps)));
    scale = internal::contiguous(w.defined() ? internal::mul(invstd, w) : invstd);
  }
  auto* yp = static_cast<D*>(y.data_ptr());
  const D* rp = res.defined() ? static_cast<const D*>(res.data_ptr()) : nullptr;
  const int v = vector_width<T>({xp, yp, rp}, L.rows ? L.C : L.S);
  auto apply = [&](auto width) {
    constexpr int V = decltype(width)::value;
    trace::Scope apply_range(trace::Kind::Op, "batch_norm_forward.normalize", x.device());
    // The ReLU's mask as bits, a vector's V bits to a byte (at the full width V = kVecWidth<T>): backward reads it in
    // place of y.
    uint8_t* mp = nullptr;
    if (relu && V == kVecWidth<T> && V > 1) {
      relu_mask = internal::empty({x.numel() / V}, TensorOptions{.dtype = DType::UInt8, .device = x.device()});
      mp = relu_mask.data_ptr<uint8_t>();
    }
    if (L.rows) {
      static const int per_sm_res = blocks_per_sm(forward_rows_kernel<T, V, Acc, true>, kThreads, 0);
      static const int per_sm_no_res = blocks_per_sm(forward_rows_kernel<T, V, Acc, false>, kThreads, 0);
      const RowsGrid g = rows_grid(L.outer, L.C, V, rp ? per_sm_res : per_sm_no_res);
      (rp ? forward_rows_kernel<T, V, Acc, true>
          : forward_rows_kernel<T, V, Acc, false>)<<<g.grid, g.block, 0, stream>>>(
          xp, rp, yp, mp, mean.data_ptr<Acc>(), scale.data_ptr<Acc>(), ptr_or_null<Acc>(b), relu, L.outer, L.C);
    } else {
      const int64_t vecs = x.numel() / V;
      forward_planes_kernel<T, V, Acc><<<grid_for(vecs, kThreads), kThreads, 0, stream>>>(
          xp, rp, yp, mp, mean.data_ptr<Acc>(), scale.data_ptr<Acc>(), ptr_or_null<Acc>(b), relu, vecs, L.C, L.S);
    }
    KILN_CUDA_CHECK_LAUNCH("batch_norm (normalize)");
  };
  constexpr int kWide = kVecWidth<T>;
  if (v == kWide) apply(std::integral_constant<int, kWide>{});
  else apply(std::integral_constant<int, 1>{});
}

template <typename T>
BatchNormGrads launch_backward(const Tensor& dy, const Tensor& x, const Tensor& y, const Tensor& relu_mask,
                               const Layout& L, const Tensor& weight, const Tensor& mean, const Tensor& invstd,
                               bool training, BatchNormNeeds needs, cudaStream_t stream) {
  using Acc = acc_t<T>;
  using D = device_t<T>;
  const DType adt = acc_dtype(x.dtype());
  const Tensor w = per_channel_as(weight, adt);
  const auto* xp = static_cast<const D*>(x.data_ptr());
  const auto* dyp = static_cast<const D*>(dy.data_ptr());
  const D* yp = y.defined() ? static_cast<const D*>(y.data_ptr()) : nullptr;
  const uint8_t* mp = relu_mask.defined() ? relu_mask.data_ptr<uint8_t>() : nullptr;
  BatchNormGrads out;
  const TensorOptions opts = TensorOptions{.dtype = adt, .device = x.device()};
  Tensor p, q, r;  // (C): dx = dy' p + (x - mean) q + r
  // The sums are needed for grad weight, grad bias, and dx in training; d_residual = dy' needs none.
  if ((training && needs.input) || needs.weight || needs.bias) {
    int64_t splits = 1;
    const GradSumOp<Acc> op{mean.data_ptr<Acc>()};
    trace::Scope sums_range(trace::Kind::Op, "batch_norm_backward.sums", x.device());
    const Tensor partial =
        reduce_channels<T, Acc>(x, L, Inputs<T>{xp, dyp, yp, mp}, op, splits, stream, "batch_norm backward (sums)");
    if (needs.weight) out.weight = internal::empty({L.C}, opts);
    if (needs.bias) out.bias = internal::empty({L.C}, opts);
    if (needs.input) {
      p = internal::empty({L.C}, opts);
      q = internal::empty({L.C}, opts);
      r = internal::empty({L.C}, opts);
    }
    finalize_grads_kernel<Acc><<<static_cast<unsigned>(ceil_div(L.C * 32, kThreads)), kThreads, 0, stream>>>(
        reinterpret_cast<const State<Acc>*>(partial.data_ptr()), splits, L.C, Acc(1) / static_cast<Acc>(L.count()),
        mean.data_ptr<Acc>(), invstd.data_ptr<Acc>(), ptr_or_null<Acc>(w), training, ptr_or_null<Acc>(out.weight),
        ptr_or_null<Acc>(out.bias), ptr_or_null<Acc>(p), ptr_or_null<Acc>(q), ptr_or_null<Acc>(r));
    KILN_CUDA_CHECK_LAUNCH("batch_norm backward (finalize)");
  } else if (needs.input) {
    p = internal::contiguous(w.defined() ? internal::mul(invstd, w) : invstd);  // eval: dx = dy invstd w
  }
  if (!needs.input && !needs.residual) return out;
  if (needs.input) out.input = internal::empty_like(x);        // x's layout
  if (needs.residual) out.residual = internal::empty_like(x);  // x's layout and dtype
  const GradOutputs<T> dst{needs.input ? static_cast<D*>(out.input.data_ptr()) : nullptr,
                           needs.residual ? static_cast<D*>(out.residual.data_ptr()) : nullptr};
  const int v = vector_width<T>({xp, dyp, yp, dst.dx, dst.dres}, L.rows ? L.C : L.S);
  auto apply = [&](auto width) {
    constexpr int V = decltype(width)::value;
    trace::Scope apply_range(trace::Kind::Op, "batch_norm_backward.input", x.device());
    if (L.rows) {
      static const int per_sm_y = blocks_per_sm(backward_rows_kernel<T, V, Acc, true>, kThreads, 0);
      static const int per_sm_no_y = blocks_per_sm(backward_rows_kernel<T, V, Acc, false>, kThreads, 0);
      const RowsGrid g = rows_grid(L.outer, L.C, V, yp ? per_sm_y : per_sm_no_y);
      (yp ? backward_rows_kernel<T, V, Acc, true>
          : backward_rows_kernel<T, V, Acc, false>)<<<g.grid, g.block, 0, stream>>>(
          xp, dyp, yp, mp, dst, mean.data_ptr<Acc>(), ptr_or_null<Acc>(p), ptr_or_null<Acc>(q), ptr_or_null<Acc>(r),
          training, L.outer, L.C);
    } else {
      const int64_t vecs = x.numel() / V;
      backward_planes_kernel<T, V, Acc><<<grid_for(vecs, kThreads), kThreads, 0, stream>>>(
          xp, dyp, yp, mp, dst, mean.data_ptr<Acc>(), ptr_or_null<Acc>(p), ptr_or_null<Acc>(q), ptr_or_null<Acc>(r),
          training, vecs, L.C, L.S);
    }
    KILN_CUDA_CHECK_LAUNCH("batch_norm backward (input)");
  };
  constexpr int kWide = kVecWidth<T>;
  if (v == kWide) apply(std::integral_constant<int, kWide>{});
  else apply(std::integral_constant<int, 1>{});
  return out;
}

}  // namespace

BatchNormForward batch_norm_forward(const Tensor& x0, const Tensor& weight, const Tensor& bias,
                                    const Tensor& running_mean, const Tensor& running_var, bool training,
                                    double momentum, double eps, bool relu, const Tensor& residual,
                                    const Tensor& num_batches_tracked) {
  trace::Scope range(trace::Kind::Op, "batch_norm_forward", x0.device(), {&x0, &weight});
  if (num_batches_tracked.defined()) {
    KILN_CHECK(num_batches_tracked.numel() == 1 && num_batches_tracked.dtype() == DType::Int64 &&
                   num_batches_tracked.device() == x0.device(),
               "batch_norm: num_batches_tracked must be a 1-element Int64 tensor on the input's device (", x0.device(),
               "), got ", num_batches_tracked.shape(), " ", num_batches_tracked.dtype(), " on ",
               num_batches_tracked.device());
  }
  int64_t* batches = training && num_batches_tracked.defined() ? num_batches_tracked.data_ptr<int64_t>() : nullptr;
  const Tensor x = contiguous_for_kernels(x0);
  const Layout L = layout_of(x);
  if (residual.defined()) {
    KILN_CHECK(residual.shape() == x.shape() && residual.dtype() == x.dtype() && residual.device() == x.device(),
               "batch_norm_add_relu: the residual must have the input's shape, dtype and device, got ",
               residual.shape(), " ", residual.dtype(), " on ", residual.device(), " for an input ", x.shape(), " ",
               x.dtype(), " on ", x.device());
  }
  const Tensor res = residual.defined() ? in_layout_of(residual, x) : residual;  // x's layout
  if (running_mean.defined()) {
    KILN_CHECK(
        running_mean.is_contiguous() && running_var.is_contiguous() && running_mean.dtype() == running_var.dtype(),
        "batch_norm: running_mean and running_var must be contiguous and of one dtype, got ", running_mean.dtype(),
        " and ", running_var.dtype());
  }
  BatchNormForward out;
  out.y = internal::empty_like(x);  // x's layout (NCHW or NHWC, both dense)
  cudaStream_t stream = cuda::stream_for(x);
  visit_floating_dtype(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_forward<T>(x, out.y, L, weight, bias, running_mean, running_var, training, momentum, eps, relu, res, batches,
                      out.mean, out.invstd, out.relu_mask, stream);
  });
  return out;
}

BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x0, const Tensor& y0, const Tensor& relu_mask,
                                   const Tensor& weight, const Tensor& mean, const Tensor& invstd, bool training,
                                   BatchNormNeeds needs) {
  trace::Scope range(trace::Kind::Op, "batch_norm_backward", x0.device(), {&grad_out, &x0});
  const Tensor x = contiguous_for_kernels(x0);
  const Layout L = layout_of(x);
  const Tensor dy = in_layout_of(grad_out.to(x.dtype()), x);
  const Tensor y = y0.defined() ? in_layout_of(y0, x) : y0;
  cudaStream_t stream = cuda::stream_for(x);
  return visit_floating_dtype(x.dtype(), "batch_norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_backward<T>(dy, x, y, relu_mask, L, weight, mean, invstd, training, needs, stream);
  });
}

}  // namespace kiln::nn::cuda_impl
