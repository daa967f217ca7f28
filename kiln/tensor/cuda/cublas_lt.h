// kiln/tensor/cuda/cublas_lt.h — what kiln's cuBLASLt products share (backend-internal): the per-device handles, the
// per-(device, stream) workspaces and RAII holders for the descriptors. matmul.cpp (every float product) and
// fp8_gemm.cpp (the FP8 products) use them.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>  // cudaStream_t

#include <cstdint>

namespace kiln::cuda::lt {

// The workspace every product may use: one kiln tensor of this many bytes per (device, stream), from the caching
// allocator. Products queued on one stream run one after another, so they share it; two streams never do.
inline constexpr uint64_t kWorkspaceBytes = uint64_t{32} << 20;

cublasLtHandle_t handle(int device);               // made on first use, never destroyed
void* workspace(int device, cudaStream_t stream);  // kWorkspaceBytes bytes

// The largest power of two (<= 256) that divides the address: what cuBLASLt's heuristic is told of an operand.
inline int64_t pointer_alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  const uintptr_t low = v & (~v + 1);  // the lowest set bit
  return static_cast<int64_t>(low == 0 || low > 256 ? 256 : low);
}

// RAII holders for the cuBLASLt descriptors of one call: d, destroyed with Destroy when set.
template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
struct Desc {
  Handle d = nullptr;
  Desc() = default;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (d) Destroy(d);
  }
};
using MatmulDesc = Desc<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LayoutDesc = Desc<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using PreferenceDesc = Desc<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

}  // namespace kiln::cuda::lt
