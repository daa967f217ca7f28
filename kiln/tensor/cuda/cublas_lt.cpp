// Choosing a cuBLASLt algorithm (cublas_lt.h): the heuristic's candidates, and timing them.
#include "kiln/tensor/cuda/cublas_lt.h"

#include <algorithm>
#include <atomic>
#include <cmath>  // INFINITY

#include "kiln/tensor/cuda.h"  // set_matmul_tuning
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/determinism.h"
#include "kiln/tensor/env_vars.h"

namespace kiln::cuda {

namespace {
// On unless the environment turns it off (KILN_MATMUL_TUNING=0, as PyTorch's PYTORCH_TUNABLEOP_ENABLED switches
// TunableOp).
std::atomic<bool> g_matmul_tuning{env_flag("KILN_MATMUL_TUNING", true)};
std::atomic<int64_t> g_problems_timed{0};
}  // namespace

void set_matmul_tuning(bool enabled) { g_matmul_tuning.store(enabled, std::memory_order_relaxed); }
bool matmul_tuning() { return g_matmul_tuning.load(std::memory_order_relaxed); }
int64_t matmul_problems_timed() { return g_problems_timed.load(std::memory_order_relaxed); }

namespace lt {

bool heuristic_only() { return !matmul_tuning() || kiln::deterministic(); }

namespace {
// Whether a product of m x n x k (times batches) multiply-adds is worth timing (choose_algo: at least 2^31).
bool worth_tuning(int64_t m, int64_t n, int64_t k, int64_t batches) {
  const double multiply_adds =
      static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(batches);
  return multiply_adds >= 2147483648.0;
}

// Whether a product queued on `stream` may time its candidates now (choose_algo).
bool may_tune(cudaStream_t stream) {
  if (heuristic_only()) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // e.g. the legacy stream while another thread captures: do not time
    return false;
  }
  return status == cudaStreamCaptureStatusNone;
}

using PreferenceDesc = Desc<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// How many of the heuristic's algorithms a timed problem tries.
constexpr int kTuneCandidates = 8;

// Up to `count` of the heuristic's algorithms for the problem, its first choice first; empty when it has none.
std::vector<cublasLtMatmulAlgo_t> heuristic_algos(cublasLtHandle_t handle, const LtProblem& p, int count,
                                                  const char* op_name) {
  PreferenceDesc pref;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.d), op_name);
  const auto set = [&](cublasLtMatmulPreferenceAttributes_t attribute, const auto& value) {
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.d, attribute, &value, sizeof value), op_name);
  };
  set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceBytes);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(p.align_a));
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(p.align_b));
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(p.align_c));
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(p.align_c));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(count, 1)));
  int returned = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref.d, count, results.data(), &returned);
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (status != CUBLAS_STATUS_SUCCESS) return algos;
  for (int i = 0; i < returned; ++i) {
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS) {
      algos.push_back(results[static_cast<size_t>(i)].algo);
    }
  }
  return algos;
}

// Events for timing, destroyed on every way out.
struct TimingEvents {
  cudaEvent_t start = nullptr, stop = nullptr;
  TimingEvents() {
    KILN_CUDA_CHECK(cudaEventCreate(&start), "matmul tuning");
    KILN_CUDA_CHECK(cudaEventCreate(&stop), "matmul tuning");
  }
  ~TimingEvents() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  TimingEvents(const TimingEvents&) = delete;
  TimingEvents& operator=(const TimingEvents&) = delete;
};

// The index of the algorithm to keep among `algos` (the heuristic's order), timed as choose_algo says.
size_t fastest_algo(const std::vector<cublasLtMatmulAlgo_t>& algos, cudaStream_t stream, const RunWith& run) {
  if (algos.size() < 2) return 0;
  g_problems_timed.fetch_add(1, std::memory_order_relaxed);
  constexpr int kRounds = 3, kRunsPerRound = 3;
  std::vector<bool> ok(algos.size(), true);
  // A first run of each: it loads the kernel's module and shows which candidates cannot run this problem.
  for (size_t i = 0; i < algos.size(); ++i) ok[i] = run(algos[i]) == CUBLAS_STATUS_SUCCESS;
  TimingEvents ev;
  std::vector<float> best(algos.size(), INFINITY);
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < algos.size(); ++i) {
      if (!ok[i]) continue;
      KILN_CUDA_CHECK(cudaEventRecord(ev.start, stream), "matmul tuning");
      for (int r = 0; r < kRunsPerRound && ok[i]; ++r) ok[i] = run(algos[i]) == CUBLAS_STATUS_SUCCESS;
      KILN_CUDA_CHECK(cudaEventRecord(ev.stop, stream), "matmul tuning");
      KILN_CUDA_CHECK(cudaEventSynchronize(ev.stop), "matmul tuning");
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop), "matmul tuning");
      if (ok[i]) best[i] = std::min(best[i], ms);
    }
  }
  size_t fastest = 0;
  for (size_t i = 1; i < algos.size(); ++i) {
    if (ok[i] && (!ok[fastest] || best[i] < best[fastest])) fastest = i;
  }
  if (!ok[fastest]) return 0;
  // The heuristic's choice stays unless the fastest beats it by more than 2%.
  return ok[0] && best[fastest] >= 0.98f * best[0] ? 0 : fastest;
}
}  // namespace

AlgoChoice choose_algo(cublasLtHandle_t handle, const LtProblem& problem, const std::optional<AlgoChoice>& cached,
                       cudaStream_t stream, const RunWith& run, const char* op_name, bool* fresh) {
  // A large problem is timed once (cuda::set_matmul_tuning), in the first eager call that may time it.
  const bool tune = (!cached || (cached->ok && !cached->tuned)) &&
                    worth_tuning(problem.m, problem.n, problem.k, problem.batches) && may_tune(stream);
  *fresh = !cached || tune;
  if (!*fresh) return *cached;
  const std::vector<cublasLtMatmulAlgo_t> algos = heuristic_algos(handle, problem, tune ? kTuneCandidates : 1, op_name);
  AlgoChoice choice;
  choice.ok = !algos.empty();
  if (!choice.ok) return choice;
  choice.tuned = tune;
  choice.algo = algos[tune ? fastest_algo(algos, stream, run) : 0];
  return choice;
}

}  // namespace lt
}  // namespace kiln::cuda
