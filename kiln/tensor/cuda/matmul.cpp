// CUDA backend: batched matrix multiply through cuBLASLt (cuBLAS as the fallback).
//
// kiln's tensors are row-major; cuBLAS is column-major. A row-major (M, N) matrix is, read as
// column-major, its transpose (N, M), so out = a @ b is computed as out^T = b^T a^T: cuBLAS's "A" is
// kiln's b and cuBLAS's "B" is kiln's a, with m' = N, n' = M, k' = K. Each operand is either row-major
// (column stride 1: read as column-major it already is the transpose cuBLAS wants, op N) or column-major
// (row stride 1: op T); anything else (a zero row stride from expand(), say) is copied first.
//
// The algorithm for each (shape, dtypes, layouts, alignments) is chosen once and cached: cuBLASLt's heuristic's
// first choice, or for a large problem the fastest of its first few, timed (lt::choose_algo, cuda::set_matmul_tuning);
// the workspace is one 32 MiB kiln tensor per (device, stream) from the caching allocator.
// Where cuBLASLt offers no algorithm, cublasGemmStridedBatchedEx (or a loop of cublasGemmEx when a
// batch stride is 0) does the product.
//
// Determinism (../determinism.h): for a fixed problem on one GPU model and cuBLAS version the products are
// bitwise reproducible: in deterministic mode the algorithm is the heuristic's first choice (a pure function of
// the problem and the fixed workspace size) cached for the process (timing could choose another in another
// process), each stream has its own workspace (also
// for the cuBLAS fallback, so concurrent streams never share one), atomics mode stays at cuBLAS's default
// CUBLAS_ATOMICS_NOT_ALLOWED, and the split-K reductions cuBLASLt may choose sum the parts in a fixed order.
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kiln/tensor/cuda.h"
#include "kiln/tensor/cuda/cublas_lt.h"  // handles, workspaces, descriptors (shared with fp8_gemm.cpp)
#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::cuda {

