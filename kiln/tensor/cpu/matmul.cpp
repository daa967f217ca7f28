// CPU kernels: batched matrix multiply. The products themselves are Eigen's GEMM (gemm.h); this file
// splits the work over the thread pool (Eigen is multithreaded only under OpenMP, which kiln does not
// use) and runs float16/bfloat16 through float32 buffers.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/gemm.h"
#include "kiln/tensor/cpu/parallel.h"
#include "kiln/tensor/dispatch.h"

namespace kiln::cpu {
namespace {

// Below this many multiply-adds per task a thread hand-off costs more than it saves.
constexpr int64_t kMinTaskMacs = int64_t{1} << 17;
// Row blocks of one product are at least this tall, so each block still feeds Eigen's kernels well.
constexpr int64_t kMinBlockRows = 32;

// One operand of a batched product: (B, rows, cols) with strides in elements; batch_stride may be 0.
template <typename T>
struct BatchedRef {
  T* data;
  int64_t batch_stride, row_stride, col_stride;
};

template <typename T>
BatchedRef<T> batched_ref(const Tensor& t) {
  return {t.data_ptr<std::remove_const_t<T>>(), t.stride(0), t.stride(1), t.stride(2)};
}

// c[i] = alpha * a[i] @ b[i] + beta * c[i] for i < B; a (B, M, K), b (B, K, N), c (B, M, N).
// Tasks are (batch, row block) pairs: many batches give one task each, a single large product is cut
// into row blocks of the output, which are independent.
template <typename T>
void batched_gemm(BatchedRef<const T> a, BatchedRef<const T> b, BatchedRef<T> c, int64_t batches, int64_t m, int64_t n,
                  int64_t k, T alpha, T beta) {
  const int64_t threads = num_threads();
  int64_t blocks_per_batch = 1;
  if (batches < threads && m >= 2 * kMinBlockRows) {
    const int64_t wanted = (2 * threads + batches - 1) / batches;
    blocks_per_batch = std::min(wanted, m / kMinBlockRows);
  }
  const int64_t block_rows = (m + blocks_per_batch - 1) / blocks_per_batch;
  blocks_per_batch = (m + block_rows - 1) / block_rows;
  const int64_t task_macs = std::max<int64_t>(1, block_rows * n * std::max<int64_t>(k, 1));
  const int64_t grain = std::max<int64_t>(1, kMinTaskMacs / task_macs);

  parallel_for(0, batches * blocks_per_batch, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t batch = task / blocks_per_batch;
      const int64_t row0 = (task % blocks_per_batch) * block_rows;
      const int64_t rows = std::min(block_rows, m - row0);
      MatrixRef<const T> am{a.data + batch * a.batch_stride + row0 * a.row_stride, rows, k, a.row_stride, a.col_stride};
      MatrixRef<const T> bm{b.data + batch * b.batch_stride, k, n, b.row_stride, b.col_stride};
      MatrixRef<T> cm{c.data + batch * c.batch_stride + row0 * c.row_stride, rows, n, c.row_stride, 1};
      gemm<T>(am, bm, cm, alpha, beta);
    }
  });
}

// Converts a strided (B, rows, cols) operand to a contiguous float buffer. A batch stride of 0 stays
// one matrix (the returned ref keeps batch stride 0).
template <typename T>
BatchedRef<const float> to_float(const Tensor& t, std::vector<float>& buffer) {
  const int64_t batches = t.stride(0) == 0 ? 1 : t.size(0);
  const int64_t rows = t.size(1), cols = t.size(2);
  const int64_t bs = t.stride(0), rs = t.stride(1), cs = t.stride(2);
  buffer.resize(static_cast<size_t>(batches * rows * cols));
  const T* src = t.data_ptr<T>();
  float* dst = buffer.data();
  parallel_for(0, batches * rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(cols, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   const T* s = src + (r / rows) * bs + (r % rows) * rs;
                   float* d = dst + r * cols;
                   for (int64_t j = 0; j < cols; ++j) d[j] = static_cast<float>(s[j * cs]);
                 }
               });
  return {dst, t.stride(0) == 0 ? 0 : rows * cols, cols, 1};
}

// Float16/BFloat16: multiply in float32 buffers, round once when storing into out (contiguous). A Float32 out (a
// widening product) gets the float32 sums themselves.
template <typename T>
void reduced_precision_matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  std::vector<float> a_buf, b_buf;
  BatchedRef<const float> af = to_float<T>(a, a_buf);
  BatchedRef<const float> bf = to_float<T>(b, b_buf);
  if (out.dtype() == DType::Float32) {
    BatchedRef<float> c{out.data_ptr<float>(), out.size(1) * out.size(2), out.size(2), 1};
    batched_gemm<float>(af, bf, c, out.size(0), out.size(1), out.size(2), a.size(2), static_cast<float>(alpha),
                        static_cast<float>(beta));
    return;
  }
  const int64_t total = out.numel();
  T* o = out.data_ptr<T>();
  std::vector<float> c_buf(static_cast<size_t>(total));
  float* c = c_buf.data();
  if (beta != 0) {
    parallel_for(0, total, kGrainSize, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) c[i] = static_cast<float>(o[i]);
    });
  }
  const int64_t m = out.size(1), n = out.size(2), k = a.size(2);
  batched_gemm<float>(af, bf, {c, m * n, n, 1}, out.size(0), m, n, k, static_cast<float>(alpha),
                      static_cast<float>(beta));
  parallel_for(0, total, kGrainSize, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) o[i] = T(c[i]);
  });
}

}  // namespace

void CpuBackend::matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  // out (B, M, N) contiguous, a (B, M, K), b (B, K, N)
  KILN_CHECK(out.dim() == 3 && a.dim() == 3 && b.dim() == 3, "cpu::matmul: expected 3-D operands, got ", a.shape(),
             ", ", b.shape(), " -> ", out.shape());
  KILN_CHECK(a.dtype() == b.dtype() &&
                 (out.dtype() == a.dtype() ||
                  (out.dtype() == DType::Float32 && (a.dtype() == DType::Float16 || a.dtype() == DType::BFloat16))),
             "cpu::matmul: a ", a.dtype(), " by ", b.dtype(), " product cannot be stored in ", out.dtype());
  visit_numeric_dtype(a.dtype(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      reduced_precision_matmul<T>(out, a, b, alpha, beta);
    } else if constexpr (!std::is_same_v<T, bool>) {
      BatchedRef<T> c{out.data_ptr<T>(), out.size(1) * out.size(2), out.size(2), 1};
      batched_gemm<T>(batched_ref<const T>(a), batched_ref<const T>(b), c, out.size(0), out.size(1), out.size(2),
                      a.size(2), static_cast<T>(alpha), static_cast<T>(beta));
    }
  });
}

}  // namespace kiln::cpu
