// fused_lamb (fused.h): LAMB (You et al., 2019, as NVIDIA Apex's FusedLAMB with decoupled weight decay) in
// two phases, with t = steps[i] + 1 and, per element in float32:
//   g = grad / grad_scale;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   u = (m / bc1) / (sqrt(v / bc2) + eps) + weight_decay * p     (bc = 1 - beta^t, or 1 without bias_correction)
// Phase 1 writes m, v and, per chunk, the block's sums of p^2 and u^2 into a partials buffer (2 floats per
// chunk). Phase 2: every block sums its tensor's chunk partials in a fixed order (the same in every block of
// the tensor: deterministic, no atomics), trust = clamp(||p|| / ||u||, 0, max_trust_ratio) (1 where a norm
// is 0), recomputes u from the stored m, v and the unchanged p, and writes p -= lr * trust * u. A third
// launch increments the steps. Sums of squares are float32 (per thread, then a fixed block tree).
#include "kiln/optim/cuda/multi_tensor.cuh"
#include "kiln/tensor/internal_ops.h"  // internal::empty
#include "kiln/tensor/trace.h"         // a range per kernel entry

namespace kiln::optim::cuda_impl {
namespace {

struct LambMath {
  double beta1, beta2;  // for the bias corrections (float64)
  float beta1_f, one_minus_beta1, beta2_f, one_minus_beta2, eps, weight_decay;
  bool bias_correction;

  struct Corrections {
    float inv_bc1, inv_bc2;
  };
  __device__ Corrections corrections(const float* step) const {
    if (!bias_correction) return {1.f, 1.f};
    const double t = static_cast<double>(*step) + 1.0;
    return {static_cast<float>(1.0 / (1.0 - pow(beta1, t))), static_cast<float>(1.0 / (1.0 - pow(beta2, t)))};
  }
  // The update of one element from the new m, v and the parameter: identical in both phases and in every
  // instantiation of phase 2 (with or without shadows), so each operation is rounded on its own (the _rn
  // intrinsics are never contracted into fused multiply-adds, which the compiler may choose per instantiation).
  __device__ __forceinline__ float update(float p, float m, float v, Corrections c) const {
    return __fadd_rn(__fdiv_rn(__fmul_rn(m, c.inv_bc1), __fadd_rn(__fsqrt_rn(__fmul_rn(v, c.inv_bc2)), eps)),
                     __fmul_rn(weight_decay, p));
  }
};

// Phase 1 over (p, g, m, v).
template <typename P>
struct LambPhase1 {
  LambMath math;
  mt::Hooks hooks;  // lr_device unused
  float* partials;  // (2 * chunks): sum p^2, sum u^2 per global chunk

  template <int D>
  __device__ void operator()(const mt::Meta<D>& m, int slot, int64_t chunk) const {
    if (hooks.skip_step()) return;
    const P* p = mt::chunk_ptr<const P>(m, 0, slot, chunk);
    const P* g = mt::chunk_ptr<const P>(m, 1, slot, chunk);
    float* ea = mt::chunk_ptr<float>(m, 2, slot, chunk);
    float* eas = mt::chunk_ptr<float>(m, 3, slot, chunk);
    const LambMath::Corrections c = math.corrections(m.step[slot]);
    const float divisor = hooks.grad_divisor();
    float sp = 0.f, su = 0.f;
    mt::for_each_group(mt::chunk_len(m, slot, chunk), mt::all_aligned(m, slot), [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float rp[mt::kVec], rg[mt::kVec], rm[mt::kVec], rv[mt::kVec];
      mt::load<W>(p + i, rp);
      mt::load<W>(g + i, rg);
      mt::load<W>(ea + i, rm);
      mt::load<W>(eas + i, rv);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float gk = rg[k] / divisor;
        rm[k] = math.beta1_f * rm[k] + math.one_minus_beta1 * gk;
        rv[k] = math.beta2_f * rv[k] + math.one_minus_beta2 * gk * gk;
        const float u = math.update(rp[k], rm[k], rv[k], c);
        sp += rp[k] * rp[k];
        su += u * u;
      }
      mt::store<W>(ea + i, rm);
      mt::store<W>(eas + i, rv);
    });
    sp = mt::block_sum(sp);
    su = mt::block_sum(su);
    if (threadIdx.x == 0) {
      const int64_t k = m.chunk_base[slot] + chunk;
      partials[2 * k] = sp;
      partials[2 * k + 1] = su;
    }
  }
};

// Phase 2 over (p, m, v[, shadows]).
template <typename P, typename S = void>  // S: the shadows' type (last list), void: none
struct LambPhase2 {
  LambMath math;
  float lr, max_trust_ratio;
  mt::Hooks hooks;  // grad_scale unused
  const float* partials;