namespace {
std::atomic<bool> g_allow_tf32{true};
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

namespace {

using lt::kWorkspaceBytes;

// One operand as cuBLAS sees it: op(X) is the (cols of kiln's matrix) x (rows of kiln's matrix)
// transpose of kiln's matrix. `trans` says whether the stored column-major matrix must be transposed.
struct CublasOperand {
  const void* ptr = nullptr;
  bool trans = false;
  int64_t rows = 0, cols = 0, ld = 0;  // of the stored column-major matrix
  int64_t batch_stride = 0;            // in elements
  Tensor keep;                         // a copy made here, kept alive until the product is queued
};

// t is (B, R, C) on the GPU. Returns the cuBLAS description of t^T (C x R), copying t when its matrix
// dims are neither row- nor column-major with a valid leading dimension.
CublasOperand describe(const Tensor& t) {
  const int64_t rows = t.size(1), cols = t.size(2);
  const int64_t rs = t.stride(1), cs = t.stride(2);
  CublasOperand op;
  op.batch_stride = t.size(0) == 1 ? 0 : t.stride(0);
  // Whether t is stored column-major as an inner x outer matrix: its dim of `inner` elements has stride 1 (or one
  // element), and the other, of `outer` elements, a valid leading dim (or one element). Fills op if so.
  const auto stored_as = [&](bool trans, int64_t inner, int64_t inner_stride, int64_t outer, int64_t outer_stride) {
    if ((inner_stride != 1 && inner != 1) || (outer != 1 && outer_stride < std::max<int64_t>(inner, 1))) return false;
    op.ptr = t.data_ptr();
    op.trans = trans;
    op.rows = inner;
    op.cols = outer;
    op.ld = outer == 1 ? std::max<int64_t>(inner, 1) : outer_stride;
    return true;
  };
  // Row-major R x C with leading dim rs: stored column-major it is C x R, op N. Column-major R x C with leading dim
  // cs: stored column-major it is R x C, op T.
  if (stored_as(false, cols, cs, rows, rs) || stored_as(true, rows, rs, cols, cs)) return op;
  // A zero or overlapping stride (e.g. one row expanded over M rows): copy to row-major. A broadcast
  // batch (stride 0) stays one matrix.
  Tensor copy = (t.size(0) == 1 || t.stride(0) == 0) ? internal::contiguous(internal::narrow(t, 0, 0, 1))
                                                     : internal::contiguous(t);
  op.keep = copy;
  op.ptr = copy.data_ptr();
  op.trans = false;
  op.rows = cols;
  op.cols = rows;
  op.ld = std::max<int64_t>(cols, 1);
  op.batch_stride = (t.size(0) == 1 || t.stride(0) == 0) ? 0 : rows * cols;
  return op;
}

using lt::pointer_alignment;

struct Types {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

Types types_for(DType dtype) {
  switch (dtype) {
    case DType::Float16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::BFloat16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::Float32:
      return {CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::Float64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    default: break;
  }
  throw NotImplementedError(
      kiln::detail::str_cat("matmul: integer matmul is not supported on CUDA; convert to float "
                            "with .to(DType::Float32) first (got ",
                            dtype, ")"));
}

// ---- per-device handles and per-stream workspaces (never destroyed: they may be used during static
// destruction, and the driver reclaims everything at exit) ----
std::mutex g_mutex;

// The handle of `device` in `handles`, made with create(&handle) on first use; the caller holds the map's mutex.
template <typename Handle>
Handle device_handle(std::map<int, Handle>& handles, int device, cublasStatus_t (*create)(Handle*)) {
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  Handle h = nullptr;
  KILN_CUBLAS_CHECK(create(&h), "matmul");
  handles.emplace(device, h);
  return h;
}

cublasLtHandle_t lt_handle(int device) {
  static auto* handles = new std::map<int, cublasLtHandle_t>();
  std::lock_guard<std::mutex> lock(g_mutex);
  return device_handle(*handles, device, cublasLtCreate);
}

// The cuBLAS (non-Lt) handle of a device; callers hold g_cublas_mutex while they set its stream and use it.
std::mutex g_cublas_mutex;
cublasHandle_t cublas_handle(int device) {
  static auto* handles = new std::map<int, cublasHandle_t>();
  return device_handle(*handles, device, cublasCreate);
}

// One workspace per (device, stream): products queued on one stream run one after another, so they can
// share it; two streams must not.
void* workspace(int device, cudaStream_t stream) {
  static auto* spaces = new std::map<std::pair<int, cudaStream_t>, Tensor>();
  std::lock_guard<std::mutex> lock(g_mutex);
  auto key = std::make_pair(device, stream);
  auto it = spaces->find(key);
  if (it == spaces->end()) {
    Tensor ws = internal::empty({static_cast<int64_t>(kWorkspaceBytes)},
                                {.dtype = DType::UInt8, .device = Device::cuda(device)});
    it = spaces->emplace(key, std::move(ws)).first;
  }
  return it->second.data_ptr();
}

// ---- the algorithm cache ----
using AlgoCache = lt::AlgoCache<22>;
using AlgoKey = AlgoCache::Key;
AlgoCache& algo_cache() {
  static auto* cache = new AlgoCache();  // never destroyed (products may run during static destruction)
  return *cache;
}

using lt::LayoutDesc;
using lt::MatmulDesc;

void make_layout(LayoutDesc& layout, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batches,
                 int64_t batch_stride) {
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout.d, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
      "matmul");
  if (batches > 1) {
    const int32_t count = static_cast<int32_t>(batches);
    KILN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout.d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "matmul");
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout.d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                       &batch_stride, sizeof batch_stride),
                      "matmul");
  }
}

// The whole problem, in cuBLAS's terms: D (m x n, ld ldc) = alpha op(A) op(B) + beta C, C == D.
struct Problem {
  int device;
  cudaStream_t stream;
  Types types;              // of A and B, and the computation
  cudaDataType_t out_type;  // of C and D: types.data, or CUDA_R_32F for 16-bit A and B (a widening product)
  CublasOperand A, B;       // A = kiln's b, B = kiln's a
  void* c;
  int64_t m, n, k, ldc, batches, c_batch_stride;
  const void* alpha;
  const void* beta;
  // Epilogue (batches == 1): CUBLASLT_EPILOGUE_DEFAULT (none), or CUBLASLT_EPILOGUE_BIAS with `bias` (m values, one per
  // row of D), or CUBLASLT_EPILOGUE_BGRADB writing into `bias` the sums of op(B) over k (n values, one per column of
  // D).
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;
};

