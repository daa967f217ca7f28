// kiln/tensor/small_alloc.h — per-thread caches for the small allocations every op makes.
//
//   std::shared_ptr<TensorImpl> impl = kiln::make_pooled<TensorImpl>(storage, dtype, sizes, strides, 0);
//
// A tensor op on small tensors is dominated by allocation: the result's TensorImpl and Storage, its
// memory, and under autograd a graph node and the tensor's autograd state. glibc's malloc keeps only a
// few freed chunks per size for reuse, so a chain of thousands of live temporaries (a training step's
// graph) falls to its slow paths. These caches keep freed blocks per size class and thread, bounded in
// bytes, and hand them out again LIFO. Memory freed on another thread joins that thread's cache.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

namespace kiln {
namespace detail {

inline constexpr size_t kMaxPooledObject = 512;   // objects up to this size come from the object cache
inline constexpr size_t kMaxPooledBlock = 32768;  // tensor memory up to this size from the block cache

// Objects: 16-byte granularity; alignment of operator new. bytes <= kMaxPooledObject.
void* pooled_object_alloc(size_t bytes);
void pooled_object_free(void* p, size_t bytes) noexcept;

// Tensor memory: 64-byte aligned, power-of-two classes from 64 B to kMaxPooledBlock. *class_out receives the
// class to pass back to pooled_block_free. Returns null on exhaustion.
void* pooled_block_alloc(size_t bytes, int* class_out);
void pooled_block_free(void* p, int size_class) noexcept;

}  // namespace detail

// A std::allocator replacement that draws small objects from the per-thread object cache.
template <typename T>
struct PooledAllocator {
  using value_type = T;  // the allocated type
  PooledAllocator() = default;
  template <typename U>
  // From an allocator of another type (it has no state).
  PooledAllocator(const PooledAllocator<U>&) {}  // NOLINT: rebinding, as allocate_shared needs
  T* allocate(size_t n) {                        // n objects: from the cache when small enough, else operator new
    const size_t bytes = n * sizeof(T);
    if (bytes <= detail::kMaxPooledObject && alignof(T) <= alignof(std::max_align_t)) {
      return static_cast<T*>(detail::pooled_object_alloc(bytes));
    }
    return static_cast<T*>(::operator new(bytes));
  }
  void deallocate(T* p, size_t n) noexcept {  // returns what allocate(n) gave
    const size_t bytes = n * sizeof(T);
    if (bytes <= detail::kMaxPooledObject && alignof(T) <= alignof(std::max_align_t)) {
      detail::pooled_object_free(p, bytes);
    } else {
      ::operator delete(p);
    }
  }
  template <typename U>
  bool operator==(const PooledAllocator<U>&) const {  // always true: all share the caches
    return true;
  }
};

// std::make_shared with the object and its control block from the per-thread object cache.
template <typename T, typename... Args>
std::shared_ptr<T> make_pooled(Args&&... args) {
  return std::allocate_shared<T>(PooledAllocator<T>(), std::forward<Args>(args)...);
}

}  // namespace kiln
