// The caching allocator of page-locked host memory.
//
// cudaHostAlloc pins pages and maps them for every GPU, which costs far more than the copies it speeds
// up, so freed buffers are kept and reused. A freed buffer may still be the source or target of an
// asynchronous copy, so an event is recorded on the current stream at free time and the buffer is
// handed out again only once that event has completed.
//
// A block of at least detail::kHugePageMin bytes (an nn::HybridEmbedding's cold tier: tens of GB) is instead a
// huge-page block (kiln/tensor/huge_pages.h) registered with CUDA (cudaHostRegister, portable and mapped), so that
// pinning it walks 512 times fewer pages and the GPU's reads of it at random rows need fewer translations. Kernels
// read such memory at its host address, so this path is taken only where every device can (the attribute
// cudaDevAttrCanUseHostPointerForRegisteredMem); otherwise cudaHostAlloc as for small blocks.
#include <cuda_runtime.h>

#include <bit>
#include <cstdint>
#include <cstdlib>  // std::free: huge-page blocks
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kiln/tensor/cuda.h"
#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/huge_pages.h"  // detail::huge_page_alloc: the large blocks

namespace kiln::cuda {
namespace {

constexpr size_t kMinSize = 512;
constexpr size_t kPowerOfTwoLimit = size_t{16} << 20;  // above: multiples of 2 MiB, not powers of two
constexpr size_t kLargeRound = size_t{2} << 20;
constexpr size_t kMaxRequest = size_t{1} << 62;

// Size classes make reuse likely: powers of two up to 16 MiB, then 2 MiB steps (doubling a 1 GiB
// buffer would waste too much pinned memory, which the OS cannot page out).
size_t size_class(size_t n) {
  if (n <= kMinSize) return kMinSize;
  if (n <= kPowerOfTwoLimit) return std::bit_ceil(n);
  return (n + kLargeRound - 1) / kLargeRound * kLargeRound;
}

struct HostBlock {
  void* ptr = nullptr;
  size_t size = 0;
  bool registered = false;  // a huge-page block, cudaHostRegister'ed (freed by cudaHostUnregister + std::free)
};

// Whether every visible device reads registered host memory at its host address.
bool devices_use_host_pointers() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return false;
  }
  for (int d = 0; d < count; ++d) {
    int can = 0;
    if (cudaDeviceGetAttribute(&can, cudaDevAttrCanUseHostPointerForRegisteredMem, d) != cudaSuccess || can == 0) {
      (void)cudaGetLastError();
      return false;
    }
  }
  return true;
}

// `size` bytes of page-locked memory: where `huge`, a huge-page block registered with CUDA, else cudaHostAlloc's
// (portable: pinned for every device, so copies to any GPU run asynchronously). Null when the host has no memory for
// them (or registration fails for want of memory).
void* try_pin(size_t size, bool huge) {
  void* ptr = nullptr;
  if (!huge) {
    const cudaError_t err = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    KILN_CUDA_CHECK(err, "pinned host allocator");
    return ptr;
  }
  ptr = kiln::detail::huge_page_alloc(size);
  if (ptr == nullptr) return nullptr;
  const cudaError_t err = cudaHostRegister(ptr, size, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    std::free(ptr);
    if (err == cudaErrorMemoryAllocation) return nullptr;
    KILN_CUDA_CHECK(err, "pinned host allocator (cudaHostRegister)");
  }
  return ptr;
}

void free_block(HostBlock* b) {
  if (b->registered) {
    KILN_CUDA_CHECK(cudaHostUnregister(b->ptr), "pinned host allocator");
    std::free(b->ptr);
  } else {
    KILN_CUDA_CHECK(cudaFreeHost(b->ptr), "pinned host allocator");
  }
}

class PinnedAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }

  DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return DataPtr(nullptr, [](void*) {});
    KILN_CHECK_AS(OutOfMemoryError, nbytes <= kMaxRequest, "pinned host allocator: cannot allocate ", nbytes,
                  " bytes of page-locked memory");
    const size_t size = size_class(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    process_events();
    HostBlock* block = take_cached(size);
    if (block == nullptr) block = host_alloc(size);
    return DataPtr(block->ptr, [this, block](void*) { free(block); });
  }

 private:
  HostBlock* take_cached(size_t size) {
    // Best fit, but never a block more than twice the size class (a tiny tensor must not pin a huge one).
    auto it = free_.lower_bound(size);
    if (it == free_.end() || it->first > 2 * size) return nullptr;
    HostBlock* b = it->second;
    free_.erase(it);
    cached_bytes_ -= b->size;
    return b;
  }

  HostBlock* host_alloc(size_t size) {
    const bool huge = size >= kiln::detail::kHugePageMin && huge_pages_;
    void* ptr = try_pin(size, huge);
    if (ptr == nullptr) {  // out of memory: free the cached blocks and try once more
      synchronize_events();
      release_cached();
      ptr = try_pin(size, huge);
    }
    if (ptr == nullptr) {
      throw OutOfMemoryError(::kiln::detail::str_cat(
          "pinned host allocator: out of page-locked memory allocating ", size, " bytes (", cached_bytes_,
          " bytes cached); use smaller pinned buffers, or raise the locked-memory limit (ulimit -l)"));
    }
    return new HostBlock{ptr, size, huge};
  }

  // The DataPtr's deleter: must not throw. If no event can be recorded (a broken context, or the runtime
  // unloading at exit), the block is leaked rather than reused while a copy might still read it.
  void free(HostBlock* block) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      const int device = current_device();
      const cudaStream_t stream = static_cast<cudaStream_t>(current_stream(device).handle());
      cudaEvent_t e = get_event(device);
      const cudaError_t err = cudaEventRecord(e, stream);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        events_[device].push_back(e);
        return;
      }
      pending_.push_back({e, device, block});
    } catch (...) {
    }
  }

  cudaEvent_t get_event(int device) {
    auto& pool = events_[device];
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;  // `device` is current (the caller asked current_device())
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "pinned host allocator");
    return e;
  }

  void done(size_t i) {
    events_[pending_[i].device].push_back(pending_[i].event);
    free_.emplace(pending_[i].block->size, pending_[i].block);
    cached_bytes_ += pending_[i].block->size;
  }

  void process_events() {
    size_t kept = 0;
    for (size_t i = 0; i < pending_.size(); ++i) {
      const cudaError_t err = cudaEventQuery(pending_[i].event);
      if (err == cudaSuccess) {
        done(i);
        continue;
      }
      if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
      } else {
        // A failed event cannot say when the copy ended: keep the block out (leaked), report nothing here;
        // the next checked CUDA call reports the broken context.
        (void)cudaGetLastError();
        continue;
      }
      pending_[kept++] = pending_[i];
    }
    pending_.resize(kept);
  }

  void synchronize_events() {
    for (size_t i = 0; i < pending_.size(); ++i) {
      KILN_CUDA_CHECK(cudaEventSynchronize(pending_[i].event), "pinned host allocator");
      done(i);
    }
    pending_.clear();
  }

  void release_cached() {
    for (auto& [size, b] : free_) {
      free_block(b);
      cached_bytes_ -= b->size;
      delete b;
    }
    free_.clear();
  }

  struct Pending {
    cudaEvent_t event;
    int device;
    HostBlock* block;
  };

  std::mutex mutex_;
  std::multimap<size_t, HostBlock*> free_;          // reusable now, by size
  std::vector<Pending> pending_;                    // freed, waiting for the copies queued before the free
  std::map<int, std::vector<cudaEvent_t>> events_;  // spare events of each device
  size_t cached_bytes_ = 0;
  const bool huge_pages_ = devices_use_host_pointers();
};

}  // namespace

// Never destroyed: pinned tensors that outlive main() still free into a live allocator.
Allocator& pinned_allocator() {
  static PinnedAllocator* instance = new PinnedAllocator;
  return *instance;
}

}  // namespace kiln::cuda
