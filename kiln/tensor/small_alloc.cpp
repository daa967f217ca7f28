// The per-thread caches of small_alloc.h: intrusive LIFO free lists per size class, bounded in bytes.
#include "kiln/tensor/small_alloc.h"

#include <array>
#include <cstdlib>

namespace kiln::detail {
namespace {

constexpr size_t kObjectGranule = 16;
constexpr size_t kNumObjectClasses = kMaxPooledObject / kObjectGranule;  // 16 B ... 512 B
constexpr size_t kBlockAlign = 64;
constexpr size_t kNumBlockClasses = 10;          // 64 B << 0 ... 64 B << 9 = 32 KiB
constexpr size_t kCacheBytesPerClass = 1 << 20;  // at most 1 MiB kept per class and thread

struct FreeList {
  void* head = nullptr;
  size_t count = 0;
};

template <size_t N>
struct Lists {
  std::array<FreeList, N> lists{};
};

struct ThreadCache {
  Lists<kNumObjectClasses> objects;
  Lists<kNumBlockClasses> blocks;
  ~ThreadCache();
};

// Set once this thread's cache is destroyed (thread exit): later frees go straight to the system.
// A trivially destructible thread_local stays readable after that.
thread_local bool t_cache_gone = false;

ThreadCache* thread_cache() {
  if (t_cache_gone) return nullptr;
  thread_local ThreadCache cache;
  return &cache;
}

void* pop(FreeList& l) {
  void* p = l.head;
  if (p != nullptr) {
    l.head = *static_cast<void**>(p);
    --l.count;
  }
  return p;
}

bool push(FreeList& l, void* p, size_t block_bytes) {
  if ((l.count + 1) * block_bytes > kCacheBytesPerClass) return false;
  *static_cast<void**>(p) = l.head;
  l.head = p;
  ++l.count;
  return true;
}

ThreadCache::~ThreadCache() {
  for (FreeList& l : objects.lists) {
    while (void* p = pop(l)) ::operator delete(p);
  }
  for (FreeList& l : blocks.lists) {
    while (void* p = pop(l)) std::free(p);
  }
  t_cache_gone = true;
}

size_t object_class(size_t bytes) { return bytes == 0 ? 0 : (bytes - 1) / kObjectGranule; }

}  // namespace

void* pooled_object_alloc(size_t bytes) {
  const size_t c = object_class(bytes);
  if (ThreadCache* cache = thread_cache()) {
    if (void* p = pop(cache->objects.lists[c])) return p;
  }
  return ::operator new((c + 1) * kObjectGranule);
}

void pooled_object_free(void* p, size_t bytes) noexcept {
  const size_t c = object_class(bytes);
  ThreadCache* cache = thread_cache();
  if (cache == nullptr || !push(cache->objects.lists[c], p, (c + 1) * kObjectGranule)) ::operator delete(p);
}

void* pooled_block_alloc(size_t bytes, int* class_out) {
  size_t c = 0;
  while ((kBlockAlign << c) < bytes) ++c;
  *class_out = static_cast<int>(c);
  if (ThreadCache* cache = thread_cache()) {
    if (void* p = pop(cache->blocks.lists[c])) return p;
  }
  return std::aligned_alloc(kBlockAlign, kBlockAlign << c);
}

void pooled_block_free(void* p, int size_class) noexcept {
  const auto c = static_cast<size_t>(size_class);
  ThreadCache* cache = thread_cache();
  if (cache == nullptr || !push(cache->blocks.lists[c], p, kBlockAlign << c)) std::free(p);
}

}  // namespace kiln::detail
