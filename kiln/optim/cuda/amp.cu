// fused_unscale_and_check (fused.h): grads[i] *= inv_scale[0] for every element, and found_inf[0] = 1 when an
// element was inf or NaN before the multiplication (as torch._amp_foreach_non_finite_check_and_unscale_).
// Every thread that saw a non-finite value stores 1.0f itself (same value from any number of threads: no
// atomics needed); found_inf is never reset here. One launch per dtype present in the list.
#include "kiln/optim/cuda/multi_tensor.cuh"
#include "kiln/tensor/trace.h"  // a range per kernel entry

namespace kiln::optim::cuda_impl {
namespace {

template <typename T>
struct UnscaleAndCheck {
  float* found_inf;
  const float* inv_scale;

  template <int D>
  __device__ void operator()(const mt::Meta<D>& m, int slot, int64_t chunk) const {
    T* g = static_cast<T*>(m.ptr[0][slot]) + chunk * mt::kChunk;
    const float s = *inv_scale;
    bool bad = false;
    mt::for_each_group(mt::chunk_len(m, slot, chunk), mt::all_aligned(m, slot), [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float r[mt::kVec];
      mt::load<W>(g + i, r);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        bad = bad || !isfinite(r[k]);
        r[k] *= s;
      }
      mt::store<W>(g + i, r);
    });
    if (bad) *found_inf = 1.f;
  }
};

}  // namespace

void fused_unscale_and_check(const TensorVec& grads, const Tensor& found_inf, const Tensor& inv_scale) {
  trace::Scope range(trace::Kind::Op, "fused_unscale_and_check", grads.empty() ? Device::cpu() : grads[0].device());
  constexpr const char* kOp = "fused_unscale_and_check";
  const Device dev = check_tensors(grads, kOp, "grads");
  if (grads.empty()) return;
  check_scalar(found_inf, kOp, "found_inf", dev, true);
  check_scalar(inv_scale, kOp, "inv_scale", dev, true);
  cudaStream_t stream = cuda::stream_for(grads[0]);
  mt::for_each_dtype_group(grads, [&](DType dtype, const TensorVec& group) {
    mt::dispatch_fused(dtype, kOp, [&](auto tag) {
      using T = decltype(tag);
      mt::apply<1>({&group}, nullptr, stream,
                   UnscaleAndCheck<T>{found_inf.data_ptr<float>(), inv_scale.data_ptr<float>()}, kOp);
    });
  });
}

}  // namespace kiln::optim::cuda_impl
