#include "core/aligned.h"

#include <sys/mman.h>

namespace tapegrad {

std::byte* allocate_huge_pages(std::size_t bytes) {
  auto* data = static_cast<std::byte*>(std::aligned_alloc(huge_page_bytes, bytes));
  if (!data) throw std::bad_alloc();
  madvise(data, bytes, MADV_HUGEPAGE);  // a hint: without it (or THP) the pages are 4 KB
  return data;
}

}  // namespace tapegrad
