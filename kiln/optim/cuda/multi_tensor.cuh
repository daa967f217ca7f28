// kiln/optim/cuda/multi_tensor.cuh — the chunked multi-tensor launcher behind fused.h (internal).
//
//   struct Scale {  // a functor: what one block does to one chunk of one tensor
//     float f;
//     template <int D> __device__ void operator()(const mt::Meta<D>& m, int slot, int64_t chunk) const {
//       auto* p = static_cast<float*>(m.ptr[0][slot]);
//       mt::for_each_group(mt::chunk_len(m, slot, chunk), mt::all_aligned(m, slot),
//                          [&](int64_t i, auto w) { ... p[chunk * mt::kChunk + i] ... });
//     }
//   };
//   mt::apply<1>({&tensors}, nullptr, stream, Scale{2.f}, "fused_scale");
//
// Every tensor of kDepth index-aligned lists is cut into chunks of kChunk elements; a launch covers up to
// kMaxBlocks (tensor, chunk) pairs of up to kMaxTensors tensors, one block of kBlock threads per pair. The
// per-tensor pointers and sizes travel in the kernel's parameters (Meta, under 4 KB: the limit of every CUDA
// toolkit and architecture, so no device buffer, no cudaMalloc and no host synchronisation is needed); when
// it is full, another launch follows on the same stream. A tensor may straddle two launches (its remaining
// chunks go to the next one).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "kiln/optim/cuda/checks.h"
#include "kiln/optim/cuda/fused.h"
#include "kiln/tensor/cuda/cuda_backend.h"    // stream_for
#include "kiln/tensor/cuda/cuda_check.h"      // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/cuda/device_types.cuh"  // device_t, to_compute, from_compute
#include "kiln/tensor/error.h"

namespace kiln::optim::cuda_impl::mt {

inline constexpr int64_t kChunk = 65536;    // elements of a tensor one block takes
inline constexpr int kBlock = 512;          // threads per block
inline constexpr int kVec = 4;              // elements per vectorised access (16 bytes of float32)
inline constexpr int kMaxBlocks = 320;      // (tensor, chunk) pairs per launch
inline constexpr size_t kMetaBytes = 3800;  // leaves room for the functor under the 4 KB parameter limit

// Per-slot bytes: kDepth pointers + numel + step pointer + tensor index + chunk base.
template <int kDepth>
inline constexpr int kMaxTensors = [] {
  const size_t per_tensor = 8 * kDepth + 8 + 8 + 4 + 4;
  const size_t n = (kMetaBytes - kMaxBlocks * 5 - 16) / per_tensor;
  return static_cast<int>(n > 255 ? 255 : n);  // slots are uint8_t
}();

// The kernel's metadata (a kernel parameter): slots of tensors, and the (slot, chunk) of each block.
template <int kDepth>
struct Meta {
  static constexpr int kSlots = kMaxTensors<kDepth>;
  void* ptr[kDepth][kSlots];  // list d, slot s: first element
  int64_t numel[kSlots];
  float* step[kSlots];         // the tensor's 1-element step counter, or nullptr
  int32_t tensor[kSlots];      // index of the slot's tensor in the caller's lists
  int32_t chunk_base[kSlots];  // global index (over all lists' tensors) of the tensor's first chunk
  int32_t block_chunk[kMaxBlocks];
  uint8_t block_slot[kMaxBlocks];
};

// ---- device helpers ----

template <int kDepth>
__device__ __forceinline__ int64_t chunk_len(const Meta<kDepth>& m, int slot, int64_t chunk) {
  const int64_t left = m.numel[slot] - chunk * kChunk;
  return left < kChunk ? left : kChunk;
}

// Whether every list's chunk starts 16-byte aligned (chunks start at multiples of kChunk elements, so this is
// the alignment of the tensors' first elements): then kVec elements move in one access.
template <int kDepth>
__device__ __forceinline__ bool all_aligned(const Meta<kDepth>& m, int slot) {
  bool ok = true;
#pragma unroll
  for (int d = 0; d < kDepth; ++d) ok = ok && (reinterpret_cast<uintptr_t>(m.ptr[d][slot]) % 16 == 0);
  return ok;
}

// Calls fn(i, std::integral_constant<int, W>{}) for element groups [i, i + W) of a chunk of len elements:
// W = kVec for whole groups when aligned, then W = 1 for the tail (or everything when not aligned).
template <typename Fn>
__device__ __forceinline__ void for_each_group(int64_t len, bool aligned, Fn fn) {
  int64_t done = 0;
  if (aligned) {
    const int64_t groups = len / kVec;
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) fn(g * kVec, std::integral_constant<int, kVec>{});
    done = groups * kVec;
  }
  for (int64_t i = done + threadIdx.x; i < len; i += blockDim.x) fn(i, std::integral_constant<int, 1>{});
}

