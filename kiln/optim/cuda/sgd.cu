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
  const float* grad_scale;
  const float* found_inf;
  const double* lr_device;  // when set, the learning rate (CUDA graphs)

  template <int D>
  __device__ void operator()(const mt::Meta<D>& m, int slot, int64_t chunk) const {
    if (mt::skip_step(found_inf)) return mt::refresh_shadow<P, S>(m, slot, chunk);
    const float lr = lr_device != nullptr ? static_cast<float>(*lr_device) : this->lr;
    const int64_t off = chunk * mt::kChunk;
    P* p = static_cast<P*>(m.ptr[0][slot]) + off;
    const P* g = static_cast<const P*>(m.ptr[1][slot]) + off;
    S* sh = mt::shadow_ptr<S>(m, slot, chunk);
    float* buf = nullptr;
    if constexpr (kMomentum) buf = static_cast<float*>(m.ptr[2][slot]) + off;
    const bool first = kMomentum && m.step[slot] != nullptr && *m.step[slot] == 0.f;
    const float divisor = mt::grad_divisor(grad_scale);
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
  check_scalar(grad_scale, kOp, "grad_scale", dev, false);
  check_scalar(found_inf, kOp, "found_inf", dev, false);
  const std::optional<DType> shadow_dtype = check_shadows(shadows, kOp, params);
  cudaStream_t stream = cuda::stream_for(params[0]);
  mt::dispatch_fused(params[0].dtype(), kOp, [&](auto tag) {
    using P = decltype(tag);
    auto run = [&](auto functor, auto depth) {
      constexpr int D = decltype(depth)::value;
      std::array<const TensorVec*, D> lists;
      lists[0] = &params;
      lists[1] = &grads;
      if constexpr (D == 3) lists[2] = momentum ? &momentum_buffers : &shadows;
      if constexpr (D == 4) lists[2] = &momentum_buffers, lists[3] = &shadows;
      mt::apply<D>(lists, steps.empty() ? nullptr : &steps, stream, functor, kOp);
    };
    const float lr = static_cast<float>(h.lr), mom = static_cast<float>(h.momentum),
                omd = static_cast<float>(1 - h.dampening), wd = static_cast<float>(h.weight_decay);
    const float* gs = mt::scalar_ptr(grad_scale);
    const float* fi = mt::scalar_ptr(found_inf);
    if (shadow_dtype) {
      if constexpr (std::is_same_v<P, float>) {  // check_shadows: shadows only of float32 parameters
        mt::dispatch_shadow(*shadow_dtype, [&](auto stag) {
          using S = decltype(stag);
          if (momentum) {
            run(SgdFunctor<P, true, S>{lr, mom, omd, wd, h.nesterov, h.maximize, gs, fi, h.lr_device},
                std::integral_constant<int, 4>{});
          } else {
            run(SgdFunctor<P, false, S>{lr, mom, omd, wd, h.nesterov, h.maximize, gs, fi, h.lr_device},
                std::integral_constant<int, 3>{});
          }
        });
      }
    } else if (momentum) {
      run(SgdFunctor<P, true>{lr, mom, omd, wd, h.nesterov, h.maximize, gs, fi, h.lr_device},
          std::integral_constant<int, 3>{});
    } else {
      run(SgdFunctor<P, false>{lr, mom, omd, wd, h.nesterov, h.maximize, gs, fi, h.lr_device},
          std::integral_constant<int, 2>{});
    }
  });
  if (!steps.empty()) mt::increment_steps(steps, found_inf, stream, kOp);
}

}  // namespace kiln::optim::cuda_impl
