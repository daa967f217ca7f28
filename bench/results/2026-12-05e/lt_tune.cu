// Experiment: cuBLASLt heuristic #0 vs the best of the top-N heuristic algorithms, timed, for BERT shapes.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    auto s_ = (x);                                                             \
    if ((int)s_ != 0) {                                                        \
      std::printf("error %d at %s:%d %s\n", (int)s_, __FILE__, __LINE__, #x); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

__global__ void fill_bytes(unsigned char* p, size_t n, unsigned seed, int kind) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = (unsigned char)(h & 0x7e);  // small positive/negative-ish fp8 codes, never NaN
    if (kind == 1) p[i] = (unsigned char)((h & 0x3f) | ((h >> 8) & 0x80));  // bf16 bytes: mixed
  }
}

struct Case {
  const char* name;
  bool fp8;
  int m, n, k;     // D (m, n) row-major
  int layout;      // 0 TN fwd (A (m,k), B (n,k)), 1 NN dX (A (m,k) k-contig, B (k,n) n-contig), 2 NT dW (A (k,m), B (k,n))
  cudaDataType_t out;
  bool bias;
  bool fast;
  float beta;
};

int main() {
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  size_t ws_bytes = 32u << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  const int M = 16384;
  std::vector<Case> cases = {
      {"fp8 qkv fwd", true, M, 2304, 768, 0, CUDA_R_16BF, true, true, 0},
      {"fp8 attn-out fwd", true, M, 768, 768, 0, CUDA_R_16BF, true, true, 0},
      {"fp8 fc1 fwd", true, M, 3072, 768, 0, CUDA_R_16BF, true, true, 0},
      {"fp8 fc2 fwd", true, M, 768, 3072, 0, CUDA_R_16BF, true, true, 0},
      {"fp8 fc2 dX (bf16)", true, M, 3072, 768, 0, CUDA_R_16BF, false, false, 0},
      {"fp8 fc1 dX (f32 acc)", true, M, 768, 3072, 0, CUDA_R_32F, false, false, 1},
      {"fp8 qkv dX (f32 acc)", true, M, 768, 2304, 0, CUDA_R_32F, false, false, 1},
      {"fp8 attn-out dX (bf16)", true, M, 768, 768, 0, CUDA_R_16BF, false, false, 0},
      {"fp8 qkv dW (f32)", true, 2304, 768, M, 0, CUDA_R_32F, false, false, 0},
      {"fp8 attn-out dW (f32)", true, 768, 768, M, 0, CUDA_R_32F, false, false, 0},
      {"fp8 fc1 dW (f32)", true, 3072, 768, M, 0, CUDA_R_32F, false, false, 0},
      {"fp8 fc2 dW (f32)", true, 768, 3072, M, 0, CUDA_R_32F, false, false, 0},
      {"bf16 qkv fwd", false, M, 2304, 768, 0, CUDA_R_16BF, true, false, 0},
      {"bf16 attn-out fwd", false, M, 768, 768, 0, CUDA_R_16BF, true, false, 0},
      {"bf16 fc1 fwd", false, M, 3072, 768, 0, CUDA_R_16BF, true, false, 0},
      {"bf16 fc2 fwd", false, M, 768, 3072, 0, CUDA_R_16BF, true, false, 0},
      {"bf16 fc2 dX", false, M, 3072, 768, 1, CUDA_R_16BF, false, false, 0},
      {"bf16 fc1 dX", false, M, 768, 3072, 1, CUDA_R_16BF, false, false, 0},
      {"bf16 qkv dX", false, M, 768, 2304, 1, CUDA_R_16BF, false, false, 0},
      {"bf16 fc1 dW (f32)", false, 3072, 768, M, 2, CUDA_R_32F, false, false, 0},
      {"bf16 fc2 dW (f32)", false, 768, 3072, M, 2, CUDA_R_32F, false, false, 0},
      {"bf16 qkv dW (f32)", false, 2304, 768, M, 2, CUDA_R_32F, false, false, 0},
      {"bf16 lmhead fwd", false, M, 30528, 768, 0, CUDA_R_16BF, true, false, 0},
      {"bf16 lmhead dX", false, M, 768, 30528, 1, CUDA_R_16BF, false, false, 0},
      {"bf16 lmhead dW (f32)", false, 30528, 768, M, 2, CUDA_R_32F, false, false, 0},
  };
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float one = 1.0f;
  float* scale;
  CK(cudaMalloc(&scale, 64));
  CK(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));
  for (const Case& c : cases) {
    const size_t esz = c.fp8 ? 1 : 2;
    const size_t osz = c.out == CUDA_R_32F ? 4 : 2;
    void *a, *b, *d, *bias;
    CK(cudaMalloc(&a, (size_t)c.m * c.k * esz));
    CK(cudaMalloc(&b, (size_t)c.n * c.k * esz));
    CK(cudaMalloc(&d, (size_t)c.m * c.n * osz));
    CK(cudaMalloc(&bias, (size_t)c.n * 4));
    CK(cudaMemset(d, 0, (size_t)c.m * c.n * osz));
    CK(cudaMemset(bias, 0, (size_t)c.n * 4));
    fill_bytes<<<1024, 256>>>((unsigned char*)a, (size_t)c.m * c.k * esz, 1, c.fp8 ? 0 : 1);
    fill_bytes<<<1024, 256>>>((unsigned char*)b, (size_t)c.n * c.k * esz, 2, c.fp8 ? 0 : 1);
    cudaDataType_t in_t = c.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    cublasLtMatmulDesc_t op;
    CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // column-major: D^T (n x m) = A' op B'
    cublasOperation_t ta, tb;
    cublasLtMatrixLayout_t la, lb, lc;
    if (c.layout == 0) {  // A' = B buffer (k x n, ld k) op T; B' = A buffer (k x m, ld k) op N
      ta = CUBLAS_OP_T;
      tb = CUBLAS_OP_N;
      CK(cublasLtMatrixLayoutCreate(&la, in_t, c.k, c.n, c.k));
      CK(cublasLtMatrixLayoutCreate(&lb, in_t, c.k, c.m, c.k));
    } else if (c.layout == 1) {  // A' = B buffer (n x k col-major ld n) op N; B' = A buffer (k x m ld k) op N
      ta = CUBLAS_OP_N;
      tb = CUBLAS_OP_N;
      CK(cublasLtMatrixLayoutCreate(&la, in_t, c.n, c.k, c.n));
      CK(cublasLtMatrixLayoutCreate(&lb, in_t, c.k, c.m, c.k));
    } else {  // A' = B buffer (n x k, ld n) op N; B' = A buffer (m x k col-major, ld m) op T
      ta = CUBLAS_OP_N;
      tb = CUBLAS_OP_T;
      CK(cublasLtMatrixLayoutCreate(&la, in_t, c.n, c.k, c.n));
      CK(cublasLtMatrixLayoutCreate(&lb, in_t, c.m, c.k, c.m));
    }
    CK(cublasLtMatrixLayoutCreate(&lc, c.out, c.n, c.m, c.n));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (c.fp8) {
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof scale));
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale, sizeof scale));
      int8_t fa = c.fast ? 1 : 0;
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
    }
    if (c.bias) {
      cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
      int32_t bt = CUDA_R_16BF;
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                            sizeof ws_bytes));
    const int want = 16;
    cublasLtMatmulHeuristicResult_t res[want];
    int got = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, want, res, &got));
    float beta = c.beta;
    std::vector<float> times;
    for (int i = 0; i < got; ++i) {
      auto run = [&]() {
        return cublasLtMatmul(lt, op, &one, b, la, a, lb, &beta, d, lc, d, lc, &res[i].algo, ws, ws_bytes, 0);
      };
      if (run() != CUBLAS_STATUS_SUCCESS) {
        times.push_back(1e9);
        continue;
      }
      for (int w = 0; w < 3; ++w) run();
      std::vector<float> t;
      for (int r = 0; r < 7; ++r) {
        CK(cudaEventRecord(e0));
        for (int q = 0; q < 10; ++q) run();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms / 10);
      }
      std::sort(t.begin(), t.end());
      times.push_back(t[3]);
    }
    int best = (int)(std::min_element(times.begin(), times.end()) - times.begin());
    double flop = 2.0 * c.m * c.n * c.k;
    std::printf("%-24s m=%5d n=%5d k=%5d  algos=%2d  h0 %.4f ms (%.0f TF/s)  best #%d %.4f ms (%.0f TF/s)  gain %.3fx\n",
                c.name, c.m, c.n, c.k, got, times[0], flop / times[0] / 1e9, best, times[best],
                flop / times[best] / 1e9, times[0] / times[best]);
    std::fflush(stdout);
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
    cudaFree(bias);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
  }
  return 0;
}