// Returns false when cuBLASLt cannot run this problem.
bool run_lt(const Problem& p) {
  const AlgoKey key = {p.device,
                       static_cast<int64_t>(p.types.data),
                       static_cast<int64_t>(p.types.compute),
                       p.A.trans,
                       p.B.trans,
                       p.m,
                       p.n,
                       p.k,
                       p.A.ld,
                       p.B.ld,
                       p.ldc,
                       p.batches,
                       p.A.batch_stride,
                       p.B.batch_stride,
                       p.c_batch_stride,
                       pointer_alignment(p.A.ptr),
                       pointer_alignment(p.B.ptr),
                       pointer_alignment(p.c),
                       static_cast<int64_t>(p.epilogue),
                       p.bias != nullptr ? pointer_alignment(p.bias) : 0,
                       static_cast<int64_t>(p.out_type),
                       lt::heuristic_only() ? 1 : 0};

  MatmulDesc op;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op.d, p.types.compute, p.types.scale), "matmul");
  const cublasOperation_t ta = p.A.trans ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.B.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "matmul");
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "matmul");
  if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    KILN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof p.epilogue), "matmul");
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof p.bias),
                      "matmul");
    // The bias (or its gradient) in D's type.
    KILN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &p.out_type, sizeof p.out_type),
        "matmul");
  }
  LayoutDesc a_layout, b_layout, c_layout;
  make_layout(a_layout, p.types.data, p.A.rows, p.A.cols, p.A.ld, p.batches, p.A.batch_stride);
  make_layout(b_layout, p.types.data, p.B.rows, p.B.cols, p.B.ld, p.batches, p.B.batch_stride);
  make_layout(c_layout, p.out_type, p.m, p.n, p.ldc, p.batches, p.c_batch_stride);

  cublasLtHandle_t handle = lt_handle(p.device);
  // Timing runs with beta == 0 write D (and a bias gradient), which the product below writes again; otherwise they
  // would read C == D, and run on a scratch block of D's extent instead.
  const bool beta_zero = p.types.scale == CUDA_R_64F ? *static_cast<const double*>(p.beta) == 0.0
                                                     : *static_cast<const float*>(p.beta) == 0.0f;
  Tensor scratch;
  const auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    if (!beta_zero && !scratch.defined()) {
      const int64_t esize = p.out_type == CUDA_R_64F ? 8 : p.out_type == CUDA_R_32F ? 4 : 2;
      const int64_t extent = p.ldc * p.n + (p.batches > 1 ? p.c_batch_stride * (p.batches - 1) : 0);
      scratch = internal::empty({extent * esize}, {.dtype = DType::UInt8, .device = Device::cuda(p.device)});
    }
    void* target = beta_zero ? p.c : scratch.data_ptr();
    return cublasLtMatmul(handle, op.d, p.alpha, p.A.ptr, a_layout.d, p.B.ptr, b_layout.d, p.beta, target, c_layout.d,
                          target, c_layout.d, &algo, workspace(p.device, p.stream), kWorkspaceBytes, p.stream);
  };
  const lt::LtProblem problem{op.d,    a_layout.d, b_layout.d, c_layout.d, key[15],  key[16],
                              key[17], p.m,        p.n,        p.k,        p.batches};
  const lt::AlgoChoice entry = algo_cache().get(key, handle, problem, p.stream, run, "matmul");
  if (!entry.ok) return false;
  const cublasStatus_t status =
      cublasLtMatmul(handle, op.d, p.alpha, p.A.ptr, a_layout.d, p.B.ptr, b_layout.d, p.beta, p.c, c_layout.d, p.c,
                     c_layout.d, &entry.algo, workspace(p.device, p.stream), kWorkspaceBytes, p.stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {  // remember, and let the fallback do it
    algo_cache().mark_unsupported(key);
    return false;
  }
  KILN_CUBLAS_CHECK(status, "matmul");
  return true;
}

int to_int(int64_t v) {
  KILN_CHECK_AS(NotImplementedError, v <= INT_MAX, "matmul: a dimension or stride of ", v,
                " is too large for the cuBLAS fallback on CUDA");
  return static_cast<int>(v);
}

