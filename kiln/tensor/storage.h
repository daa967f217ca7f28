// kiln/tensor/storage.h — reference-counted memory that tensors view, and the allocator interface.
//
//   auto storage = std::make_shared<Storage>(nbytes, cpu_allocator());
//   void* p = storage->data();
//
// Backends provide allocators: aligned host memory here; pinned host memory and the caching CUDA
// allocator come with the CUDA backend. A Storage frees its memory through the allocator that made it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "kiln/tensor/device.h"

namespace kiln {

// Owning pointer to raw memory; the deleter returns it to whoever allocated it.
using DataPtr = std::unique_ptr<void, std::function<void(void*)>>;

// Hands out raw memory on one device (implemented by the backends).
class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns at least nbytes of memory on device(), or throws (OutOfMemoryError for exhaustion).
  // nbytes == 0 may return a null DataPtr.
  virtual DataPtr allocate(size_t nbytes) = 0;
  virtual Device device() const = 0;  // where its memory is
};

// 64-byte aligned host memory (cache lines; the widest vector loads).
Allocator& cpu_allocator();

// A block of memory on one device, shared by every tensor that views it, with a version counter for autograd.
class Storage {
 public:
  // nbytes of memory from `allocator`, which frees it too.
  Storage(size_t nbytes, Allocator& allocator)
      : data_(allocator.allocate(nbytes)), nbytes_(nbytes), device_(allocator.device()), allocator_(&allocator) {}
  // Wraps memory someone else owns; `deleter` (may be empty) runs when the last tensor lets go.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
      : data_(
            data, deleter ? std::move(deleter) : [](void*) {}),
        nbytes_(nbytes),
        device_(device) {}

  // The start of the memory (may be null when nbytes() is 0).
  void* data() const { return data_.get(); }
  // The size in bytes.
  size_t nbytes() const { return nbytes_; }
  // The device the memory is on.
  Device device() const { return device_; }
  // The allocator that made this memory; null for memory wrapped from elsewhere.
  Allocator* allocator() const { return allocator_; }

  // Counts writes through any view of this storage; autograd compares it to detect in-place changes
  // to tensors that backward still needs.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  // Records one in-place write (ops call it after writing).
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  DataPtr data_;
  size_t nbytes_;
  Device device_;
  Allocator* allocator_ = nullptr;
  std::atomic<uint64_t> version_{0};
};

}  // namespace kiln
