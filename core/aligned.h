// Vectors whose storage starts on a 64-byte cache line, as a Tensor's does. A std::vector's large
// buffers start 16 bytes into a line (glibc's malloc), so every 64-byte (16-float) SIMD load or
// store of their rows touches two lines and costs about two: the decoding pass's rows and the
// kernels' packed panels are kept on these instead. Buffers that are streamed from memory (packed
// weights, the KV cache) go on 2 MB pages as well.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace tapegrad {

/// An allocator whose storage starts on a 64-byte cache line.
template <class T>
struct CacheLineAllocator {
  using value_type = T;                          ///< The element type.
  static constexpr std::size_t alignment = 64;  ///< Bytes: one cache line, one AVX-512 vector.

  CacheLineAllocator() = default;
  /// The same allocator for another element type.
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}

  /// Storage for n elements, starting on a cache line.
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{alignment})); }
  /// Frees storage from allocate().
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{alignment}); }
  /// Any instance frees what another allocated.
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
};

/// A std::vector whose elements start on a cache line.
template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

/// Makes a kernel's scratch vector hold at least n elements, never fewer than before: a resize that
/// grows value-initialises the new part, a memset each time when calls alternate sizes (0.7% of
/// SmolLM2's float32 fine-tuning step, in packed_gemm's panels).
template <class Vector>
void grow_to(Vector& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

/// The size of a huge page (x86-64's 2 MB).
inline constexpr std::size_t huge_page_bytes = std::size_t(2) << 20;

/// Storage for `bytes` bytes (rounded up to whole huge pages), starting on a 2 MB boundary and asked
/// to be on 2 MB pages (transparent huge pages on request, where the kernel gives them): a buffer
/// read from memory on 4 KB pages takes a TLB miss every 4 KB. Freed with std::free. Throws
/// std::bad_alloc.
std::byte* allocate_huge_pages(std::size_t bytes);

/// CacheLineAllocator's, on 2 MB pages (allocate_huge_pages) from 2 MB up: for the large buffers a
/// step reads from memory. The KV cache: attention of one query over 256 positions of SmolLM2's
/// 16-bit cache, 480 sequence-layers from memory, 7.8-8.1 ms on 4 KB pages, 6.8-7.0 on 2 MB (one
/// Zen 4 core).
template <class T>
struct HugePageAllocator {
  using value_type = T;  ///< The element type.

  HugePageAllocator() = default;
  /// The same allocator for another element type.
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  /// Storage for n elements: on 2 MB pages from 2 MB, else on a cache line.
  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_page_bytes) return CacheLineAllocator<T>().allocate(n);
    return reinterpret_cast<T*>(allocate_huge_pages(bytes));
  }
  /// Frees storage from allocate(n).
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) < huge_page_bytes) return CacheLineAllocator<T>().deallocate(p, n);
    std::free(p);
  }
  /// Any instance frees what another allocated.
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

/// A std::vector on 2 MB pages when large (HugePageAllocator).
template <class T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace tapegrad
