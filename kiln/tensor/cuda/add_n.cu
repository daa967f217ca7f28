// CudaBackend::add_n: the sum of many same-shaped contiguous tensors in one kernel. The backward engine
// uses it to add up the gradients a tensor receives from many small ops with one launch instead of one
// per gradient. Up to kMaxInputs pointers travel in the kernel's parameters; more are summed in rounds
// that add into out.
#include <algorithm>

#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"  // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/cuda/loops.cuh"     // to_compute, from_compute, kThreads
#include "kiln/tensor/dispatch.h"         // visit_numeric_dtype, compute_t

namespace kiln::cuda {
namespace {

constexpr int kMaxInputs = 32;

template <typename T>
struct InputPointers {
  const device_t<T>* p[kMaxInputs];
};

// out[i] = (accumulate ? out[i] : 0) + sum_k in[k][i], in compute_t<T>.
template <typename T>
__global__ void add_n_kernel(device_t<T>* out, InputPointers<T> in, int count, bool accumulate, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    compute_t<T> sum = accumulate ? to_compute<T>(out[i]) : compute_t<T>(0);
    for (int k = 0; k < count; ++k) sum += to_compute<T>(in.p[k][i]);
    out[i] = from_compute<T>(sum);
  }
}

}  // namespace

void CudaBackend::add_n(const Tensor& out, const std::vector<Tensor>& inputs) {
  const int64_t n = out.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_for(out);
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535);
  visit_numeric_dtype(out.dtype(), "add_n", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto* o = static_cast<device_t<T>*>(out.data_ptr());
    for (size_t first = 0; first < inputs.size(); first += kMaxInputs) {
      InputPointers<T> ptrs{};
      const int count = static_cast<int>(std::min<size_t>(kMaxInputs, inputs.size() - first));
      for (int k = 0; k < count; ++k) {
        ptrs.p[k] = static_cast<const device_t<T>*>(inputs[first + static_cast<size_t>(k)].data_ptr());
      }
      add_n_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(o, ptrs, count, first > 0, n);
      KILN_CUDA_CHECK_LAUNCH("add_n");
    }
  });
}

}  // namespace kiln::cuda
