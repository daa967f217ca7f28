// fused_sgd (fused.h): torch.optim.SGD's update over many parameters per launch. Per element, in float32:
//   g = grad / grad_scale;  if maximize: g = -g;  if weight_decay: g += weight_decay * p
//   momentum: buf = (step == 0) ? g : momentum * buf + (1 - dampening) * g;  g = nesterov ? g + momentum * buf : buf
//   p -= lr * g
// (16-bit params: read into float32, written back rounded once; buffers are float32.) The step counters are
// read by the update and incremented by a second launch after it, so every chunk of a tensor sees one value.
#include "kiln/optim/cuda/multi_tensor.cuh"
#include "kiln/tensor/trace.h"  // a range per kernel entry

namespace kiln::optim::cuda_impl {
namespace {

template <typename P, bool kMomentum, typename S = void>  // S: the shadows' type (last list), void: none
struct SgdFunctor {
  float lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov, maximize;
  mt::Hooks hooks;

  template <int D>
  __device__ void operator()(const mt::Meta<D>& m, int slot, int64_t chunk) const {
    if (hooks.skip_step()) return mt::refresh_shadow<P, S>(m, slot, chunk);
    const auto lr = static_cast<float>(hooks.lr(this->lr));
    P* p = mt::chunk_ptr<P>(m, 0, slot, chunk);
    const P* g = mt::chunk_ptr<const P>(m, 1, slot, chunk);
    S* sh = mt::shadow_ptr<S>(m, slot, chunk);
    float* buf = nullptr;
    if constexpr (kMomentum) buf = mt::chunk_ptr<float>(m, 2, slot, chunk);
    const bool first = kMomentum && m.step[slot] != nullptr && *m.step[slot] == 0.f;
    const float divisor = hooks.grad_divisor();
    mt::for_each_group(mt::chunk_len(m, slot, chunk), mt::all_aligned(m, slot), [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float rp[mt::kVec], rg[mt::kVec];
      [[maybe_unused]] float rb[mt::kVec];
      mt::load<W>(p + i, rp);
      mt::load<W>(g + i, rg);
      if constexpr (kMomentum) {
        if (!first) mt::load<W>(buf + i, rb);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) {
        float d = rg[k] / divisor;
        if (maximize) d = -d;
        if (weight_decay != 0.f) d += weight_decay * rp[k];
        if constexpr (kMomentum) {
          rb[k] = first ? d : momentum * rb[k] + one_minus_dampening * d;
          d = nesterov ? d + momentum * rb[k] : rb[k];
        }
        rp[k] -= lr * d;
      }
      mt::store<W>(p + i, rp);
      mt::store_shadow<W>(sh, i, rp);
      if constexpr (kMomentum) mt::store<W>(buf + i, rb);
    });
  }
};

}  // namespace

void fused_sgd(const TensorVec& params, const TensorVec& grads, const TensorVec& momentum_buffers,
               const TensorVec& steps, const SgdHyper& h, const Tensor& grad_scale, const Tensor& found_inf,
               const TensorVec& shadows) {
  trace::Scope range(trace::Kind::Op, "fused_sgd", params.empty() ? Device::cpu() : params[0].device());
  constexpr const char* kOp = "fused_sgd";
  const Device dev = check_params(params, kOp);
  if (params.empty()) return;
  const bool momentum = h.momentum != 0;
  check_list(grads, kOp, "grads", dev, params.size(), params[0].dtype(), &params);
  if (momentum) {
    check_list(momentum_buffers, kOp, "momentum_buffers", dev, params.size(), DType::Float32, &params);
    check_steps(steps, kOp, dev, params.size());
  } else {
    KILN_CHECK(momentum_buffers.empty(), kOp, ": momentum_buffers must be empty when momentum == 0");
    if (!steps.empty()) check_steps(steps, kOp, dev, params.size());
  }
  KILN_CHECK(!h.nesterov || (h.momentum > 0 && h.dampening == 0), kOp,
             ": nesterov needs momentum > 0 and dampening == 0 (momentum ", h.momentum, ", dampening ", h.dampening,
             ")");
  const std::optional<DType> shadow_dtype = check_hooks(grad_scale, found_inf, shadows, kOp, dev, params);
  cudaStream_t stream = cuda::stream_for(params[0]);
  mt::dispatch_fused(params[0].dtype(), kOp, [&](auto tag) {
    using P = decltype(tag);
    const float lr = static_cast<float>(h.lr), mom = static_cast<float>(h.momentum),
                omd = static_cast<float>(1 - h.dampening), wd = static_cast<float>(h.weight_decay);
    const mt::Hooks hooks = mt::hooks(grad_scale, found_inf, h.lr_device);
    const TensorVec* step_list = steps.empty() ? nullptr : &steps;
    mt::dispatch_shadows<P>(shadow_dtype, [&](auto stag) {
      using S = typename decltype(stag)::type;
      if (momentum) {
        mt::apply_with_shadows<S>({&params, &grads, &momentum_buffers}, shadows, step_list, stream,
                                  SgdFunctor<P, true, S>{lr, mom, omd, wd, h.nesterov, h.maximize, hooks}, kOp);
      } else {
        mt::apply_with_shadows<S>({&params, &grads}, shadows, step_list, stream,
                                  SgdFunctor<P, false, S>{lr, mom, omd, wd, h.nesterov, h.maximize, hooks}, kOp);
      }
    });
  });
  if (!steps.empty()) mt::increment_steps(steps, found_inf, stream, kOp);
}

}  // namespace kiln::optim::cuda_impl
