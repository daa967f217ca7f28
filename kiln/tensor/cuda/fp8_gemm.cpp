// CUDA: the FP8 matrix product (fp8_ops.h) through cuBLASLt.
//
// kiln's out (M, N) = a (M, K) @ b (N, K)^T, all row-major, is cuBLAS's column-major D (N x M) = op(A) op(B) with
// A = kiln's b stored as a K x N column-major matrix (ld K) taken transposed, and B = kiln's a stored as K x M (ld K)
// taken as it is: the "TN" layout that cuBLASLt's FP8 kernels require. So cuBLAS's A scale is b's and its B scale
// is a's; both are device pointers (CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER), read by the kernel, so nothing waits
// for the host. FP8 kernels need compute type 32F, scale type 32F, 16-byte aligned pointers and leading dims (K,
// N multiples of 16: checked by the frontend). CUBLASLT_MATMUL_DESC_FAST_ACCUM is 0 unless asked: the tensor cores'
// partial sums are then promoted to float32 periodically rather than kept in their narrower accumulator for the
// whole of K.
//
// The bias epilogue (CUBLASLT_EPILOGUE_BIAS) takes a bias of D's type for 16-bit outputs; for a float32 output
// cuBLASLt's FP8 kernels want a bfloat16 bias, which would round kiln's float32 one, so there the bias is added by
// a second kernel on the same stream. The algorithm for each problem is the heuristic's first choice, or for a large
// problem the fastest of its first few, timed (cuda::set_matmul_tuning), cached; the
// handle and the per-stream workspace are matmul.cpp's (cublas_lt.h).
#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "kiln/tensor/cuda/cublas_lt.h"
#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/ops/fp8_kernels.h"

namespace kiln::cuda {
namespace {

constexpr const char* kOp = "fp8_gemm";

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::Float8_e4m3fn: return CUDA_R_8F_E4M3;
    case DType::Float8_e5m2: return CUDA_R_8F_E5M2;
    case DType::BFloat16: return CUDA_R_16BF;
    case DType::Float16: return CUDA_R_16F;
    case DType::Float32: return CUDA_R_32F;
    default: break;
  }
  KILN_FAIL("cuda::fp8_gemm: unexpected dtype ", t);
}

// FP8 tensor cores arrived with compute capability 8.9 (Ada) and 9.0 (Hopper). Asked once per device.
void check_fp8_capable(int device) {
  static std::mutex mutex;
  static std::map<int, std::pair<int, int>> capability;
  std::pair<int, int> cc;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = capability.find(device);
    if (it == capability.end()) {
      int major = 0, minor = 0;
      KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), kOp);
      KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), kOp);
      it = capability.emplace(device, std::make_pair(major, minor)).first;
    }
    cc = it->second;
  }
  KILN_CHECK_AS(NotImplementedError, cc.first * 10 + cc.second >= 89, kOp, ": FP8 matrix products need a GPU of ",
                "compute capability 8.9 or newer (sm_89+: Ada or Hopper), but cuda:", device, " is sm_", cc.first,
                cc.second, "; compute this layer in bfloat16 instead (leave FP8 off on this GPU)");
}

// t itself when its data is 16-byte aligned (what FP8 kernels need), else a fresh contiguous copy (which is).
Tensor aligned16(const Tensor& t) {
  if (lt::pointer_alignment(t.data_ptr()) >= 16) return t;
  return internal::clone(t);
}

using AlgoCache = lt::AlgoCache<14>;
using AlgoKey = AlgoCache::Key;
AlgoCache& algo_cache() {
  static auto* cache = new AlgoCache();  // never destroyed (used during static destruction)
  return *cache;
}

void set_desc(lt::MatmulDesc& desc, cublasLtMatmulDescAttributes_t attribute, const void* value, size_t size) {
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.d, attribute, value, size), kOp);
}

}  // namespace