// cuBLAS without Lt: strided-batched when every batch stride is real, else one call per batch.
void run_cublas(const Problem& p) {
  std::lock_guard<std::mutex> lock(g_cublas_mutex);
  cublasHandle_t handle = cublas_handle(p.device);
  KILN_CUBLAS_CHECK(cublasSetStream(handle, p.stream), "matmul");
  KILN_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace(p.device, p.stream), kWorkspaceBytes), "matmul");
  const cublasOperation_t ta = p.A.trans ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.B.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = to_int(p.m), n = to_int(p.n), k = to_int(p.k);
  const int lda = to_int(p.A.ld), ldb = to_int(p.B.ld), ldc = to_int(p.ldc);
  const bool broadcast = p.batches > 1 && (p.A.batch_stride == 0 || p.B.batch_stride == 0);
  if (!broadcast) {
    KILN_CUBLAS_CHECK(
        cublasGemmStridedBatchedEx(handle, ta, tb, m, n, k, p.alpha, p.A.ptr, p.types.data, lda, p.A.batch_stride,
                                   p.B.ptr, p.types.data, ldb, p.B.batch_stride, p.beta, p.c, p.out_type, ldc,
                                   p.c_batch_stride, to_int(p.batches), p.types.compute, CUBLAS_GEMM_DEFAULT),
        "matmul");
    return;
  }
  const auto size_of = [](cudaDataType_t t) -> int64_t { return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2; };
  const int64_t esize = size_of(p.types.data), out_esize = size_of(p.out_type);
  for (int64_t i = 0; i < p.batches; ++i) {
    const char* a = static_cast<const char*>(p.A.ptr) + i * p.A.batch_stride * esize;
    const char* b = static_cast<const char*>(p.B.ptr) + i * p.B.batch_stride * esize;
    char* c = static_cast<char*>(p.c) + i * p.c_batch_stride * out_esize;
    KILN_CUBLAS_CHECK(cublasGemmEx(handle, ta, tb, m, n, k, p.alpha, a, p.types.data, lda, b, p.types.data, ldb, p.beta,
                                   c, p.out_type, ldc, p.types.compute, CUBLAS_GEMM_DEFAULT),
                      "matmul");
  }
}

// The problem out = a @ b in cuBLAS's terms (out (B, M, N) with unit column stride, a (B, M, K), b (B, K, N)),
// scalars unset.
Problem problem_for(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t batches = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  Problem p{};
  p.device = out.device().index();
  p.stream = stream_for(out);
  p.types = types_for(a.dtype());
  KILN_CHECK(a.dtype() == b.dtype() &&
                 (out.dtype() == a.dtype() ||
                  (out.dtype() == DType::Float32 && p.types.data != CUDA_R_32F && p.types.data != CUDA_R_64F)),
             "cuda::matmul: a ", a.dtype(), " by ", b.dtype(), " product cannot be stored in ", out.dtype());
  p.out_type = out.dtype() == a.dtype() ? p.types.data : CUDA_R_32F;
  p.A = describe(b);  // op(A) = b^T: N x K
  p.B = describe(a);  // op(B) = a^T: K x M
  p.c = out.data_ptr();
  p.m = n;
  p.n = m;
  p.k = k;
  p.ldc = m > 1 ? out.stride(1) : std::max<int64_t>(n, 1);
  p.batches = batches;
  p.c_batch_stride = batches > 1 ? out.stride(0) : 0;
  if (batches == 1) p.A.batch_stride = p.B.batch_stride = 0;
  return p;
}

}  // namespace

cublasLtHandle_t lt::handle(int device) { return lt_handle(device); }
void* lt::workspace(int device, cudaStream_t stream) { return cuda::workspace(device, stream); }

// The elements in 16 bytes of a dtype whose products cuBLASLt runs on tensor cores (16-bit floats, float32 in TF32),
// or 0 for the others.
static int64_t per_16_bytes(DType dtype) {
  if (dtype == DType::BFloat16 || dtype == DType::Float16) return 8;
  return dtype == DType::Float32 ? 4 : 0;
}

// The row pitch of a new product (Backend::matmul_row_pitch): rows of 16-bit floats and of float32 rounded up to a
// multiple of 16 bytes. A row of, say, 30522 bfloat16 values (BERT's vocabulary) is only 4-byte aligned, which keeps
// cuBLASLt from its vectorised kernels for every product that reads or writes those rows (the logits, and both
// products of their gradient): at that size they run at a third of the speed of aligned rows (float32 in TF32: 120
// against about 400 TFLOP/s on an H100). Short rows are left alone.
int64_t CudaBackend::matmul_row_pitch(DType dtype, int64_t n) const {
  const int64_t per = per_16_bytes(dtype);
  if (per == 0 || n < 256 || n % per == 0) return n;
  return (n + per - 1) / per * per;
}

