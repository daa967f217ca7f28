// Reading rows of page-locked host memory from a GPU kernel (hybrid_rows.h): one warp per row, each lane moving
// 16-, 4- or 1-byte words of it, so that a row's reads leave the GPU as a few large requests over the bus.
#include "kiln/layers/cuda/hybrid_rows.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/tensor/cuda/cuda_check.h"     // KILN_CUDA_CHECK
#include "kiln/tensor/cuda/kernel_util.cuh"  // ceil_div, stream_for, KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/error.h"               // KILN_CHECK
#include "kiln/tensor/trace.h"               // a range per kernel entry

namespace kiln::nn::cuda_impl {
namespace {

constexpr int kWarpsPerBlock = 8;

// Row r of out gets row rows[r] of table; a row is `words` words of type W.
template <typename W>
__global__ void gather_host_rows_kernel(W* out, const W* table, const int64_t* rows, int64_t n, int64_t words) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= n) return;
  const W* src = table + rows[r] * words;
  W* dst = out + r * words;
  for (int64_t i = threadIdx.x % 32; i < words; i += 32) dst[i] = src[i];
}

template <typename W>
void launch(const Tensor& out, const void* table, const Tensor& rows, int64_t n, int64_t row_bytes) {
  const auto blocks = static_cast<unsigned>(cuda::kdetail::ceil_div(n, kWarpsPerBlock));
  gather_host_rows_kernel<W><<<blocks, kWarpsPerBlock * 32, 0, cuda::stream_for(out)>>>(
      static_cast<W*>(out.data_ptr()), static_cast<const W*>(table), rows.data_ptr<int64_t>(), n,
      row_bytes / static_cast<int64_t>(sizeof(W)));
  KILN_CUDA_CHECK_LAUNCH("gather_host_rows");
}

}  // namespace

void gather_host_rows(const Tensor& out, const Tensor& table, const Tensor& rows) {
  KILN_CHECK(out.is_cuda() && out.is_contiguous() && table.is_cpu() && table.is_pinned() && table.is_contiguous() &&
                 out.dtype() == table.dtype() && out.dim() == table.dim() && out.dim() >= 1,
             "gather_host_rows: expected contiguous rows on a GPU and a contiguous page-locked host table of their "
             "dtype, got ",
             out.shape(), " ", out.dtype(), " on ", out.device(), " and ", table.shape(), " ", table.dtype(),
             table.is_pinned() ? " (pinned)" : " (not pinned)");
  KILN_CHECK(
      rows.dim() == 1 && rows.dtype() == DType::Int64 && rows.device() == out.device() && rows.numel() == out.size(0),
      "gather_host_rows: expected ", out.size(0), " Int64 rows on ", out.device(), ", got ", rows.shape(), " ",
      rows.dtype(), " on ", rows.device());
  const int64_t n = out.size(0);
  if (n == 0 || out.numel() == 0) return;
  trace::Scope range(trace::Kind::Op, "gather_host_rows", out.device(), {&out, &table, &rows});
  // Under unified virtual addressing (every 64-bit platform CUDA supports), page-locked host memory is mapped for
  // every device at its host address, so a kernel reads it as it is (also at an offset inside an allocation).
  int unified = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, out.device().index()),
                  "gather_host_rows");
  KILN_CHECK(unified != 0, "gather_host_rows: ", out.device(), " does not share the host's address space (unified ",
             "addressing), so it cannot read host rows directly");
  const void* mapped = table.data_ptr();
  const int64_t row_bytes = out.numel() / n * static_cast<int64_t>(out.element_size());
  const auto aligned = [&](uintptr_t a) {
    return row_bytes % a == 0 && reinterpret_cast<uintptr_t>(mapped) % a == 0 &&
           reinterpret_cast<uintptr_t>(out.data_ptr()) % a == 0;
  };
  if (aligned(16)) {
    launch<uint4>(out, mapped, rows, n, row_bytes);
  } else if (aligned(4)) {
    launch<uint32_t>(out, mapped, rows, n, row_bytes);
  } else {
    launch<uint8_t>(out, mapped, rows, n, row_bytes);
  }
  out.impl().storage()->bump_version();
}

}  // namespace kiln::nn::cuda_impl
