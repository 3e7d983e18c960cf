// Vectors whose storage starts on a 64-byte cache line, as a Tensor's does. A std::vector's large
// buffers start 16 bytes into a line (glibc's malloc), so every 64-byte (16-float) SIMD load or
// store of their rows touches two lines and costs about two: the KV cache, the decoding pass's rows
// and the kernels' packed panels are kept on these instead.
#pragma once

#include <cstddef>
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

}  // namespace tapegrad
