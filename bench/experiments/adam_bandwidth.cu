// Experiment: how close kiln's fused AdamW (kiln/optim/cuda/adam.cu) comes to the memory bandwidth on BERT-large's
// parameters, and what the distance is made of. The update of a float32 parameter with a bfloat16 shadow reads
// p, g, m, v (16 bytes) and writes p, m, v and the shadow (14 bytes) per element: 30 bytes, 10 GB a step for the
// 335 M parameters, about 9% of bench_train's bert_large_128 step on an H100 (3.8 ms of 42).
//
// Each variant does the same update with the same constants, on the same element count:
//   kiln      cuda_impl::fused_adam on the model's 390 parameter tensors (chunks of 64 Ki elements, one block of 512
//             threads each, up to 320 blocks a launch: 17 launches), then its launch that increments the steps
//   chunked   the same blocks over one flat buffer in a single launch (a block per 64 Ki-element chunk): what kiln's
//             layout costs without the launches' tails
//   flat<I,T> one flat buffer, a grid of (SMs x resident blocks) blocks of T threads striding over it, each thread
//             holding I groups of 4 elements at a time (all loads of the I groups issued before any store)
//   copy      cudaMemcpyAsync of a buffer of the same 30 bytes per element / 2 read and written once: the bandwidth
//             of a plain copy, for scale
// Times: median of 20 runs after 5 (bench::median_step_ms), in ms, with the rate in TB/s of 30 bytes an element.
//
//   nvcc -std=c++20 -O2 -arch=sm_90 --expt-relaxed-constexpr -I . -I build/include -I bench \
//       bench/experiments/adam_bandwidth.cu -L build/kiln -lkiln -Xlinker -rpath -Xlinker '$ORIGIN' -o adam_bandwidth
//
// Not part of the build: a measurement, run where the layout of the optimizer's update is to be chosen.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "gpu_timing.h"  // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/optim/cuda/fused.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

namespace {

struct Hyper {
  float step_size, bc2_sqrt, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, lr_wd;
};

__device__ __forceinline__ void update(float& p, float g, float& m, float& v, const Hyper& h) {
  p -= h.lr_wd * p;
  m = h.beta1 * m + h.one_minus_beta1 * g;
  v = h.beta2 * v + h.one_minus_beta2 * g * g;
  p -= h.step_size * m / (sqrtf(v) / h.bc2_sqrt + h.eps);
}

__device__ __forceinline__ void update4(float4& p, const float4& g, float4& m, float4& v, const Hyper& h) {
  update(p.x, g.x, m.x, v.x, h);
  update(p.y, g.y, m.y, v.y, h);
  update(p.z, g.z, m.z, v.z, h);
  update(p.w, g.w, m.w, v.w, h);
}

__device__ __forceinline__ void store_shadow(__nv_bfloat16* s, int64_t i4, const float4& p) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&lo);
  u.y = *reinterpret_cast<const uint32_t*>(&hi);
  reinterpret_cast<uint2*>(s)[i4] = u;
}

// A block per 64 Ki-element chunk, its 512 threads stepping by 512 groups of 4 (kiln's blocks, in one launch).
__global__ void __launch_bounds__(512)
    chunked(float4* p, const float4* g, float4* m, float4* v, __nv_bfloat16* s, int64_t n4, Hyper h) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * (65536 / 4);
  const int64_t end = min(begin + 65536 / 4, n4);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float4 rp = p[i], rm = m[i], rv = v[i];
    const float4 rg = g[i];
    update4(rp, rg, rm, rv, h);
    p[i] = rp;
    m[i] = rm;
    v[i] = rv;
    store_shadow(s, i, rp);
  }
}

template <int I, int T>
__global__ void __launch_bounds__(T) flat(float4* __restrict__ p, const float4* __restrict__ g, float4* __restrict__ m,
                                          float4* __restrict__ v, __nv_bfloat16* __restrict__ s, int64_t n4, Hyper h) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * T * I;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * T * I + threadIdx.x; base < n4; base += stride) {
    float4 rp[I], rg[I], rm[I], rv[I];
#pragma unroll
    for (int j = 0; j < I; ++j) {
      const int64_t i = base + static_cast<int64_t>(j) * T;
      if (i < n4) {
        rp[j] = p[i];
        rg[j] = g[i];
        rm[j] = m[i];
        rv[j] = v[i];
      }
    }
#pragma unroll
    for (int j = 0; j < I; ++j) {
      const int64_t i = base + static_cast<int64_t>(j) * T;
      if (i < n4) {
        update4(rp[j], rg[j], rm[j], rv[j], h);
        p[i] = rp[j];
        m[i] = rm[j];
        v[i] = rv[j];
        store_shadow(s, i, rp[j]);
      }
    }
  }
}

struct Flat {
  Tensor p, g, m, v, s;
};

