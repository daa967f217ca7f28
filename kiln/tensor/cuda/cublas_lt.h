// kiln/tensor/cuda/cublas_lt.h — what kiln's cuBLASLt products share (backend-internal): the per-device handles, the
// per-(device, stream) workspaces, RAII holders for the descriptors, and the choice of an algorithm (the heuristic's
// first, or the fastest of its first few, timed: cuda::set_matmul_tuning). matmul.cpp (every float product) and
// fp8_gemm.cpp (the FP8 products) use them.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>  // cudaStream_t

#include <cstdint>
#include <functional>
#include <vector>

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

// ---- choosing an algorithm ----
// How many of the heuristic's algorithms a tuned problem times.
inline constexpr int kTuneCandidates = 8;

// Whether a product of m x n x k (times batches) multiply-adds is worth timing: at least 2^31 of them (about 4 GFLOP,
// a few microseconds on a Hopper GPU), so that the one-off cost of timing (about 80 runs of the product) is repaid
// within a few hundred steps and the many small products of a model are left to the heuristic.
bool worth_tuning(int64_t m, int64_t n, int64_t k, int64_t batches);

// Whether every product keeps the heuristic's choice: tuning is off or kiln is in deterministic mode. The algorithm
// caches key on it, so that a product chosen by timing is not reused after either switch changes.
bool heuristic_only();

// Whether a product queued on `stream` may time its candidates now: tuning is on (cuda::matmul_tuning()), kiln is
// not in deterministic mode (another process could time differently and pick an algorithm that rounds differently),
// and `stream` is not capturing a CUDA graph (timing waits on the host).
bool may_tune(cudaStream_t stream);

// Up to `count` of the heuristic's algorithms for the problem (C and D share c_layout), its first choice first; empty
// when it has none.
std::vector<cublasLtMatmulAlgo_t> heuristic_algos(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                                  cublasLtMatrixLayout_t a_layout, cublasLtMatrixLayout_t b_layout,
                                                  cublasLtMatrixLayout_t c_layout, cublasLtMatmulPreference_t pref,
                                                  int count);

// The index of the algorithm to keep among `algos` (the heuristic's order): each is run through `run` (which queues
// the product with that algorithm on `stream` and returns cuBLASLt's status) once to warm up, then timed in 3 rounds
// of 3 runs, the candidates interleaved; each keeps its fastest round. The first is kept unless another was faster by
// more than 2% (timing noise must not swap algorithms that are level); one whose run failed is never chosen (where all
// failed: 0). The host waits for `stream`. Whatever `run` writes must be written again by the product that follows.
size_t fastest_algo(const std::vector<cublasLtMatmulAlgo_t>& algos, cudaStream_t stream,
                    const std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&)>& run);

}  // namespace kiln::cuda::lt
