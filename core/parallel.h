// Private to core/: the one parallel runtime (OpenMP) for row kernels.
#pragma once

#include <omp.h>

#include <algorithm>
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

/// dst[j] += term(r, j) for every row r in [0, rows), in row order, for j in [0, cols): the
/// column sums of bias and norm-weight gradients. Threads own slices of 16 columns (a cache line
/// of floats) and walk all the rows, so the sums are the same for every thread count. A slice
/// accumulates in a local array the compiler keeps in registers: summed through dst, every add
/// would be a store and a reload, since dst might alias the rows the terms read.
template <class T, class Term>
void column_sums(T* dst, std::size_t rows, std::size_t cols, std::size_t cost_per_term, Term&& term) {
  constexpr std::size_t slice = 16;
  parallel_for((cols + slice - 1) / slice, rows * slice * cost_per_term, [&](std::size_t part) {
    const std::size_t j0 = part * slice, n = std::min(slice, cols - j0);
    T acc[slice];
    std::copy_n(dst + j0, n, acc);
    if (n == slice) {  // a fixed trip count: whole vectors
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t j = 0; j < slice; ++j) acc[j] += term(r, j0 + j);
    } else {
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t j = 0; j < n; ++j) acc[j] += term(r, j0 + j);
    }
    std::copy_n(acc, n, dst + j0);
  });
}

}  // namespace tapegrad::detail