// W consecutive elements of kiln type T (float, Half, BFloat16) at p, in float (W == kVec: one access).
template <typename T>
struct alignas(sizeof(cuda::device_t<T>) * kVec) Pack {
  cuda::device_t<T> v[kVec];
};
template <int W, typename T>
__device__ __forceinline__ void load(const T* p, float (&r)[kVec]) {
  if constexpr (W == kVec) {
    const Pack<T> pk = *reinterpret_cast<const Pack<T>*>(p);
#pragma unroll
    for (int k = 0; k < kVec; ++k) r[k] = cuda::to_compute<T>(pk.v[k]);
  } else {
    r[0] = cuda::to_compute<T>(*reinterpret_cast<const cuda::device_t<T>*>(p));
  }
}
// Stores W elements rounded once to T.
template <int W, typename T>
__device__ __forceinline__ void store(T* p, const float (&r)[kVec]) {
  if constexpr (W == kVec) {
    Pack<T> pk;
#pragma unroll
    for (int k = 0; k < kVec; ++k) pk.v[k] = cuda::from_compute<T>(r[k]);
    *reinterpret_cast<Pack<T>*>(p) = pk;
  } else {
    *reinterpret_cast<cuda::device_t<T>*>(p) = cuda::from_compute<T>(r[0]);
  }
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), the same in every thread. The
// order of the additions depends only on blockDim.x: deterministic.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  __shared__ float total;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = static_cast<int>(blockDim.x / 32);
    float w = lane < warps ? warp_sums[lane] : 0.f;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) w += __shfl_down_sync(0xffffffffu, w, d);
    if (lane == 0) total = w;
  }
  __syncthreads();
  const float result = total;
  __syncthreads();  // the next call may overwrite warp_sums/total
  return result;
}

// found_inf (fused.h): nullptr when the caller passed an undefined tensor.
__device__ __forceinline__ bool skip_step(const float* found_inf) { return found_inf != nullptr && *found_inf != 0.f; }

// What an update reads besides its lists (fused.h), each nullptr where the caller has none: AMP's gradient scale
// and inf flag, and the learning rate the replays of a CUDA graph write.
struct Hooks {
  const float* grad_scale;
  const float* found_inf;
  const double* lr_device;

  __device__ __forceinline__ bool skip_step() const { return mt::skip_step(found_inf); }
  // The divisor of the gradients (PyTorch divides rather than multiplying by the inverse; x / 1 is exact).
  __device__ __forceinline__ float grad_divisor() const { return grad_scale != nullptr ? *grad_scale : 1.f; }
  // The learning rate: lr_device's where set, else the host's value.
  __device__ __forceinline__ double lr(double host_lr) const { return lr_device != nullptr ? *lr_device : host_lr; }
};

// List d's elements in a block's chunk, as T.
template <typename T, int D>
__device__ __forceinline__ T* chunk_ptr(const Meta<D>& m, int d, int slot, int64_t chunk) {
  return static_cast<T*>(m.ptr[d][slot]) + chunk * kChunk;
}