// Where a 16-bit or float32 product is cut in two. cuBLASLt's kernels for a dimension that is not a multiple of 16
// bytes' worth of elements (8 16-bit values, 4 floats) run at a third to two thirds of their aligned speed even when
// every leading dimension is aligned (BERT's 30522-word vocabulary: 240-500 against 730-820 TFLOP/s on an H200 in
// bfloat16). A large dimension d (>= 256) is therefore cut at d rounded down to such a multiple: the aligned part runs
// at full speed and the rest (at most 7 rows, columns or products) is a thin product that costs little. The cut parts
// start at 16-byte offsets, so each keeps the operands' alignment.
struct Cut {
  int dim = 0;  // 0: none; 1: M (rows of out and a), 2: N (columns of out and b), 3: K
  int64_t at = 0;
};

Cut unaligned_cut(const Tensor& out, const Tensor& a) {
  const int64_t per = per_16_bytes(a.dtype());
  if (per == 0) return {};
  auto cut_of = [per](int64_t d) -> int64_t { return d >= 256 && d % per != 0 ? d / per * per : 0; };
  if (const int64_t at = cut_of(out.size(2))) return {2, at};
  if (const int64_t at = cut_of(out.size(1))) return {1, at};
  if (const int64_t at = cut_of(a.size(2))) return {3, at};
  return {};
}

// The two parts [0, at) and [at, size) of t's dim d.
std::pair<Tensor, Tensor> halves(const Tensor& t, int64_t d, int64_t at) {
  return {internal::narrow(t, d, 0, at), internal::narrow(t, d, at, t.size(d) - at)};
}

// Whether out's rows can be described to cuBLAS: unit column stride, a row stride >= N, batches apart.
static bool rows_describable(const Tensor& out) {
  const int64_t m = out.size(1), n = out.size(2);
  if (out.stride(2) != 1 && n > 1) return false;
  if (m > 1 && out.stride(1) < n) return false;
  return out.size(0) == 1 || out.stride(0) >= m * (m > 1 ? out.stride(1) : n);
}

void CudaBackend::matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  // out (B, M, N) with contiguous rows, a (B, M, K), b (B, K, N); batch strides of a and b may be 0.
  KILN_CHECK(out.dim() == 3 && a.dim() == 3 && b.dim() == 3, "cuda::matmul: expected 3-D operands, got ", a.shape(),
             ", ", b.shape(), " -> ", out.shape());
  KILN_CHECK(rows_describable(out), "cuda::matmul: out ", out.shape(), " with strides ", out.strides(),
             " needs contiguous rows, apart from one another");
  if (const Cut cut = unaligned_cut(out, a); cut.dim != 0) {
    if (cut.dim == 3) {  // out = alpha a1 b1 + beta out, then out += alpha a2 b2
      const auto [a1, a2] = halves(a, 2, cut.at);
      const auto [b1, b2] = halves(b, 1, cut.at);
      matmul(out, a1, b1, alpha, beta);
      matmul(out, a2, b2, alpha, 1.0);
    } else {
      const auto [o1, o2] = halves(out, cut.dim, cut.at);
      const auto [x1, x2] = cut.dim == 1 ? halves(a, 1, cut.at) : halves(b, 2, cut.at);
      matmul(o1, cut.dim == 1 ? x1 : a, cut.dim == 1 ? b : x1, alpha, beta);
      matmul(o2, cut.dim == 1 ? x2 : a, cut.dim == 1 ? b : x2, alpha, beta);
    }
    return;
  }
  Problem p = problem_for(out, a, b);

  // Scalars in the compute type's scale type, on the host (the default pointer mode).
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  if (p.types.scale == CUDA_R_64F) {
    p.alpha = &alpha;
    p.beta = &beta;
  } else {
    p.alpha = &alpha_f;
    p.beta = &beta_f;
  }
  if (!run_lt(p)) run_cublas(p);
}

