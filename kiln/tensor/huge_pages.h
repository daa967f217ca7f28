// kiln/tensor/huge_pages.h — large host blocks backed by transparent huge pages.
//
//   void* p = detail::huge_page_alloc(nbytes);  // nbytes >= kHugePageMin; freed by std::free
//
// A table read at random rows (an embedding table of 10^8 rows, its per-row placement and counts: hundreds of MB to
// tens of GB) costs a TLB miss on nearly every access with 4 KiB pages. Such blocks are laid out at 2 MiB boundaries
// and advised as transparent huge pages (madvise MADV_HUGEPAGE), which the kernel backs with 2 MiB pages where it has
// them (/sys/kernel/mm/transparent_hugepage/enabled "always" or "madvise"), keeping 4 KiB ones otherwise. The CPU
// allocator and the pinned host allocator take their blocks of kHugePageMin bytes and more from here.
#pragma once

#include <cstddef>

namespace kiln::detail {

inline constexpr size_t kHugePageMin = size_t{32} << 20;  // blocks from here on are huge-page blocks
inline constexpr size_t kHugePage = size_t{2} << 20;      // the huge page of x86-64 and of Arm64 with 4 KiB pages

// nbytes rounded up to a multiple of kHugePage, at a kHugePage boundary, advised as huge pages; null when the host
// has no memory for them. Freed by std::free.
void* huge_page_alloc(size_t nbytes);

}  // namespace kiln::detail
