// Reading rows of page-locked host memory from a GPU kernel (hybrid_rows.h): one warp per row, each lane moving
// 16-, 4- or 1-byte words of it, so that a row's reads leave the GPU as a few large requests over the bus. The placed
// lookup does the same for both tiers at once, its placement read on the device; the split by tier is one scan.
#include "kiln/layers/cuda/hybrid_rows.h"

#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>  // std::max
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kiln/tensor/cuda/cuda_check.h"     // KILN_CUDA_CHECK
#include "kiln/tensor/cuda/index_errors.h"   // IndexReport: a bad id, reported without a wait
#include "kiln/tensor/cuda/kernel_util.cuh"  // ceil_div, stream_for, KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/error.h"               // KILN_CHECK
#include "kiln/tensor/internal_ops.h"        // internal::empty: the scan's buffers
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

// Row r of out from hot or cold by slot[ids[r]]; lane 0 keeps the books (where, counts, tiers).
template <typename W>
__global__ void placed_lookup_kernel(W* out, int32_t* where_out, unsigned long long* tiers, const int64_t* ids,
                                     const int32_t* slot, int64_t v, const W* hot, const W* cold, int32_t* counts,
                                     int64_t n, int64_t words, cuda::detail::IndexReport err) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= n) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t id = ids[r];
  W* dst = out + r * words;
  if (id < 0 || id >= v) {
    if (lane == 0) {
      cuda::detail::report_bad_index(err, id);
      where_out[r] = kNoTier;
    }
    for (int64_t i = lane; i < words; i += 32) dst[i] = W{};
    return;
  }
  const int32_t where = slot[id];
  if (lane == 0) {
    where_out[r] = where;
    if (counts != nullptr) atomicAdd(counts + id, 1);
    atomicAdd(tiers + (where >= 0 ? 0 : 1), 1ull);
  }
  const W* src =
      where >= 0 ? hot + static_cast<int64_t>(where) * words : cold + (-static_cast<int64_t>(where) - 1) * words;
  for (int64_t i = lane; i < words; i += 32) dst[i] = src[i];
}

template <typename W>
void launch_placed(const Tensor& out, const Tensor& where_out, const Tensor& tiers, const Tensor& ids,
                   const Tensor& slot, const Tensor& hot, const void* cold, const Tensor& counts, int64_t row_bytes,
                   const cuda::detail::IndexReport& err) {
  const int64_t n = out.size(0);
  const auto blocks = static_cast<unsigned>(cuda::kdetail::ceil_div(n, kWarpsPerBlock));
  placed_lookup_kernel<W><<<blocks, kWarpsPerBlock * 32, 0, cuda::stream_for(out)>>>(
      static_cast<W*>(out.data_ptr()), where_out.data_ptr<int32_t>(),
      static_cast<unsigned long long*>(tiers.data_ptr()), ids.data_ptr<int64_t>(), slot.data_ptr<int32_t>(),
      slot.numel(), static_cast<const W*>(hot.data_ptr()), static_cast<const W*>(cold),
      counts.defined() ? counts.data_ptr<int32_t>() : nullptr, n, row_bytes / static_cast<int64_t>(sizeof(W)), err);
  KILN_CUDA_CHECK_LAUNCH("placed_lookup");
}

// A position's contribution to the two ranks, packed: 1 in the low half for the hot tier, in the high half for the
// cold one, nothing for a bad id.
__global__ void tier_flags_kernel(const int32_t* where, long long* flags, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t w = where[i];
  flags[i] = w >= 0 ? 1ll : (w == kNoTier ? 0ll : (1ll << 32));
}

__global__ void split_kernel(const int32_t* where, const long long* ranks, int64_t n, int64_t* hot_pos,
                             int64_t* hot_slots, int64_t* cold_pos, int64_t* cold_slots) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t w = where[i];
  const long long rank = ranks[i];
  if (w >= 0) {
    const long long at = rank & 0xffffffffll;
    hot_pos[at] = i;
    hot_slots[at] = w;
  } else if (w != kNoTier) {
    const long long at = rank >> 32;
    cold_pos[at] = i;
    cold_slots[at] = -static_cast<int64_t>(w) - 1;
  }
}

