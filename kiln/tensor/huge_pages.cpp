#include "kiln/tensor/huge_pages.h"

#include <sys/mman.h>  // madvise

#include <cstdlib>  // std::aligned_alloc

namespace kiln::detail {

void* huge_page_alloc(size_t nbytes) {
  const size_t size = (nbytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, size);
  if (p != nullptr) (void)madvise(p, size, MADV_HUGEPAGE);  // advice only: without huge pages it changes nothing
  return p;
}

}  // namespace kiln::detail
