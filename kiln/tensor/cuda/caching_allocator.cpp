// The caching device allocator: one per GPU, stream-aware, with small and large pools.
//
// cudaMalloc and cudaFree are slow (cudaFree synchronises the device), so freed memory is kept and
// handed out again. Memory comes from the driver in segments; a segment is split into blocks, and
// free neighbours merge again. Requests of at most 1 MiB share 2 MiB segments (the small pool), larger
// ones get their own segments (the large pool), so small tensors do not fragment big segments.
//
// Streams: a block belongs to the stream that was current when it was allocated, and only that stream
// gets it again. Reuse on the same stream is safe without synchronising, because the stream runs the
// old user's work before the new one's. A block that other streams used too (record_stream) is kept
// out of the pools after free until an event recorded on each of those streams has completed.
//
// CUDA graphs (cuda::Graph): while a stream is being captured, its allocations come from a private pool of the
// graph (pool id != 0), and blocks freed during the capture return there. Replays write the same addresses, so
// no other allocation may get that memory while the graph lives: private blocks are never handed out outside
// their graph's capture, and their segments are not released. When the graph goes, the pool's free segments go
// back to the driver; blocks still held by tensors are released when freed and the cache is emptied.
//
// Each graph has a second private pool (id pool + 1) for its replay inputs (cuda::Graph::replay_input): tensors
// that a replay hook writes before the graph runs (learning rates, random offsets). Within the first pool, a
// block freed during the capture is handed to a later allocation of the same capture; a replay input placed
// there would be overwritten, on every replay, by the graph's own kernels that wrote the earlier tenant, after
// the hook wrote it and before its readers run. Blocks of the inputs pool are never shared with temporaries.
#include "kiln/tensor/cuda/caching_allocator.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/tensor/cuda.h"
#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/env_vars.h"
#include "kiln/tensor/ops/elementwise_common.h"  // release_cached_constants

namespace kiln::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kRound = 512;              // every block is a multiple of this
constexpr size_t kSmallRequest = kMiB;      // requests up to here come from the small pool
constexpr size_t kSmallSegment = 2 * kMiB;  // what the small pool asks the driver for
constexpr size_t kLargeRound = 2 * kMiB;    // large segments are multiples of this
constexpr size_t kMinLargeSplit = kMiB;     // a large block's remainder is kept only above this
// Larger requests cannot be rounded without overflowing; no GPU has this much memory anyway.
constexpr size_t kMaxRequest = size_t{1} << 62;

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

// Replay inputs being allocated on this thread (ReplayInputAllocation scopes).
thread_local int t_replay_inputs = 0;

// The pool of a graph's replay inputs, beside the pool of its capture.
uint64_t inputs_pool_of(uint64_t pool) { return pool + 1; }

bool debug_mode() {
  // Read once: KILN_CUDA_ALLOC_DEBUG=1 sends every allocation straight to cudaMalloc/cudaFree, so tools
  // like compute-sanitizer see each tensor's exact bounds.
  static const bool on = env_flag("KILN_CUDA_ALLOC_DEBUG", false);
  return on;
}

// Makes `device` current for a scope without ever throwing (for destructors).
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    } else if (previous_ != device && cudaSetDevice(device) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }
  ~QuietDeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

struct Block {
  uint64_t pool = 0;              // 0: the shared pools; else the private pool of a CUDA graph (its segment's)
  cudaStream_t stream = nullptr;  // the stream it was allocated on (its whole segment's)
  size_t size = 0;
  char* ptr = nullptr;
  bool small = false;      // which pool
  bool allocated = false;  // handed out to a tensor
  int pending_events = 0;  // freed, but other streams may still use it
  Block* prev = nullptr;   // neighbours inside the same segment
  Block* next = nullptr;
  std::vector<cudaStream_t> stream_uses;  // streams besides `stream` (record_stream)

  bool in_pool() const { return !allocated && pending_events == 0; }
  bool whole_segment() const { return prev == nullptr && next == nullptr; }
};

// Best fit: the smallest block of the same pool and stream that is large enough, lowest address on ties.
struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    if (a->pool != b->pool) return a->pool < b->pool;
    if (a->stream != b->stream) return reinterpret_cast<uintptr_t>(a->stream) < reinterpret_cast<uintptr_t>(b->stream);
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};
using Pool = std::set<Block*, BlockOrder>;

