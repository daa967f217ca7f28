#include "kiln/tensor/huge_pages.h"

#include <sys/mman.h>  // madvise

#include <cstdlib>  // std::aligned_alloc

namespace kiln::detail {

size_t huge_page_size(size_t nbytes) { return (nbytes + kHugePage - 1) / kHugePage * kHugePage; }

void* huge_page_alloc(size_t nbytes) {
  const size_t size = huge_page_size(nbytes);
  void* p = std::aligned_alloc(kHugePage, size);
  if (p != nullptr) (void)madvise(p, size, MADV_HUGEPAGE);  // advice only: without huge pages it changes nothing
  return p;
}

}  // namespace kiln::detail