// ---- 16-bit shadows (fused.h) ----
// A functor templated on S (Half or BFloat16; void: no shadows) finds the shadows in its last list, D - 1: per
// slot the 16-bit copy of the parameter to write, or nullptr.
template <typename S, int D>
__device__ __forceinline__ S* shadow_ptr(const Meta<D>& m, int slot, int64_t chunk) {
  if constexpr (std::is_void_v<S>) {
    return nullptr;
  } else {
    void* base = m.ptr[D - 1][slot];
    return base == nullptr ? nullptr : static_cast<S*>(base) + chunk * kChunk;
  }
}
// Writes W values (the updated parameter, in float32) into the shadow, rounded once to S.
template <int W, typename S>
__device__ __forceinline__ void store_shadow(S* sh, int64_t i, const float (&r)[kVec]) {
  if constexpr (!std::is_void_v<S>) {
    if (sh != nullptr) store<W>(sh + i, r);
  }
}
// A skipped step (found_inf) leaves the parameter as it is, and its shadow becomes its cast: a shadow made for
// this step holds nothing yet.
template <typename P, typename S, int D>
__device__ __forceinline__ void refresh_shadow(const Meta<D>& m, int slot, int64_t chunk) {
  if constexpr (!std::is_void_v<S>) {
    S* sh = shadow_ptr<S>(m, slot, chunk);
    if (sh == nullptr) return;
    const P* p = static_cast<const P*>(m.ptr[0][slot]) + chunk * kChunk;
    for_each_group(chunk_len(m, slot, chunk), all_aligned(m, slot), [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float r[kVec];
      load<W>(p + i, r);
      store<W>(sh + i, r);
    });
  }
}

template <int kDepth, typename F>
__global__ void __launch_bounds__(kBlock) multi_tensor_kernel(Meta<kDepth> meta, F f) {
  f(meta, static_cast<int>(meta.block_slot[blockIdx.x]), static_cast<int64_t>(meta.block_chunk[blockIdx.x]));
}

// ---- host side ----

inline int64_t num_chunks(int64_t numel) { return (numel + kChunk - 1) / kChunk; }

// Launches f over every (tensor, chunk) of the index-aligned lists (all of lists[0]'s length) on stream.
// steps: nullptr, or one 1-element float32 tensor per tensor (Meta::step). chunk_base0: the global chunk
// index of lists[0][0]'s first chunk (for callers that launch several dtype groups into one partials buffer).
// Returns the number of chunks covered. Tensors without elements get no block.
template <int kDepth, typename F>
int64_t apply(const std::array<const TensorVec*, kDepth>& lists, const TensorVec* steps, cudaStream_t stream,
              const F& f, const char* op, int64_t chunk_base0 = 0) {
  static_assert(sizeof(Meta<kDepth>) <= kMetaBytes, "multi-tensor metadata over its budget");
  static_assert(sizeof(Meta<kDepth>) + sizeof(F) <= 4000, "kernel parameters over the 4 KB limit");
  constexpr int kSlots = Meta<kDepth>::kSlots;
  const TensorVec& first = *lists[0];
  Meta<kDepth> meta{};
  int slots = 0, blocks = 0;
  int64_t chunk_base = chunk_base0;
  auto launch = [&] {
    multi_tensor_kernel<kDepth, F><<<blocks, kBlock, 0, stream>>>(meta, f);
    KILN_CUDA_CHECK_LAUNCH(op);
    blocks = 0;
  };
  for (size_t t = 0; t < first.size(); ++t) {
    const int64_t n = first[t].numel();
    const int64_t chunks = num_chunks(n);
    if (chunks == 0) continue;
    KILN_CHECK(chunk_base + chunks < (int64_t{1} << 31), op, ": too many elements for one call");
    for (int d = 0; d < kDepth; ++d) {
      const Tensor& x = (*lists[d])[t];
      meta.ptr[d][slots] = x.defined() ? x.data_ptr() : nullptr;  // an undefined entry: a shadow not kept
    }
    meta.numel[slots] = n;
    meta.step[slots] = steps != nullptr ? (*steps)[t].data_ptr<float>() : nullptr;
    meta.tensor[slots] = static_cast<int32_t>(t);
    meta.chunk_base[slots] = static_cast<int32_t>(chunk_base);
    ++slots;
    for (int64_t c = 0; c < chunks; ++c) {
      meta.block_slot[blocks] = static_cast<uint8_t>(slots - 1);
      meta.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if (blocks == kMaxBlocks || (slots == kSlots && last_chunk)) {
        launch();
        if (last_chunk) {
          slots = 0;
        } else {  // the tensor continues in the next launch, as its slot 0
          for (int d = 0; d < kDepth; ++d) meta.ptr[d][0] = meta.ptr[d][slots - 1];
          meta.numel[0] = meta.numel[slots - 1];
          meta.step[0] = meta.step[slots - 1];
          meta.tensor[0] = meta.tensor[slots - 1];
          meta.chunk_base[0] = meta.chunk_base[slots - 1];
          slots = 1;
        }
      }
    }
    chunk_base += chunks;
  }
  if (blocks > 0) launch();
  return chunk_base - chunk_base0;
}