void report(const char* name, double ms, int64_t n) {
  std::printf("%-14s %8.3f ms  %5.2f TB/s\n", name, ms, 30.0 * static_cast<double>(n) / (ms * 1e-3) / 1e12);
}

template <int I, int T>
void run_flat(const char* name, Flat& f, int64_t n, const Hyper& h, cudaStream_t stream) {
  int per_sm = 0, sms = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, flat<I, T>, T, 0);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int64_t n4 = n / 4;
  auto launch = [&] {
    flat<I, T><<<per_sm * sms, T, 0, stream>>>(
        reinterpret_cast<float4*>(f.p.data_ptr<float>()), reinterpret_cast<const float4*>(f.g.data_ptr<float>()),
        reinterpret_cast<float4*>(f.m.data_ptr<float>()), reinterpret_cast<float4*>(f.v.data_ptr<float>()),
        reinterpret_cast<__nv_bfloat16*>(f.s.data_ptr()), n4, h);
  };
  const double ms = bench::median_step_ms(5, 20, launch);
  char label[64];
  std::snprintf(label, sizeof(label), "%s (%d/SM)", name, per_sm);
  report(label, ms, n);
}

}  // namespace

int main() {
  const Device dev = Device::cuda();
  nn::models::BertForSequenceClassification model(nn::models::BertConfig::large(), 2);
  model.to(dev);
  std::vector<Tensor> params = model.parameters();
  int64_t n = 0;
  for (const Tensor& t : params) n += t.numel();
  std::printf("BERT-large: %zu tensors, %lld elements, %.2f GB moved per update\n", params.size(),
              static_cast<long long>(n), 30.0 * static_cast<double>(n) / 1e9);

  std::vector<Tensor> grads, ms, vs, steps, shadows;
  for (const Tensor& t : params) {
    grads.push_back(randn(t.shape(), {.device = dev}) * Scalar(1e-3));
    ms.push_back(zeros(t.shape(), {.device = dev}));
    vs.push_back(zeros(t.shape(), {.device = dev}));
    steps.push_back(zeros({1}, {.device = dev}));
    shadows.push_back(zeros(t.shape(), {.dtype = DType::BFloat16, .device = dev}));
  }
  optim::cuda_impl::AdamHyper ah{.lr = 1e-4, .weight_decay = 0.01, .decoupled_weight_decay = true};
  const cudaStream_t stream = static_cast<cudaStream_t>(cuda::current_stream().handle());
  const double kiln_ms = bench::median_step_ms(
      5, 20, [&] { optim::cuda_impl::fused_adam(params, grads, ms, vs, {}, steps, ah, Tensor(), Tensor(), shadows); });
  report("kiln", kiln_ms, n);

  Flat f{randn({n}, {.device = dev}), randn({n}, {.device = dev}) * Scalar(1e-3), zeros({n}, {.device = dev}),
         zeros({n}, {.device = dev}), zeros({n}, {.dtype = DType::BFloat16, .device = dev})};
  const Hyper h{.step_size = 1e-4f / 0.1f,
                .bc2_sqrt = std::sqrt(0.001f),
                .beta1 = 0.9f,
                .one_minus_beta1 = 0.1f,
                .beta2 = 0.999f,
                .one_minus_beta2 = 0.001f,
                .eps = 1e-8f,
                .lr_wd = 1e-6f};
  const int64_t n4 = n / 4;
  const int chunks = static_cast<int>((n + 65535) / 65536);
  const double chunked_ms = bench::median_step_ms(5, 20, [&] {
    chunked<<<chunks, 512, 0, stream>>>(
        reinterpret_cast<float4*>(f.p.data_ptr<float>()), reinterpret_cast<const float4*>(f.g.data_ptr<float>()),
        reinterpret_cast<float4*>(f.m.data_ptr<float>()), reinterpret_cast<float4*>(f.v.data_ptr<float>()),
        reinterpret_cast<__nv_bfloat16*>(f.s.data_ptr()), n4, h);
  });
  report("chunked", chunked_ms, n);
  run_flat<1, 512>("flat<1,512>", f, n, h, stream);
  run_flat<2, 512>("flat<2,512>", f, n, h, stream);
  run_flat<1, 256>("flat<1,256>", f, n, h, stream);
  run_flat<2, 256>("flat<2,256>", f, n, h, stream);
  run_flat<4, 256>("flat<4,256>", f, n, h, stream);
  run_flat<2, 128>("flat<2,128>", f, n, h, stream);

  const int64_t bytes = 15 * n;  // read 15 n and written 15 n: the update's 30 bytes an element
  Tensor a = empty({bytes}, {.dtype = DType::UInt8, .device = dev}),
         b = empty({bytes}, {.dtype = DType::UInt8, .device = dev});
  const double copy_ms = bench::median_step_ms(5, 20, [&] {
    cudaMemcpyAsync(b.data_ptr(), a.data_ptr(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream);
  });
  report("copy", copy_ms, n);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("%s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