class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int device) : device_(device) {}

  Device device() const override { return Device::cuda(device_); }

  DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return DataPtr(nullptr, [](void*) {});
    const cudaStream_t stream = static_cast<cudaStream_t>(current_stream(device_).handle());
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t pool = 0;
    if (!capturing_.empty()) {
      auto it = capturing_.find(stream);
      if (it != capturing_.end()) pool = it->second;
    }
    if (t_replay_inputs > 0) {
      KILN_CHECK(pool != 0, "cuda::Graph::replay_input: the current stream of cuda:", device_,
                 " is not being captured; a replay input is made inside a capture, on the captured device");
      pool = inputs_pool_of(pool);
    }
    Block* block = debug_mode() && pool == 0 ? malloc_uncached(nbytes) : allocate_block(nbytes, stream, pool);
    block->allocated = true;
    active_.emplace(block->ptr, block);
    stats_.allocated_bytes += static_cast<int64_t>(block->size);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return DataPtr(block->ptr, [this, block](void*) { free(block); });
  }

  // The handed-out block that holds ptr, or nullptr (the caller holds the lock). A tensor's storage may start inside
  // a block (internal::split_owned's pieces of one gradient); those are few, and are looked for only when ptr starts
  // no block.
  Block* containing(void* ptr) const {
    const char* p = static_cast<const char*>(ptr);
    for (const auto& [start, block] : active_) {
      if (p >= block->ptr && p < block->ptr + block->size) return block;
    }
    return nullptr;
  }

  void record_stream(void* ptr, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = active_.find(ptr);
    Block* block = it != active_.end() ? it->second : containing(ptr);
    if (block == nullptr) return;  // memory this allocator did not hand out
    if (stream == block->stream) return;
    for (cudaStream_t s : block->stream_uses)
      if (s == stream) return;
    block->stream_uses.push_back(stream);
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    MemoryStats s = stats_;
    s.active_blocks = static_cast<int64_t>(active_.size());
    s.cached_blocks = static_cast<int64_t>(small_.size() + large_.size());
    return s;
  }

  void reset_peaks() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    KILN_CHECK(capturing_.empty(), "empty_cache: a CUDA graph is being captured on cuda:", device_,
               "; empty the cache before or after the capture");
    synchronize_events();
    release_cached_segments();
  }

  // ---- CUDA graphs ----

  // A new private pool; allocations on `stream` come from it until end_capture.
  uint64_t begin_capture(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    KILN_CHECK(!capturing_.count(stream), "CUDA graph capture: the stream is already being captured");
    const uint64_t pool = next_pool_;
    next_pool_ += 2;  // pool + 1: the graph's replay inputs
    live_pools_.insert(pool);
    live_pools_.insert(inputs_pool_of(pool));
    capturing_[stream] = pool;
    return pool;
  }
  void end_capture(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    capturing_.erase(stream);
  }
  // The graph is gone: the free segments of its pools (temporaries and replay inputs) return to the driver (the
  // caller made sure no replay is running); blocks tensors still hold follow when freed and the cache is emptied.
  void release_pool(uint64_t pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const uint64_t p : {pool, inputs_pool_of(pool)}) {
      live_pools_.erase(p);
      release_cached_segments(p);
    }
  }

 private:
  // ---- allocation ----

  Block* allocate_block(size_t nbytes, cudaStream_t stream, uint64_t pool_id) {
    if (nbytes > kMaxRequest) out_of_memory(nbytes);
    const bool capture = pool_id != 0;
    if (!capture) process_events();  // event queries do not mix with a capture in progress
    const size_t size = round_up(nbytes, kRound);
    const bool small = size <= kSmallRequest;
    Pool& pool = small ? small_ : large_;
    if (Block* b = take_from_pool(pool, pool_id, stream, size)) return split(b, size);

    const size_t segment = small ? kSmallSegment : round_up(size, kLargeRound);
    void* ptr = try_malloc(segment);
    if (ptr == nullptr && capture) out_of_memory(nbytes);  // releasing memory would synchronise the device
    if (ptr == nullptr) {
      // Blocks waiting for other streams may be enough once those streams finish; then cached segments
      // of every stream go back to the driver, and cudaMalloc gets one more chance.
      synchronize_events();
      if (Block* b = take_from_pool(pool, pool_id, stream, size)) {
        ++stats_.num_alloc_retries;
        return split(b, size);
      }
      release_cached_segments();
      ptr = try_malloc(segment);
      if (ptr == nullptr) out_of_memory(nbytes);
      ++stats_.num_alloc_retries;
    }
    Block* b = new Block;
    b->pool = pool_id;
    b->stream = stream;
    b->size = segment;
    b->ptr = static_cast<char*>(ptr);
    b->small = small;
    return split(b, size);
  }

  Block* take_from_pool(Pool& pool, uint64_t pool_id, cudaStream_t stream, size_t size) {
    Block key;
    key.pool = pool_id;
    key.stream = stream;
    key.size = size;
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->pool != pool_id || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    pool.erase(it);
    return b;
  }

  // Cuts `b` (not in any pool) down to `size` when the rest is worth keeping; the rest goes to the pool.
  Block* split(Block* b, size_t size) {
    const size_t rest = b->size - size;
    const bool keep = b->small ? rest >= kRound : rest > kMinLargeSplit;
    if (!keep) return b;
    Block* r = new Block;
    r->pool = b->pool;
    r->stream = b->stream;
    r->size = rest;
    r->ptr = b->ptr + size;
    r->small = b->small;
    r->prev = b;
    r->next = b->next;
    if (b->next != nullptr) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool_of(r).insert(r);
    return b;
  }

  // nullptr when the device is out of memory; other errors throw.
  void* try_malloc(size_t size) {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    // A capture in progress on this thread forbids cudaMalloc (it is no stream operation, so the graph does not
    // see it): relax the capture mode of this thread around the call.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    KILN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode), "CUDA caching allocator");
    const cudaError_t err = cudaMalloc(&ptr, size);
    KILN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode), "CUDA caching allocator");
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky, but clear it so later launch checks do not report it
      return nullptr;
    }
    KILN_CUDA_CHECK(err, "CUDA caching allocator");
    ++stats_.num_device_mallocs;
    stats_.reserved_bytes += static_cast<int64_t>(size);
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    return ptr;
  }

  Block* malloc_uncached(size_t nbytes) {
    if (nbytes > kMaxRequest) out_of_memory(nbytes);
    void* ptr = try_malloc(nbytes);
    if (ptr == nullptr) out_of_memory(nbytes);
    Block* b = new Block;
    b->size = nbytes;
    b->ptr = static_cast<char*>(ptr);
    return b;
  }

  [[noreturn]] void out_of_memory(size_t nbytes) {
    ++stats_.num_ooms;
    size_t free_bytes = 0, total_bytes = 0;
    {
      DeviceGuard guard(device_);
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    }
    throw OutOfMemoryError(::kiln::detail::str_cat(
        "CUDA out of memory: tried to allocate ", human_bytes(static_cast<double>(nbytes)), " (", nbytes,
        " bytes) on cuda:", device_, ". The GPU has ", human_bytes(static_cast<double>(total_bytes)), " total, ",
        human_bytes(static_cast<double>(free_bytes)), " free; kiln has ",
        human_bytes(static_cast<double>(stats_.allocated_bytes)), " allocated in tensors and ",
        human_bytes(static_cast<double>(stats_.reserved_bytes)),
        " reserved by its caching allocator. To fit: reduce the batch size, use AMP (bf16/fp16), enable gradient "
        "checkpointing, or call kiln::cuda::empty_cache() if memory is cached (reserved much larger than "
        "allocated); kiln::cuda::memory_summary() shows the details"));
  }

  // ---- freeing ----

  // The DataPtr's deleter: runs in destructors, so it must not throw. On a CUDA failure (a broken context,
  // or the runtime already unloaded at exit) the block is leaked rather than risked being reused early.
  void free(Block* block) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    active_.erase(block->ptr);
    block->allocated = false;
    stats_.allocated_bytes -= static_cast<int64_t>(block->size);
    if (debug_mode() && block->pool == 0) {  // a graph's blocks are pooled even then
      QuietDeviceGuard guard(device_);
      if (cudaFree(block->ptr) == cudaSuccess) {
        ++stats_.num_device_frees;
        stats_.reserved_bytes -= static_cast<int64_t>(block->size);
      } else {
        (void)cudaGetLastError();
      }
      delete block;
      return;
    }
    if (block->stream_uses.empty()) {
      return_to_pool(block);
      return;
    }
    if (!capturing_.empty()) {
      // An event recorded on a stream being captured would become part of the graph: keep such a block out
      // of the pools for good (a rare case: record_stream, then a free during a capture).
      for (cudaStream_t s : block->stream_uses) {
        if (capturing_.count(s)) {
          ++block->pending_events;
          return;
        }
      }
    }
    try {
      QuietDeviceGuard guard(device_);  // events and the legacy default stream are the device's
      for (cudaStream_t s : block->stream_uses) {
        cudaEvent_t e = get_event();
        KILN_CUDA_CHECK(cudaEventRecord(e, s), "CUDA caching allocator");
        ++block->pending_events;
        pending_.push_back({e, block});
      }
      block->stream_uses.clear();
    } catch (...) {
      // Events already recorded still count; those missing mean the block never returns (leaked).
      ++block->pending_events;
    }
  }

  // Puts a free block back, merged with its free neighbours.
  void return_to_pool(Block* b) {
    Pool& pool = pool_of(b);
    if (b->prev != nullptr && b->prev->in_pool()) {
      Block* p = b->prev;
      pool.erase(p);
      absorb_next(p);
      b = p;
    }
    if (b->next != nullptr && b->next->in_pool()) {
      pool.erase(b->next);
      absorb_next(b);
    }
    pool.insert(b);
  }

  // b takes in the block after it (out of every pool), which is deleted.
  static void absorb_next(Block* b) {
    Block* n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete n;
  }

  Pool& pool_of(const Block* b) { return b->small ? small_ : large_; }

  // ---- events of cross-stream frees ----

  cudaEvent_t get_event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;  // created with device_ current (the caller holds a DeviceGuard)
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "CUDA caching allocator");
    return e;
  }

  void event_done(cudaEvent_t e, Block* b) {
    free_events_.push_back(e);
    if (--b->pending_events == 0) return_to_pool(b);
  }

  // Returns the blocks whose other-stream work has finished; never waits.
  void process_events() {
    size_t kept = 0;
    for (size_t i = 0; i < pending_.size(); ++i) {
      auto [e, b] = pending_[i];
      const cudaError_t err = cudaEventQuery(e);
      if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        pending_[kept++] = pending_[i];
        continue;
      }
      if (err != cudaSuccess) {
        // Keep the rest consistent before reporting.
        for (size_t j = i; j < pending_.size(); ++j) pending_[kept++] = pending_[j];
        pending_.resize(kept);
        KILN_CUDA_CHECK(err, "CUDA caching allocator");
      }
      event_done(e, b);
    }
    pending_.resize(kept);
  }

  // Waits for every pending event (before releasing memory, when cudaMalloc failed or on empty_cache).
  void synchronize_events() {
    while (!pending_.empty()) {
      auto [e, b] = pending_.back();
      KILN_CUDA_CHECK(cudaEventSynchronize(e), "CUDA caching allocator");
      pending_.pop_back();
      event_done(e, b);
    }
  }

  // cudaFree of every cached segment that is entirely free (of the shared pools and of graphs that are gone;
  // only_pool != 0: of that pool only).
  void release_cached_segments(uint64_t only_pool = 0) {
    DeviceGuard guard(device_);
    for (Pool* pool : {&small_, &large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        const bool eligible = only_pool != 0 ? b->pool == only_pool : !live_pools_.count(b->pool);
        if (!eligible || !b->whole_segment()) {
          ++it;
          continue;
        }
        KILN_CUDA_CHECK(cudaFree(b->ptr), "empty_cache");
        ++stats_.num_device_frees;
        stats_.reserved_bytes -= static_cast<int64_t>(b->size);
        it = pool->erase(it);
        delete b;
      }
    }
  }

  const int device_;
  std::mutex mutex_;
  Pool small_, large_;
  std::unordered_map<void*, Block*> active_;  // handed-out blocks by address (for record_stream)
  std::vector<std::pair<cudaEvent_t, Block*>> pending_;
  std::vector<cudaEvent_t> free_events_;
  MemoryStats stats_;
  std::unordered_map<cudaStream_t, uint64_t> capturing_;  // streams being captured -> their graph's pool
  std::set<uint64_t> live_pools_;                         // pools of graphs that exist
  uint64_t next_pool_ = 1;
};

