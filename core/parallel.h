// Private to core/: the one parallel runtime (OpenMP) and small SIMD helpers for row kernels.
#pragma once

#include <omp.h>
#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cmath>
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

template <class T> using Batch = xsimd::batch<T>;

/// sum(a[i] * b[i]) with SIMD lanes as partial sums.
template <class T>
T dot(const T* a, const T* b, std::size_t n) {
  constexpr std::size_t W = Batch<T>::size;
  Batch<T> acc0(T(0)), acc1(T(0));
  std::size_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    acc0 = xsimd::fma(Batch<T>::load_unaligned(a + i), Batch<T>::load_unaligned(b + i), acc0);
    acc1 = xsimd::fma(Batch<T>::load_unaligned(a + i + W), Batch<T>::load_unaligned(b + i + W), acc1);
  }
  for (; i + W <= n; i += W) acc0 = xsimd::fma(Batch<T>::load_unaligned(a + i), Batch<T>::load_unaligned(b + i), acc0);
  T sum = xsimd::hadd(acc0 + acc1);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

template <class T>
T max_of(const T* x, std::size_t n) {
  T m = x[0];
  for (std::size_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

/// x[i] = exp(x[i] - shift) in place; returns the sum of the new values.
template <class T>
T exp_shifted_sum(T* x, std::size_t n, T shift) {
  constexpr std::size_t W = Batch<T>::size;
  Batch<T> acc(T(0)), s(shift);
  std::size_t i = 0;
  for (; i + W <= n; i += W) {
    Batch<T> e = xsimd::exp(Batch<T>::load_unaligned(x + i) - s);
    e.store_unaligned(x + i);
    acc += e;
  }
  T sum = xsimd::hadd(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

}  // namespace tapegrad::detail
