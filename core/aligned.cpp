#include "core/aligned.h"

#include <sys/mman.h>

namespace tapegrad {

std::byte* allocate_huge_pages(std::size_t bytes) {
  if (bytes > std::size_t(-1) - huge_page_bytes) throw std::bad_alloc();
  const std::size_t size = (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
  auto* data = static_cast<std::byte*>(std::aligned_alloc(huge_page_bytes, size));
  if (!data) throw std::bad_alloc();
  madvise(data, size, MADV_HUGEPAGE);  // a hint: without it (or THP) the pages are 4 KB
  return data;
}

}  // namespace tapegrad