// One allocator per device, made on first use and never destroyed: tensors that outlive main() (static
// ones) still free into a live allocator, and nothing calls into CUDA while the runtime shuts down.
DeviceAllocator& device_allocator(int device) {
  const int n = device_count();
  KILN_CHECK(n > 0, "CUDA allocator: cuda:", device,
             " was asked for, but no CUDA device is visible (0 GPUs); "
             "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, or keep tensors on Device::cpu()");
  KILN_CHECK(device >= 0 && device < n, "CUDA allocator: device cuda:", device, " does not exist; ", n,
             " GPU(s) are visible");
  static std::unique_ptr<std::atomic<DeviceAllocator*>[]> table(new std::atomic<DeviceAllocator*>[n]());
  static std::mutex create_mutex;
  DeviceAllocator* a = table[device].load(std::memory_order_acquire);
  if (a != nullptr) return *a;
  std::lock_guard<std::mutex> lock(create_mutex);
  a = table[device].load(std::memory_order_relaxed);
  if (a == nullptr) {
    a = new DeviceAllocator(device);
    table[device].store(a, std::memory_order_release);
  }
  return *a;
}

int resolve(int device) {
  if (device < 0) {
    KILN_CHECK(device_count() > 0, "CUDA memory statistics: no CUDA device is visible");
    return current_device();
  }
  return device;
}

}  // namespace

