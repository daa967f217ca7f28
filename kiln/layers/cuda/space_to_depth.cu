// kiln/layers/cuda/space_to_depth.cu — an image batch's 2 x 2 blocks as channels (space_to_depth.h).
#include "kiln/layers/cuda/space_to_depth.h"

#include <cuda_runtime.h>

#include <cstring>
#include <type_traits>  // std::integral_constant

#include "kiln/layers/cuda/layer_kernels.cuh"  // grid_for
#include "kiln/tensor/cuda/cuda_backend.h"     // cuda::stream_for
#include "kiln/tensor/cuda/cuda_check.h"       // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/error.h"                 // KILN_CHECK
#include "kiln/tensor/internal_ops.h"          // internal::empty
#include "kiln/tensor/trace.h"                 // a range per kernel entry

namespace kiln::nn::cuda_impl {

namespace {

constexpr int kThreads = 256;
constexpr int kMax = static_cast<int>(kSpaceToDepthMaxChannels);

struct Geometry {
  int64_t blocks;  // N Hb Wb: one thread each
  int64_t h, w;    // the input's height and width
  int64_t hb, wb;  // the blocks' rows and columns
  int64_t pad_h, pad_w;
  int channels;  // a block's channels (the output's)
};

// U: the elements' bits (uint16_t, uint32_t or uint64_t); C: the input's channels (1 to 4), so that every index into a
// block's registers is known at compile time. x dense NHWC, out dense (N, Hb, Wb, channels).
template <typename U, int C>
__global__ void __launch_bounds__(kThreads)
    space_to_depth_kernel(const U* __restrict__ x, U* __restrict__ out, Geometry g) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < g.blocks;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = idx % g.wb, t = idx / g.wb, i = t % g.hb, n = t / g.hb;
    U v[kMax];
#pragma unroll
    for (int k = 0; k < kMax; ++k) v[k] = 0;
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      const int64_t h = 2 * i + a - g.pad_h;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int64_t w = 2 * j + b - g.pad_w;
        if (h < 0 || h >= g.h || w < 0 || w >= g.w) continue;
        const U* p = x + ((n * g.h + h) * g.w + w) * C;
#pragma unroll
        for (int c = 0; c < C; ++c) v[(2 * a + b) * C + c] = p[c];
      }
    }
    U* o = out + idx * g.channels;
    if (static_cast<size_t>(g.channels) * sizeof(U) % 16 == 0) {  // whole 16-byte vectors (o is 16-byte aligned)
      constexpr int kPer = 16 / static_cast<int>(sizeof(U));
#pragma unroll
      for (int k = 0; k < kMax; k += kPer) {
        if (k < g.channels) {
          uint4 q;
          memcpy(&q, &v[k], 16);
          reinterpret_cast<uint4*>(o)[k / kPer] = q;
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < kMax; ++k) {
        if (k < g.channels) o[k] = v[k];
      }
    }
  }
}

}  // namespace

bool space_to_depth_fits(const Tensor& x, int64_t channels) {
  return x.defined() && x.is_cuda() && x.dim() == 4 && x.is_contiguous(MemoryFormat::ChannelsLast) &&
         (x.element_size() == 2 || x.element_size() == 4 || x.element_size() == 8) && x.size(1) >= 1 &&
         4 * x.size(1) <= channels && channels <= kSpaceToDepthMaxChannels;
}

Tensor space_to_depth(const Tensor& x, std::array<int64_t, 2> padding, int64_t channels) {
  KILN_CHECK(space_to_depth_fits(x, channels) && padding[0] >= 0 && padding[1] >= 0,
             "space_to_depth: takes a 4-d channels-last CUDA tensor of a 2-, 4- or 8-byte dtype with at most ",
             channels / 4, " channels and paddings >= 0, got ", x.shape(), " ", x.dtype(), " padding (", padding[0],
             ", ", padding[1], ") for ", channels, " block channels");
  trace::Scope range(trace::Kind::Op, "space_to_depth", x.device(), {&x});
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t hb = (h + 2 * padding[0] + 1) / 2, wb = (w + 2 * padding[1] + 1) / 2;
  Tensor out = internal::empty({n, channels, hb, wb},
                               {.dtype = x.dtype(), .device = x.device(), .memory_format = MemoryFormat::ChannelsLast});
  const Geometry g{n * hb * wb, h, w, hb, wb, padding[0], padding[1], static_cast<int>(channels)};
  if (g.blocks == 0) return out;
  const cudaStream_t stream = cuda::stream_for(x);
  auto launch = [&](auto bits, auto in_channels) {
    using U = decltype(bits);
    space_to_depth_kernel<U, decltype(in_channels)::value><<<grid_for(g.blocks, kThreads), kThreads, 0, stream>>>(
        static_cast<const U*>(x.data_ptr()), static_cast<U*>(out.data_ptr()), g);
  };
  auto for_channels = [&](auto bits) {
    switch (c) {
      case 1: launch(bits, std::integral_constant<int, 1>{}); break;
      case 2: launch(bits, std::integral_constant<int, 2>{}); break;
      case 3: launch(bits, std::integral_constant<int, 3>{}); break;
      default: launch(bits, std::integral_constant<int, 4>{}); break;
    }
  };
  switch (x.element_size()) {
    case 2: for_channels(uint16_t{}); break;
    case 4: for_channels(uint32_t{}); break;
    default: for_channels(uint64_t{}); break;
  }
  KILN_CUDA_CHECK_LAUNCH("space_to_depth");
  return out;
}

}  // namespace kiln::nn::cuda_impl
