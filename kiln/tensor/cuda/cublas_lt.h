// kiln/tensor/cuda/cublas_lt.h — what kiln's cuBLASLt products share (backend-internal): the per-device handles, the
// per-(device, stream) workspaces, RAII holders for the descriptors, and the choice of an algorithm (the heuristic's
// first, or the fastest of its first few, timed: cuda::set_matmul_tuning) with the cache that keeps it. matmul.cpp
// (every float product) and fp8_gemm.cpp (the FP8 products) use them.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>  // cudaStream_t

#include <array>
#include <cstdint>
#include <functional>  // std::function, std::cref
#include <map>
#include <mutex>
#include <optional>

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

// ---- choosing an algorithm ----
// Whether every product keeps the heuristic's choice: tuning is off or kiln is in deterministic mode. The algorithm
// caches key on it, so that a product chosen by timing is not reused after either switch changes.
bool heuristic_only();

// The algorithm a problem runs with, as an algorithm cache keeps it.
struct AlgoChoice {
  bool ok = false;     // false: cuBLASLt has no algorithm for this problem (the caller falls back or refuses)
  bool tuned = false;  // chosen by timing the heuristic's candidates, not by the heuristic alone
  cublasLtMatmulAlgo_t algo{};
};

// One product as choose_algo sees it: its descriptors (C and D share `c`), how aligned the pointers of A, B and C/D
// are (pointer_alignment: views may start anywhere, and the heuristic otherwise assumes 256 bytes), and its size,
// m x n x k multiply-adds per batch.
struct LtProblem {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  int64_t align_a, align_b, align_c;
  int64_t m, n, k, batches;
};

// Queues the product with `algo` on the problem's stream and returns cuBLASLt's status. choose_algo calls it only to
// time candidates, so it may write scratch memory instead of D (it must, where the product reads C == D); whatever
// it writes to D is written again by the product that follows.
using RunWith = std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&)>;

// The algorithm for `problem`, from `cached` (what the caller's cache holds for it; nullopt where nothing) or chosen
// now, with `fresh` set where it was chosen now (the caller stores it). A problem is chosen when it is not cached, or
// when it was cached untimed and may be timed now: it has at least 2^31 multiply-adds (about 4 GFLOP, a few
// microseconds on a Hopper GPU, so that timing's one-off cost of about 80 runs is repaid within a few hundred steps
// and a model's many small products are left to the heuristic), tuning is on (cuda::matmul_tuning()), kiln is not in
// deterministic mode (another process could time differently and pick an algorithm that rounds differently), and
// `stream` is not capturing a CUDA graph (timing waits on the host). Choosing asks the heuristic (a workspace
// of kWorkspaceBytes); where timing applies, its first 8 algorithms are each run through `run` (a warm-up, then 3
// interleaved rounds of 3 runs, each keeping its fastest round; the host waits for `stream`) and the fastest is kept
// unless the heuristic's own is within 2% (noise must not swap algorithms that are level); a candidate whose run fails
// is never kept. `op_name` names the caller in errors.
AlgoChoice choose_algo(cublasLtHandle_t handle, const LtProblem& problem, const std::optional<AlgoChoice>& cached,
                       cudaStream_t stream, const RunWith& run, const char* op_name, bool* fresh);

// A process-wide cache of choices, keyed by everything that decides a problem's algorithm (an array of N integers:
// device, types, shape, layouts, alignments, epilogue, heuristic_only()). Thread-safe; never destroyed (products may
// run during static destruction).
template <size_t N>
class AlgoCache {
 public:
  using Key = std::array<int64_t, N>;
  // The algorithm for `problem` under `key`: cached, or chosen now (choose_algo, timing through `run`, a callable as
  // RunWith describes) and stored. `run` is passed on by reference, so that a cached call copies nothing.
  template <typename Run>
  AlgoChoice get(const Key& key, cublasLtHandle_t handle, const LtProblem& problem, cudaStream_t stream, const Run& run,
                 const char* op_name) {
    std::optional<AlgoChoice> cached;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = map_.find(key);
      if (it != map_.end()) cached = it->second;
    }
    bool fresh = false;
    const AlgoChoice choice = choose_algo(handle, problem, cached, stream, RunWith(std::cref(run)), op_name, &fresh);
    if (fresh) {
      std::lock_guard<std::mutex> lock(mutex_);
      map_[key] = choice;
    }
    return choice;
  }
  // Marks `key` as having no cuBLASLt algorithm (its chosen one was refused at launch).
  void mark_unsupported(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    map_[key].ok = false;
  }

 private:
  std::mutex mutex_;
  std::map<Key, AlgoChoice> map_;
};

}  // namespace kiln::cuda::lt
