#include "kiln/tensor/storage.h"

#include <cstdlib>  // std::aligned_alloc, std::free
#include <new>

#include "kiln/tensor/error.h"

namespace kiln {
namespace {

class CpuAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return DataPtr(nullptr, [](void*) {});
    constexpr size_t kAlign = 64;
    const size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    KILN_CHECK_AS(OutOfMemoryError, p != nullptr, "CPU allocator: could not allocate ", nbytes,
                  " bytes of host memory; reduce the batch size or the tensor sizes");
    return DataPtr(p, [](void* q) { std::free(q); });
  }
  Device device() const override { return Device::cpu(); }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator instance;
  return instance;
}

}  // namespace kiln