namespace detail {
ReplayInputAllocation::ReplayInputAllocation() { ++t_replay_inputs; }
ReplayInputAllocation::~ReplayInputAllocation() { --t_replay_inputs; }
void allocator_record_stream(int device, void* ptr, cudaStream_t stream) {
  device_allocator(device).record_stream(ptr, stream);
}
uint64_t allocator_begin_capture(int device, cudaStream_t stream) {
  return device_allocator(device).begin_capture(stream);
}
void allocator_end_capture(int device, cudaStream_t stream) { device_allocator(device).end_capture(stream); }
void allocator_release_pool(int device, uint64_t pool) { device_allocator(device).release_pool(pool); }
}  // namespace detail

Allocator& CudaBackend::allocator(int device_index) { return device_allocator(device_index); }

MemoryStats memory_stats(int device) { return device_allocator(resolve(device)).stats(); }

void reset_peak_memory_stats(int device) { device_allocator(resolve(device)).reset_peaks(); }

void empty_cache() {
  internal::detail::release_cached_constants();  // this thread's broadcast constants hold small blocks
  for (int d = 0; d < device_count(); ++d) device_allocator(d).empty_cache();
}

std::string memory_summary(int device) {
  device = resolve(device);
  const MemoryStats s = memory_stats(device);
  auto mib = [](int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%12.2f", static_cast<double>(bytes) / static_cast<double>(kMiB));
    return std::string(buf);
  };
  auto count = [](int64_t n) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%12lld", static_cast<long long>(n));
    return std::string(buf);
  };
  std::string out = ::kiln::detail::str_cat("kiln CUDA caching allocator, cuda:", device,
                                            debug_mode() ? " (KILN_CUDA_ALLOC_DEBUG: not caching)" : "", "\n");
  out += "                      current (MiB)    peak (MiB)\n";
  out += "  allocated         " + mib(s.allocated_bytes) + "  " + mib(s.peak_allocated_bytes) + "\n";
  out += "  reserved          " + mib(s.reserved_bytes) + "  " + mib(s.peak_reserved_bytes) + "\n";
  out += "  active blocks     " + count(s.active_blocks) + "\n";
  out += "  cached blocks     " + count(s.cached_blocks) + "\n";
  out += "  cudaMalloc calls  " + count(s.num_device_mallocs) + "\n";
  out += "  cudaFree calls    " + count(s.num_device_frees) + "\n";
  out += "  alloc retries     " + count(s.num_alloc_retries) + "\n";
  out += "  out of memory     " + count(s.num_ooms) + "\n";
  return out;
}

}  // namespace kiln::cuda