bool CudaBackend::matmul_epilogue(const Tensor& out, const Tensor& a, const Tensor& b, const MatmulEpilogue& e) {
  KILN_CHECK(out.dim() == 3 && a.dim() == 3 && b.dim() == 3 && out.size(0) == 1,
             "cuda::matmul_epilogue: expected one (1, M, K) x (1, K, N) product, got ", a.shape(), ", ", b.shape(),
             " -> ", out.shape());
  KILN_CHECK(e.bias.defined() != e.row_sums.defined(), "cuda::matmul_epilogue: give either a bias or row sums");
  const Tensor& vec = e.bias.defined() ? e.bias : e.row_sums;
  const int64_t m = out.size(1), n = out.size(2), k = a.size(2);
  KILN_CHECK(vec.is_contiguous() && vec.dtype() == out.dtype() && vec.device() == out.device() &&
                 vec.numel() == (e.bias.defined() ? n : m),
             "cuda::matmul_epilogue: the bias or row sums must be contiguous with out's dtype and device and ",
             e.bias.defined() ? n : m, " values, got ", vec.shape(), " ", vec.dtype());
  // Half and bfloat16 operands (out in their dtype or widened to float32), and float32 ones (TF32 or not): these are
  // the epilogues that training runs, with autocast or in float32. A problem cuBLASLt has no algorithm for is left to
  // the caller.
  if (per_16_bytes(a.dtype()) == 0) return false;
  if (m == 0 || n == 0 || k == 0) return false;
  if (const Cut cut = unaligned_cut(out, a); cut.dim != 0) {
    // Each part takes its share of the bias (N) or of the row sums (M); a part without one is a plain product.
    // Row sums over a cut K would have to be added up across the parts: left to the caller.
    if (cut.dim == 3) {
      if (e.row_sums.defined()) return false;
      const auto [a1, a2] = halves(a, 2, cut.at);
      const auto [b1, b2] = halves(b, 1, cut.at);
      if (!matmul_epilogue(out, a1, b1, e)) return false;
      matmul(out, a2, b2, 1.0, 1.0);
      return true;
    }
    const auto [o1, o2] = halves(out, cut.dim, cut.at);
    if (cut.dim == 1) {
      const auto [a1, a2] = halves(a, 1, cut.at);
      if (e.bias.defined()) return matmul_epilogue(o1, a1, b, e) && matmul_epilogue(o2, a2, b, e);
      const auto [s1, s2] = halves(e.row_sums, 0, cut.at);
      return matmul_epilogue(o1, a1, b, {.bias = {}, .row_sums = s1}) &&
             matmul_epilogue(o2, a2, b, {.bias = {}, .row_sums = s2});
    }
    const auto [b1, b2] = halves(b, 2, cut.at);
    if (e.row_sums.defined()) {  // a is whole in both parts: its row sums come with the first
      if (!matmul_epilogue(o1, a, b1, e)) return false;
      matmul(o2, a, b2, 1.0, 0.0);
      return true;
    }
    const auto [v1, v2] = halves(e.bias, 0, cut.at);
    return matmul_epilogue(o1, a, b1, {.bias = v1, .row_sums = {}}) &&
           matmul_epilogue(o2, a, b2, {.bias = v2, .row_sums = {}});
  }
  KILN_CHECK(rows_describable(out), "cuda::matmul_epilogue: out ", out.shape(), " with strides ", out.strides(),
             " needs contiguous rows");
  Problem p = problem_for(out, a, b);
  // Leading dimensions and pointers of 16-byte multiples only: elsewhere cuBLASLt's epilogue kernels can be many
  // times slower than a plain product (rows of 30522 columns, unpadded), and the caller's own way is cheaper.
  // Padded rows (matmul_row_pitch) qualify.
  const int64_t per = per_16_bytes(a.dtype()), per_out = per_16_bytes(out.dtype());
  if (p.A.ld % per != 0 || p.B.ld % per != 0 || p.ldc % per_out != 0 || k % per != 0) return false;
  if (pointer_alignment(p.A.ptr) < 16 || pointer_alignment(p.B.ptr) < 16 || pointer_alignment(p.c) < 16) return false;
  // D = out^T (n x m column-major): the bias runs along D's rows (CUBLASLT_EPILOGUE_BIAS); a's row sums are the
  // sums of op(B) = a^T over k, one per column of D (CUBLASLT_EPILOGUE_BGRADB).
  p.epilogue = e.bias.defined() ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADB;
  p.bias = vec.data_ptr();
  const float alpha = 1.0f, beta = 0.0f;
  p.alpha = &alpha;
  p.beta = &beta;
  if (!run_lt(p)) return false;
  vec.impl().storage()->bump_version();
  return true;
}

}  // namespace kiln::cuda