// apply over `lists`, followed by the shadows' list where S is a shadow type (shadow_ptr finds it last).
template <typename S, size_t N, typename F>
void apply_with_shadows(const TensorVec* const (&lists)[N], const TensorVec& shadows, const TensorVec* steps,
                        cudaStream_t stream, const F& f, const char* op) {
  constexpr int kDepth = static_cast<int>(N) + (std::is_void_v<S> ? 0 : 1);
  std::array<const TensorVec*, kDepth> all{};
  for (size_t d = 0; d < N; ++d) all[d] = lists[d];
  if constexpr (!std::is_void_v<S>) all[N] = &shadows;
  apply<kDepth>(all, steps, stream, f, op);
}

inline const float* scalar_ptr(const Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
inline Hooks hooks(const Tensor& grad_scale, const Tensor& found_inf, const double* lr_device) {
  return {scalar_ptr(grad_scale), scalar_ptr(found_inf), lr_device};
}

// Calls fn(T{}) with T the kiln type of dtype (float, Half, BFloat16).
template <typename Fn>
void dispatch_fused(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::Float32: fn(float{}); break;
    case DType::Float16: fn(Half{}); break;
    case DType::BFloat16: fn(BFloat16{}); break;
    default: KILN_FAIL(op, ": dtype ", dtype, " is not supported (float32, float16 or bfloat16)");
  }
}

// Calls fn(ShadowType<S>{}) with S the kiln type of the shadows' dtype (float16: Half, bfloat16: BFloat16), or
// S = void where there are no shadows. Only float32 parameters have shadows (check_shadows): for other P only
// S = void is instantiated.
template <typename S>
struct ShadowType {
  using type = S;
};
template <typename P, typename Fn>
void dispatch_shadows(const std::optional<DType>& shadow_dtype, Fn&& fn) {
  if (!shadow_dtype) {
    fn(ShadowType<void>{});
  } else if constexpr (std::is_same_v<P, float>) {
    if (*shadow_dtype == DType::Float16) fn(ShadowType<Half>{});
    else fn(ShadowType<BFloat16>{});
  }
}

// Calls fn(dtype, group) for each dtype of list (in the order of first appearance), group holding that
// dtype's tensors in list order: lists of mixed dtypes launch once per dtype.
template <typename Fn>
void for_each_dtype_group(const TensorVec& list, Fn&& fn) {
  std::vector<DType> order;
  for (const Tensor& t : list) {
    bool seen = false;
    for (DType d : order) seen = seen || d == t.dtype();
    if (!seen) order.push_back(t.dtype());
  }
  for (DType d : order) {
    if (order.size() == 1) {
      fn(d, list);
      return;
    }
    TensorVec group;
    for (const Tensor& t : list)
      if (t.dtype() == d) group.push_back(t);
    fn(d, group);
  }
}

// steps[i] += 1 for every i, unless *found_inf != 0: launched after an update that read the counters, so
// that every chunk of a tensor saw the same count.
struct IncrementSteps {
  const float* found_inf;
  template <int D>
  __device__ void operator()(const Meta<D>& m, int slot, int64_t /*chunk*/) const {
    if (threadIdx.x == 0 && !skip_step(found_inf)) *static_cast<float*>(m.ptr[0][slot]) += 1.f;
  }
};
inline void increment_steps(const TensorVec& steps, const Tensor& found_inf, cudaStream_t stream, const char* op) {
  apply<1>({&steps}, nullptr, stream, IncrementSteps{scalar_ptr(found_inf)}, op);
}

}  // namespace kiln::optim::cuda_impl::mt
