// Private to core/: the one parallel runtime (OpenMP) for row kernels.
#pragma once

#include <omp.h>

#include <cstddef>

#include "core/kernels.h"

namespace tapegrad::detail {

/// Runs body(i) for i in [0, n): on the kernel threads when the work (n * cost_per_item scalar
/// operations) is worth a parallel region and we are not already inside one.
template <class Body>
void parallel_for(std::size_t n, std::size_t cost_per_item, Body&& body) {
  constexpr std::size_t min_parallel_work = 1 << 15;
  int threads = num_threads();
  if (threads <= 1 || n < 2 || n * cost_per_item < min_parallel_work || omp_in_parallel()) {
    for (std::size_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::ptrdiff_t i = 0; i < static_cast<std::ptrdiff_t>(n); ++i) body(static_cast<std::size_t>(i));
}

}  // namespace tapegrad::detail