  template <int D>
  __device__ void operator()(const mt::Meta<D>& m, int slot, int64_t chunk) const {
    if (hooks.skip_step()) return mt::refresh_shadow<P, S>(m, slot, chunk);
    // The tensor's norms from its chunks' partials, in the same order in every block of the tensor.
    const int64_t base = m.chunk_base[slot];
    const int64_t chunks = (m.numel[slot] + mt::kChunk - 1) / mt::kChunk;
    float sp = 0.f, su = 0.f;
    for (int64_t k = threadIdx.x; k < chunks; k += blockDim.x) {
      sp += partials[2 * (base + k)];
      su += partials[2 * (base + k) + 1];
    }
    const float p_norm = sqrtf(mt::block_sum(sp));
    const float u_norm = sqrtf(mt::block_sum(su));
    const float trust = (p_norm > 0.f && u_norm > 0.f) ? fminf(p_norm / u_norm, max_trust_ratio) : 1.f;
    const float scale = static_cast<float>(hooks.lr(lr)) * trust;

    P* p = mt::chunk_ptr<P>(m, 0, slot, chunk);
    S* sh = mt::shadow_ptr<S>(m, slot, chunk);
    const float* ea = mt::chunk_ptr<const float>(m, 1, slot, chunk);
    const float* eas = mt::chunk_ptr<const float>(m, 2, slot, chunk);
    const LambMath::Corrections c = math.corrections(m.step[slot]);
    mt::for_each_group(mt::chunk_len(m, slot, chunk), mt::all_aligned(m, slot), [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float rp[mt::kVec], rm[mt::kVec], rv[mt::kVec];
      mt::load<W>(p + i, rp);
      mt::load<W>(ea + i, rm);
      mt::load<W>(eas + i, rv);
#pragma unroll
      for (int k = 0; k < W; ++k) rp[k] = __fsub_rn(rp[k], __fmul_rn(scale, math.update(rp[k], rm[k], rv[k], c)));
      mt::store<W>(p + i, rp);
      mt::store_shadow<W>(sh, i, rp);
    });
  }
};

}  // namespace

void fused_lamb(const TensorVec& params, const TensorVec& grads, const TensorVec& exp_avgs,
                const TensorVec& exp_avg_sqs, const TensorVec& steps, const LambHyper& h, const Tensor& grad_scale,
                const Tensor& found_inf, const TensorVec& shadows) {
  trace::Scope range(trace::Kind::Op, "fused_lamb", params.empty() ? Device::cpu() : params[0].device());
  constexpr const char* kOp = "fused_lamb";
  const Device dev = check_params(params, kOp);
  if (params.empty()) return;
  check_list(grads, kOp, "grads", dev, params.size(), params[0].dtype(), &params);
  check_list(exp_avgs, kOp, "exp_avgs", dev, params.size(), DType::Float32, &params);
  check_list(exp_avg_sqs, kOp, "exp_avg_sqs", dev, params.size(), DType::Float32, &params);
  check_steps(steps, kOp, dev, params.size());
  const std::optional<DType> shadow_dtype = check_hooks(grad_scale, found_inf, shadows, kOp, dev, params);
  KILN_CHECK(h.max_trust_ratio >= 0, kOp, ": max_trust_ratio must be >= 0, got ", h.max_trust_ratio);
  int64_t chunks = 0;
  for (const Tensor& p : params) chunks += mt::num_chunks(p.numel());
  if (chunks == 0) {  // no elements: only the step counts move
    mt::increment_steps(steps, found_inf, cuda::stream_for(params[0]), kOp);
    return;
  }
  cudaStream_t stream = cuda::stream_for(params[0]);
  // (2 * chunks) float32 from the caching allocator; every entry is written by phase 1 before phase 2 reads it.
  const Tensor partials = internal::empty({2 * chunks}, {.dtype = DType::Float32, .device = dev});
  LambMath math{};
  math.beta1 = h.beta1;
  math.beta2 = h.beta2;
  math.beta1_f = static_cast<float>(h.beta1);
  math.one_minus_beta1 = static_cast<float>(1 - h.beta1);
  math.beta2_f = static_cast<float>(h.beta2);
  math.one_minus_beta2 = static_cast<float>(1 - h.beta2);
  math.eps = static_cast<float>(h.eps);
  math.weight_decay = static_cast<float>(h.weight_decay);
  math.bias_correction = h.bias_correction;
  mt::dispatch_fused(params[0].dtype(), kOp, [&](auto tag) {
    using P = decltype(tag);
    mt::apply<4>({&params, &grads, &exp_avgs, &exp_avg_sqs}, &steps, stream,
                 LambPhase1<P>{math, mt::hooks(grad_scale, found_inf, nullptr), partials.data_ptr<float>()}, kOp);
    mt::dispatch_shadows<P>(shadow_dtype, [&](auto stag) {
      using S = typename decltype(stag)::type;
      mt::apply_with_shadows<S>(
          {&params, &exp_avgs, &exp_avg_sqs}, shadows, &steps, stream,
          LambPhase2<P, S>{math, static_cast<float>(h.lr), static_cast<float>(h.max_trust_ratio),
                           mt::hooks(Tensor(), found_inf, h.lr_device), partials.data_ptr<float>()},
          kOp);
    });
  });
  mt::increment_steps(steps, found_inf, stream, kOp);
}

}  // namespace kiln::optim::cuda_impl
