#include "kiln/tensor/storage.h"

#include <cstdlib>  // std::aligned_alloc, std::free

#include "kiln/tensor/error.h"
#include "kiln/tensor/huge_pages.h"
#include "kiln/tensor/small_alloc.h"

namespace kiln {
namespace {

class CpuAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return DataPtr(nullptr, [](void*) {});
    constexpr size_t kAlign = 64;  // cache lines; the widest vector loads
    void* p = nullptr;
    if (nbytes <= detail::kMaxPooledBlock) {
      // Small tensors are made and freed at a high rate: reuse freed blocks (small_alloc.h).
      int size_class = 0;
      p = detail::pooled_block_alloc(nbytes, &size_class);
      check(p, nbytes);
      return DataPtr(p, [size_class](void* q) { detail::pooled_block_free(q, size_class); });
    }
    // Large arrays (read at random rows, as an embedding table's) on huge pages (huge_pages.h).
    p = nbytes >= detail::kHugePageMin ? detail::huge_page_alloc(nbytes)
                                       : std::aligned_alloc(kAlign, (nbytes + kAlign - 1) / kAlign * kAlign);
    check(p, nbytes);
    return DataPtr(p, [](void* q) { std::free(q); });
  }
  Device device() const override { return Device::cpu(); }

 private:
  static void check(void* p, size_t nbytes) {
    KILN_CHECK_AS(OutOfMemoryError, p != nullptr, "CPU allocator: could not allocate ", nbytes,
                  " bytes of host memory; reduce the batch size or the tensor sizes");
  }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator instance;
  return instance;
}

}  // namespace kiln
