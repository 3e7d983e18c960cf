// Private to core/: the one parallel runtime (OpenMP) for row kernels and split matrix products.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>

#include "core/threads.h"

namespace tapegrad::detail {

/// Runs product(m0, m, n0, n) on the (m0.., n0..) block of C: whole, or split over the kernel
/// threads along the longer output side into near-equal chunks of 16 rows (a whole tile at 16
/// lanes; 6-row tiles lose at most one partial tile per chunk) or 64 columns (whole panels at every
/// width). 64 rows split 32 + 32, where chunks of 48 rows split them 48 + 16.
template <class Product>
void split_product(std::size_t M, std::size_t N, std::size_t K, Product product) {
  int threads = num_threads();
  constexpr std::size_t min_parallel_flops = 1 << 21;
  if (threads <= 1 || M * N * K < min_parallel_flops || omp_in_parallel()) {
    product(0, M, 0, N);
    return;
  }
  bool split_rows = M >= N;
  std::size_t extent = split_rows ? M : N, unit = split_rows ? 16 : 64;
  std::size_t chunk = ((extent + threads - 1) / threads + unit - 1) / unit * unit;
  std::size_t parts = (extent + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::ptrdiff_t p = 0; p < static_cast<std::ptrdiff_t>(parts); ++p) {
    std::size_t begin = p * chunk, count = std::min(chunk, extent - begin);
    if (split_rows) product(begin, count, 0, N);
    else product(0, M, begin, count);
  }
}

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
