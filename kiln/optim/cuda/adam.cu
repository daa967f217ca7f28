// fused_adam (fused.h): torch.optim.Adam / AdamW's update over many parameters per launch. Per element, in
// float32 (as PyTorch's fused kernel), with t = steps[i] + 1:
//   g = grad / grad_scale;  if maximize: g = -g
//   weight_decay: AdamW p -= lr * wd * p;  Adam g += wd * p
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;  amsgrad: vmax = max(vmax, v), v' = vmax
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v') / sqrt(1 - beta2^t) + eps)
// The bias corrections are computed once per block in float64 from the float32 step count. 16-bit params are
// read into float32 and written back rounded once; m, v, vmax are float32. The step counters are
// incremented by a second launch after the update (so every chunk of a tensor saw the same count).
#include "kiln/optim/cuda/multi_tensor.cuh"
#include "kiln/tensor/trace.h"  // a range per kernel entry

namespace kiln::optim::cuda_impl {
namespace {

template <typename P, bool kAmsgrad, typename S = void>  // S: the shadows' type (last list), void: none
struct AdamFunctor {
  double lr, beta1, beta2, weight_decay_d;  // for the bias corrections (float64)
  float lr_f, beta1_f, one_minus_beta1, beta2_f, one_minus_beta2, eps, weight_decay, lr_wd;
  bool decoupled, maximize;
  mt::Hooks hooks;

  template <int D>
  __device__ void operator()(const mt::Meta<D>& m, int slot, int64_t chunk) const {
    if (hooks.skip_step()) return mt::refresh_shadow<P, S>(m, slot, chunk);
    P* p = mt::chunk_ptr<P>(m, 0, slot, chunk);
    const P* g = mt::chunk_ptr<const P>(m, 1, slot, chunk);
    S* sh = mt::shadow_ptr<S>(m, slot, chunk);
    float* ea = mt::chunk_ptr<float>(m, 2, slot, chunk);
    float* eas = mt::chunk_ptr<float>(m, 3, slot, chunk);
    float* mx = nullptr;
    if constexpr (kAmsgrad) mx = mt::chunk_ptr<float>(m, 4, slot, chunk);
    const double t = static_cast<double>(*m.step[slot]) + 1.0;
    const double lr = hooks.lr(this->lr);
    const float lr_wd = hooks.lr_device != nullptr ? static_cast<float>(lr * weight_decay_d) : this->lr_wd;
    const float step_size = static_cast<float>(lr / (1.0 - pow(beta1, t)));
    const float bc2_sqrt = static_cast<float>(sqrt(1.0 - pow(beta2, t)));
    const float divisor = hooks.grad_divisor();
    mt::for_each_group(mt::chunk_len(m, slot, chunk), mt::all_aligned(m, slot), [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float rp[mt::kVec], rg[mt::kVec], rm[mt::kVec], rv[mt::kVec];
      [[maybe_unused]] float rx[mt::kVec];
      mt::load<W>(p + i, rp);
      mt::load<W>(g + i, rg);
      mt::load<W>(ea + i, rm);
      mt::load<W>(eas + i, rv);
      if constexpr (kAmsgrad) mt::load<W>(mx + i, rx);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        float gk = rg[k] / divisor;
        if (maximize) gk = -gk;
        if (weight_decay != 0.f) {
          if (decoupled) rp[k] -= lr_wd * rp[k];
          else gk += weight_decay * rp[k];
        }
        rm[k] = beta1_f * rm[k] + one_minus_beta1 * gk;
        rv[k] = beta2_f * rv[k] + one_minus_beta2 * gk * gk;
        float v = rv[k];
        if constexpr (kAmsgrad) {
          rx[k] = fmaxf(rx[k], rv[k]);
          v = rx[k];
        }
        const float denom = sqrtf(v) / bc2_sqrt + eps;
        rp[k] -= step_size * rm[k] / denom;
      }
      mt::store<W>(p + i, rp);
      mt::store_shadow<W>(sh, i, rp);
      mt::store<W>(ea + i, rm);
      mt::store<W>(eas + i, rv);
      if constexpr (kAmsgrad) mt::store<W>(mx + i, rx);
    });
  }
};

}  // namespace

void fused_adam(const TensorVec& params, const TensorVec& grads, const TensorVec& exp_avgs,
                const TensorVec& exp_avg_sqs, const TensorVec& max_exp_avg_sqs, const TensorVec& steps,
                const AdamHyper& h, const Tensor& grad_scale, const Tensor& found_inf, const TensorVec& shadows) {
  trace::Scope range(trace::Kind::Op, "fused_adam", params.empty() ? Device::cpu() : params[0].device());
  constexpr const char* kOp = "fused_adam";
  const Device dev = check_params(params, kOp);
  if (params.empty()) return;
  check_list(grads, kOp, "grads", dev, params.size(), params[0].dtype(), &params);
  check_list(exp_avgs, kOp, "exp_avgs", dev, params.size(), DType::Float32, &params);
  check_list(exp_avg_sqs, kOp, "exp_avg_sqs", dev, params.size(), DType::Float32, &params);
  if (h.amsgrad) {
    check_list(max_exp_avg_sqs, kOp, "max_exp_avg_sqs", dev, params.size(), DType::Float32, &params);
  } else {
    KILN_CHECK(max_exp_avg_sqs.empty(), kOp, ": max_exp_avg_sqs must be empty unless amsgrad");
  }
  check_steps(steps, kOp, dev, params.size());
  const std::optional<DType> shadow_dtype = check_hooks(grad_scale, found_inf, shadows, kOp, dev, params);
  cudaStream_t stream = cuda::stream_for(params[0]);
  mt::dispatch_fused(params[0].dtype(), kOp, [&](auto tag) {
    using P = decltype(tag);
    auto fill = [&](auto f) {
      f.lr = h.lr;
      f.beta1 = h.beta1;
      f.beta2 = h.beta2;
      f.lr_f = static_cast<float>(h.lr);
      f.beta1_f = static_cast<float>(h.beta1);
      f.one_minus_beta1 = static_cast<float>(1 - h.beta1);
      f.beta2_f = static_cast<float>(h.beta2);
      f.one_minus_beta2 = static_cast<float>(1 - h.beta2);
      f.eps = static_cast<float>(h.eps);
      f.weight_decay = static_cast<float>(h.weight_decay);
      f.lr_wd = static_cast<float>(h.lr * h.weight_decay);
      f.weight_decay_d = h.weight_decay;
      f.decoupled = h.decoupled_weight_decay;
      f.maximize = h.maximize;
      f.hooks = mt::hooks(grad_scale, found_inf, h.lr_device);
      return f;
    };
    mt::dispatch_shadows<P>(shadow_dtype, [&](auto stag) {
      using S = typename decltype(stag)::type;
      if (h.amsgrad) {
        mt::apply_with_shadows<S>({&params, &grads, &exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs}, shadows, &steps, stream,
                                  fill(AdamFunctor<P, true, S>{}), kOp);
      } else {
        mt::apply_with_shadows<S>({&params, &grads, &exp_avgs, &exp_avg_sqs}, shadows, &steps, stream,
                                  fill(AdamFunctor<P, false, S>{}), kOp);
      }
    });
  });
  mt::increment_steps(steps, found_inf, stream, kOp);
}

}  // namespace kiln::optim::cuda_impl