void fp8_gemm(const Tensor& out, const Tensor& a_in, const Tensor& b_in, const Tensor& a_scale_inv,
              const Tensor& b_scale_inv, const Tensor& bias_in, bool accumulate, bool fast_accumulation) {
  const int device = out.device().index();
  check_fp8_capable(device);
  cudaStream_t stream = stream_for(out);
  KILN_CHECK(lt::pointer_alignment(out.data_ptr()) >= 16, kOp, ": the output (accumulate_into) must start at a ",
             "16-byte aligned address for FP8 kernels; its view starts at element offset ", out.offset(),
             "; accumulate into a tensor of its own (or a view at a multiple of 16 bytes)");
  const Tensor a = aligned16(a_in), b = aligned16(b_in);
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  // 16-bit outputs take the bias in the epilogue; float32 outputs get it from add_ below.
  const bool epilogue_bias = bias_in.defined() && out.dtype() != DType::Float32;
  const Tensor bias = epilogue_bias ? aligned16(bias_in) : Tensor();

  const cudaDataType_t ta = cuda_type(b.dtype()), tb = cuda_type(a.dtype()), tc = cuda_type(out.dtype());
  lt::MatmulDesc op;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op.d, CUBLAS_COMPUTE_32F, CUDA_R_32F), kOp);
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  set_desc(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a);
  set_desc(op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b);
  // The scales as cuBLASLt reads them: its FP8 kernels refuse (CUBLAS_STATUS_NOT_SUPPORTED at launch) a scale
  // pointer that is not 16-byte aligned, as an element of a scaling state's (N,) scale_inv is, so such a scale is
  // copied into a fresh allocation first (a device copy: no host sync, fine under capture).
  const Tensor a_scale_t = aligned16(a_scale_inv), b_scale_t = aligned16(b_scale_inv);
  const void* a_scale = b_scale_t.data_ptr();  // cuBLAS's A is kiln's b
  const void* b_scale = a_scale_t.data_ptr();
  set_desc(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof a_scale);
  set_desc(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof b_scale);
  const int8_t fast_accum = fast_accumulation ? 1 : 0;
  set_desc(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum);
  const cublasLtEpilogue_t epilogue = epilogue_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (epilogue_bias) {
    const void* bias_ptr = bias.data_ptr();
    const int32_t bias_type = tc;  // D's type: bfloat16 or half
    set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof bias_ptr);
    set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
  }
  lt::LayoutDesc a_layout, b_layout, c_layout;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout.d, ta, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k),
                    kOp);
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_layout.d, tb, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k),
                    kOp);
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_layout.d, tc, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n),
                    kOp);

  const AlgoKey key = {device,
                       static_cast<int64_t>(ta),
                       static_cast<int64_t>(tb),
                       static_cast<int64_t>(tc),
                       m,
                       n,
                       k,
                       static_cast<int64_t>(epilogue),
                       lt::pointer_alignment(a.data_ptr()),
                       lt::pointer_alignment(b.data_ptr()),
                       lt::pointer_alignment(out.data_ptr()),
                       epilogue_bias ? lt::pointer_alignment(bias.data_ptr()) : 0,
                       fast_accumulation ? 1 : 0,
                       lt::heuristic_only() ? 1 : 0};
  cublasLtHandle_t handle = lt::handle(device);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // Timing runs without accumulation write `out`, which the product below writes again; with it they would read
  // `out`, and run on a scratch tensor of its shape instead.
  Tensor scratch;
  const auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    if (accumulate && !scratch.defined())
      scratch = internal::empty(out.shape(), {.dtype = out.dtype(), .device = out.device()});
    void* target = accumulate ? scratch.data_ptr() : out.data_ptr();
    return cublasLtMatmul(handle, op.d, &alpha, b.data_ptr(), a_layout.d, a.data_ptr(), b_layout.d, &beta, target,
                          c_layout.d, target, c_layout.d, &algo, lt::workspace(device, stream), lt::kWorkspaceBytes,
                          stream);
  };
  // cuBLAS's A is kiln's b: their alignments swap.
  const lt::LtProblem problem{op.d, a_layout.d, b_layout.d, c_layout.d, key[9], key[8], key[10], n, m, k, 1};
  const lt::AlgoChoice entry = algo_cache().get(key, handle, problem, stream, run, kOp);
  KILN_CHECK_AS(NotImplementedError, entry.ok, kOp, ": cuBLASLt has no FP8 kernel for a ", a.dtype(), " (", m, ", ", k,
                ") x ", b.dtype(), " (", n, ", ", k, ")^T product into ", out.dtype(),
                epilogue_bias ? " with a bias" : "", " on this GPU; compute it in bfloat16 instead");
  KILN_CUBLAS_CHECK(cublasLtMatmul(handle, op.d, &alpha, b.data_ptr(), a_layout.d, a.data_ptr(), b_layout.d, &beta,
                                   out.data_ptr(), c_layout.d, out.data_ptr(), c_layout.d, &entry.algo,
                                   lt::workspace(device, stream), lt::kWorkspaceBytes, stream),
                    kOp);
  if (bias_in.defined() && !epilogue_bias) {
    Tensor target = out;
    internal::add_(target, internal::reshape(bias_in, {1, n}));
  }
}

}  // namespace kiln::cuda