// Page-locked host memory is read by the kernels at its host address: under unified virtual addressing (every 64-bit
// platform CUDA supports) it is mapped for every device there, also at an offset inside an allocation. `op` names the
// caller in the error of a device without it.
// The attribute is read once per process (a lookup runs every step).
void check_host_mapped(const char* op, Device device) {
  static const std::vector<int> unified = [op] {
    int count = 0;
    KILN_CUDA_CHECK(cudaGetDeviceCount(&count), op);
    std::vector<int> u(static_cast<size_t>(count), 0);
    for (int d = 0; d < count; ++d) {
      KILN_CUDA_CHECK(cudaDeviceGetAttribute(&u[static_cast<size_t>(d)], cudaDevAttrUnifiedAddressing, d), op);
    }
    return u;
  }();
  const auto index = static_cast<size_t>(device.index());
  KILN_CHECK(index < unified.size() && unified[index] != 0, op, ": ", device,
             " does not share the host's address space (unified addressing), so it cannot read host rows directly");
}

// Calls launch(W{}) with the widest word W (16, 4 or 1 bytes) that divides a row of row_bytes and aligns every
// pointer in `ptrs`: the kernels copy rows word by word.
template <typename F>
void by_word_size(int64_t row_bytes, std::initializer_list<const void*> ptrs, F&& launch) {
  const auto aligned = [&](uintptr_t a) {
    if (row_bytes % static_cast<int64_t>(a) != 0) return false;
    for (const void* p : ptrs) {
      if (reinterpret_cast<uintptr_t>(p) % a != 0) return false;
    }
    return true;
  };
  if (aligned(16)) {
    launch(uint4{});
  } else if (aligned(4)) {
    launch(uint32_t{});
  } else {
    launch(uint8_t{});
  }
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
  check_host_mapped("gather_host_rows", out.device());
  const void* mapped = table.data_ptr();
  const int64_t row_bytes = out.numel() / n * static_cast<int64_t>(out.element_size());
  by_word_size(row_bytes, {mapped, out.data_ptr()},
               [&](auto word) { launch<decltype(word)>(out, mapped, rows, n, row_bytes); });
  out.impl().storage()->bump_version();
}

void placed_lookup(const Tensor& out, const Tensor& where_out, const Tensor& tiers, const Tensor& ids,
                   const Tensor& slot, const Tensor& hot, const Tensor& cold, const Tensor& counts) {
  const Device dev = out.device();
  KILN_CHECK(out.is_cuda() && out.is_contiguous() && out.dim() == 2 && hot.device() == dev && hot.is_contiguous() &&
                 hot.dtype() == out.dtype() && hot.dim() == 2 && hot.size(1) == out.size(1) && cold.is_cpu() &&
                 cold.is_pinned() && cold.is_contiguous() && cold.dtype() == out.dtype() && cold.dim() == 2 &&
                 cold.size(1) == out.size(1),
             "placed_lookup: expected (N, D) rows on a GPU, a contiguous hot tier there and a contiguous page-locked "
             "cold tier, all of one dtype and width, got ",
             out.shape(), " ", out.dtype(), " on ", out.device(), ", ", hot.shape(), " ", hot.dtype(), " on ",
             hot.device(), " and ", cold.shape(), " ", cold.dtype(), cold.is_pinned() ? " (pinned)" : " (not pinned)");
  const int64_t n = out.size(0);
  KILN_CHECK(ids.device() == dev && ids.dtype() == DType::Int64 && ids.dim() == 1 && ids.numel() == n &&
                 ids.is_contiguous() && where_out.device() == dev && where_out.dtype() == DType::Int32 &&
                 where_out.numel() == n && where_out.is_contiguous() && slot.device() == dev &&
                 slot.dtype() == DType::Int32 && slot.dim() == 1 && slot.is_contiguous() && tiers.device() == dev &&
                 tiers.dtype() == DType::Int64 && tiers.numel() == 2 && tiers.is_contiguous() &&
                 (!counts.defined() || (counts.device() == dev && counts.dtype() == DType::Int32 &&
                                        counts.numel() == slot.numel() && counts.is_contiguous())),
             "placed_lookup: expected ", n, " Int64 ids, ", n,
             " Int32 wheres, (V) Int32 slots (and counts) and 2 Int64 "
             "tier counts, contiguous on ",
             dev);
  trace::Scope range(trace::Kind::Op, "placed_lookup", dev, {&out, &ids, &hot, &cold});
  check_host_mapped("placed_lookup", dev);
  const cudaStream_t stream = cuda::stream_for(out);
  KILN_CUDA_CHECK(cudaMemsetAsync(tiers.data_ptr(), 0, 2 * sizeof(int64_t), stream), "placed_lookup");
  if (n > 0) {
    const cuda::detail::IndexReport err =
        cuda::detail::begin_index_launch(dev.index(), "HybridEmbedding lookup", 0, slot.numel());
    const int64_t row_bytes = out.size(1) * static_cast<int64_t>(out.element_size());
    by_word_size(row_bytes, {cold.data_ptr(), hot.data_ptr(), out.data_ptr()}, [&](auto word) {
      launch_placed<decltype(word)>(out, where_out, tiers, ids, slot, hot, cold.data_ptr(), counts, row_bytes, err);
    });
    cuda::detail::end_index_launch(dev.index(), stream);
  }
  for (const Tensor* t : {&out, &where_out, &tiers}) t->impl().storage()->bump_version();
  if (counts.defined()) counts.impl().storage()->bump_version();
}

