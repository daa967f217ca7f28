// CudaBackend::add_n and mul_backward: fused kernels for the backward pass, where small ops are bound by
// kernel launches. add_n sums many same-shaped contiguous tensors in one kernel: the engine uses it to add
// up the gradients a tensor receives from many small ops with one launch instead of one per gradient. Up
// to kMaxInputs pointers travel in the kernel's parameters (2 KiB of the 4 KiB allowed); more are summed
// in rounds into a compute-dtype buffer, so the result is still rounded once. mul_backward computes both
// gradients of a * b in one kernel.
#include <algorithm>

#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"  // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/cuda/loops.cuh"     // to_compute, from_compute, kThreads
#include "kiln/tensor/dispatch.h"         // visit_numeric_dtype, visit_floating_dtype, compute_t
#include "kiln/tensor/internal_ops.h"     // internal::empty for the rounds' buffer

namespace kiln::cuda {
namespace {

constexpr int kMaxInputs = 256;

template <typename T>
struct InputPointers {
  const device_t<T>* p[kMaxInputs];
};

// out[i] = (accumulate ? out[i] : 0) + sum_k in[k][i], summed in compute_t<In>, rounded once to Out.
template <typename In, typename Out>
__global__ void add_n_kernel(device_t<Out>* out, InputPointers<In> in, int count, bool accumulate, int64_t n) {
  using C = compute_t<In>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    C sum = accumulate ? static_cast<C>(to_compute<Out>(out[i])) : C(0);
    for (int k = 0; k < count; ++k) sum += to_compute<In>(in.p[k][i]);
    out[i] = from_compute<Out>(static_cast<compute_t<Out>>(sum));
  }
}

template <typename In, typename Out>
void launch_rounds(const Tensor& out, const std::vector<Tensor>& inputs, cudaStream_t stream) {
  const int64_t n = out.numel();
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  auto* o = static_cast<device_t<Out>*>(out.data_ptr());
  for (size_t first = 0; first < inputs.size(); first += kMaxInputs) {
    InputPointers<In> ptrs{};
    const int count = static_cast<int>(std::min<size_t>(kMaxInputs, inputs.size() - first));
    for (int k = 0; k < count; ++k) {
      ptrs.p[k] = static_cast<const device_t<In>*>(inputs[first + static_cast<size_t>(k)].data_ptr());
    }
    add_n_kernel<In, Out><<<blocks, kThreads, 0, stream>>>(o, ptrs, count, first > 0, n);
    KILN_CUDA_CHECK_LAUNCH("add_n");
  }
}

// ga = g * b, gb = g * a in compute_t<T>, each rounded once.
template <typename T>
__global__ void mul_backward_kernel(device_t<T>* ga, device_t<T>* gb, const device_t<T>* g, const device_t<T>* a,
                                    const device_t<T>* b, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const compute_t<T> gi = to_compute<T>(g[i]);
    ga[i] = from_compute<T>(gi * to_compute<T>(b[i]));
    gb[i] = from_compute<T>(gi * to_compute<T>(a[i]));
  }
}

}  // namespace

void CudaBackend::mul_backward(const Tensor& ga, const Tensor& gb, const Tensor& g, const Tensor& a, const Tensor& b) {
  const int64_t n = g.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_for(g);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  visit_floating_dtype(g.dtype(), "mul_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using D = device_t<T>;
    mul_backward_kernel<T><<<blocks, kThreads, 0, stream>>>(
        static_cast<D*>(ga.data_ptr()), static_cast<D*>(gb.data_ptr()), static_cast<const D*>(g.data_ptr()),
        static_cast<const D*>(a.data_ptr()), static_cast<const D*>(b.data_ptr()), n);
    KILN_CUDA_CHECK_LAUNCH("mul_backward");
  });
}

void CudaBackend::add_n(const Tensor& out, const std::vector<Tensor>& inputs) {
  if (out.numel() == 0) return;
  cudaStream_t stream = stream_for(out);
  visit_numeric_dtype(out.dtype(), "add_n", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    if (inputs.size() <= static_cast<size_t>(kMaxInputs) || std::is_same_v<T, C>) {
      launch_rounds<T, T>(out, inputs, stream);
      return;
    }
    // 16-bit floats with many inputs: the rounds add into a float32 buffer, rounded once at the end.
    Tensor acc = internal::empty(out.shape(), {.dtype = dtype_of<C>(), .device = out.device()});
    launch_rounds<T, C>(acc, inputs, stream);
    launch_rounds<C, T>(out, {acc}, stream);
  });
}

}  // namespace kiln::cuda
