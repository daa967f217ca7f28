// Out-of-range indices reported by CUDA kernels through mapped pinned memory (see index_errors.h).
#include "kiln/tensor/cuda/index_errors.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/tensor/backend.h"  // IndexOpScope
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/env_vars.h"
#include "kiln/tensor/error.h"

namespace kiln::cuda::detail {
namespace {

// The host's record of recent launches, by sequence number (older ones are overwritten; an error of one of
// them is still reported, without the op's name and dim).
constexpr size_t kRecords = 4096;
struct Record {
  unsigned long long seq = 0;
  std::string op;
  int64_t dim = 0;
};

struct DeviceSlots {
  IndexErrorSlot* host = nullptr;    // mapped pinned memory
  IndexErrorSlot* device = nullptr;  // the same memory as the GPU addresses it
  std::mutex mutex;
  unsigned long long next_seq = 1;
  std::vector<Record> records = std::vector<Record>(kRecords);
};

bool sync_checks() {
  static const bool on = env_flag("KILN_CUDA_SYNC_INDEX_CHECKS", false);
  return on;
}

// One per device, made on first use and never freed (kernels may still write there at exit).
std::vector<std::atomic<DeviceSlots*>>& table() {
  static auto* t = new std::vector<std::atomic<DeviceSlots*>>(static_cast<size_t>(std::max(device_count(), 0)));
  return *t;
}

DeviceSlots* existing(int device) {
  auto& t = table();
  if (device < 0 || static_cast<size_t>(device) >= t.size()) return nullptr;
  return t[static_cast<size_t>(device)].load(std::memory_order_acquire);
}

DeviceSlots& slots(int device) {
  if (DeviceSlots* s = existing(device)) return *s;
  static std::mutex create;
  std::lock_guard lock(create);
  auto& t = table();
  KILN_CHECK(device >= 0 && static_cast<size_t>(device) < t.size(), "CUDA index check: no device cuda:", device);
  if (DeviceSlots* s = t[static_cast<size_t>(device)].load(std::memory_order_relaxed)) return *s;
  auto* s = new DeviceSlots;
  DeviceGuard guard(device);
  void* p = nullptr;
  KILN_CUDA_CHECK(cudaHostAlloc(&p, sizeof(IndexErrorSlot), cudaHostAllocMapped | cudaHostAllocPortable),
                  "CUDA index check");
  std::memset(p, 0, sizeof(IndexErrorSlot));
  void* d = nullptr;
  KILN_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0), "CUDA index check");
  s->host = static_cast<IndexErrorSlot*>(p);
  s->device = static_cast<IndexErrorSlot*>(d);
  t[static_cast<size_t>(device)].store(s, std::memory_order_release);
  return *s;
}

void throw_pending(DeviceSlots& s) {
  volatile IndexErrorSlot* slot = s.host;
  if (slot->done == 0) return;
  std::atomic_thread_fence(std::memory_order_acquire);
  const unsigned long long seq = slot->seq;
  const long long value = slot->value, size = slot->size;
  Record rec;
  {
    std::lock_guard lock(s.mutex);
    rec = s.records[seq % kRecords];
    slot->done = 0;
    slot->seq = 0;  // the next bad index can be recorded again
  }
  const char* later =
      sync_checks()
          ? ""
          : " (found on the GPU after the call returned, so it is reported here; set KILN_CUDA_SYNC_INDEX_CHECKS=1 to "
            "have the failing call throw)";
  if (rec.seq == seq && !rec.op.empty()) {
    KILN_CHECK_AS(IndexError, false, rec.op, ": index ", value, " is out of range for dim ", rec.dim, " of size ", size,
                  " (expected 0 <= index < ", size, ")", later);
  }
  KILN_CHECK_AS(IndexError, false, "an index op (gather, index_select, scatter or embedding): index ", value,
                " is out of range for a dim of size ", size, " (expected 0 <= index < ", size, ")", later);
}

}  // namespace

IndexReport begin_index_launch(int device, const char* op, int64_t dim, int64_t size) {
  DeviceSlots& s = slots(device);
  throw_pending(s);
  std::lock_guard lock(s.mutex);
  const unsigned long long seq = s.next_seq++;
  Record& rec = s.records[seq % kRecords];
  rec.seq = seq;
  const kiln::detail::IndexOpName user_op = kiln::detail::IndexOpScope::current_name();
  if (user_op.empty()) {
    rec.op.assign(op);
  } else {
    rec.op = user_op.str();  // made now: the error is found after the call (and its module) may be gone
  }
  rec.dim = dim;
  return {s.device, seq, static_cast<long long>(size)};
}

void end_index_launch(int device, void* stream) {
  if (!sync_checks()) return;
  KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "CUDA index check");
  throw_pending(slots(device));
}

void throw_index_error(int device) {
  if (device >= 0) {
    if (DeviceSlots* s = existing(device)) throw_pending(*s);
    return;
  }
  auto& t = table();
  for (size_t d = 0; d < t.size(); ++d)
    if (DeviceSlots* s = t[d].load(std::memory_order_acquire)) throw_pending(*s);
}

}  // namespace kiln::cuda::detail