void split_by_tier(const Tensor& where, const Tensor& hot_pos, const Tensor& hot_slots, const Tensor& cold_pos,
                   const Tensor& cold_slots) {
  const Device dev = where.device();
  const int64_t n = where.numel();
  for (const Tensor* t : {&hot_pos, &hot_slots, &cold_pos, &cold_slots})
    KILN_CHECK(t->device() == dev && t->dtype() == DType::Int64 && t->dim() == 1 && t->is_contiguous(),
               "split_by_tier: expected contiguous Int64 lists on ", dev, ", got ", t->shape(), " ", t->dtype(), " on ",
               t->device());
  KILN_CHECK(where.is_cuda() && where.dtype() == DType::Int32 && where.dim() == 1 && where.is_contiguous() &&
                 hot_pos.numel() == hot_slots.numel() && cold_pos.numel() == cold_slots.numel() &&
                 hot_pos.numel() + cold_pos.numel() <= n,
             "split_by_tier: expected (N) Int32 wheres on a GPU and lists of the tiers' sizes, got ", where.shape(),
             " ", where.dtype(), " on ", where.device(), " and ", hot_pos.numel(), " + ", cold_pos.numel(),
             " positions");
  if (n == 0) return;
  trace::Scope range(trace::Kind::Op, "split_by_tier", dev, {&where});
  const cudaStream_t stream = cuda::stream_for(where);
  const TensorOptions i64{.dtype = DType::Int64, .device = dev};
  const Tensor flags = internal::empty({n}, i64), ranks = internal::empty({n}, i64);
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(cuda::kdetail::ceil_div(n, kThreads));
  tier_flags_kernel<<<blocks, kThreads, 0, stream>>>(where.data_ptr<int32_t>(),
                                                     static_cast<long long*>(flags.data_ptr()), n);
  KILN_CUDA_CHECK_LAUNCH("split_by_tier");
  const auto* in = static_cast<const long long*>(flags.data_ptr());
  auto* out = static_cast<long long*>(ranks.data_ptr());
  size_t bytes = 0;
  KILN_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, in, out, n, stream), "split_by_tier (scan)");
  const Tensor temp =
      internal::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, {.dtype = DType::UInt8, .device = dev});
  KILN_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.data_ptr(), bytes, in, out, n, stream), "split_by_tier (scan)");
  split_kernel<<<blocks, kThreads, 0, stream>>>(where.data_ptr<int32_t>(), out, n, hot_pos.data_ptr<int64_t>(),
                                                hot_slots.data_ptr<int64_t>(), cold_pos.data_ptr<int64_t>(),
                                                cold_slots.data_ptr<int64_t>());
  KILN_CUDA_CHECK_LAUNCH("split_by_tier");
  for (const Tensor* t : {&hot_pos, &hot_slots, &cold_pos, &cold_slots}) t->impl().storage()->bump_version();
}

}  // namespace kiln::nn::cuda_impl
