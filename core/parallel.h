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
  constexpr std::size_t W = Batch<T>::size;
  T m = x[0];
  std::size_t i = 0;
  if (n >= W) {
    Batch<T> acc = Batch<T>::load_unaligned(x);
    for (i = W; i + W <= n; i += W) acc = xsimd::max(acc, Batch<T>::load_unaligned(x + i));
    alignas(64) T lanes[W];
    acc.store_aligned(lanes);
    m = *std::max_element(lanes, lanes + W);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

/// sum(exp(x[i] - shift)), x unchanged.
template <class T>
T sum_exp_shifted(const T* x, std::size_t n, T shift) {
  constexpr std::size_t W = Batch<T>::size;
  Batch<T> acc(T(0)), s(shift);
  std::size_t i = 0;
  for (; i + W <= n; i += W) acc += xsimd::exp(Batch<T>::load_unaligned(x + i) - s);
  T sum = xsimd::hadd(acc);
  for (; i < n; ++i) sum += std::exp(x[i] - shift);
  return sum;
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

// c[0:V*W] = alpha * sum_k a[k * a_stride] * b[k * ldb + 0:V*W] (+ c when accumulating), with the
// V column vectors in registers across all of k, and U independent chains over k so that short
// rows still keep the FMA units busy (FMA latency is 4-5 cycles).
template <class T, std::size_t V>
inline void row_block(T* c, const T* a, std::size_t a_stride, const T* b, std::size_t ldb, std::size_t K, T alpha,
                      bool accumulate) {
  using B = Batch<T>;
  constexpr std::size_t W = B::size, U = V >= 4 ? 1 : 4 / V;
  B sum[U][V];
  for (auto& chain : sum)
    for (auto& s : chain) s = B(T(0));
  std::size_t k = 0;
  for (; k + U <= K; k += U)
    for (std::size_t u = 0; u < U; ++u) {
      B scale(a[(k + u) * a_stride]);
      const T* row = b + (k + u) * ldb;
      for (std::size_t v = 0; v < V; ++v) sum[u][v] = xsimd::fma(scale, B::load_unaligned(row + v * W), sum[u][v]);
    }
  for (; k < K; ++k) {
    B scale(a[k * a_stride]);
    for (std::size_t v = 0; v < V; ++v) sum[0][v] = xsimd::fma(scale, B::load_unaligned(b + k * ldb + v * W), sum[0][v]);
  }
  for (std::size_t v = 0; v < V; ++v) {
    B total = sum[0][v];
    for (std::size_t u = 1; u < U; ++u) total += sum[u][v];
    total *= B(alpha);
    if (accumulate) total += B::load_unaligned(c + v * W);
    total.store_unaligned(c + v * W);
  }
}

/// One row of a matrix product without BLAS: c[0:n] (+)= alpha * sum_k a[k * a_stride] * b[k * ldb + 0:n].
/// For the small products BLAS handles badly (its packing dominates): decoding and attention.
template <class T>
void row_times_matrix(T* c, const T* a, std::size_t a_stride, const T* b, std::size_t ldb, std::size_t K,
                      std::size_t n, T alpha, bool accumulate) {
  constexpr std::size_t W = Batch<T>::size;
  std::size_t j = 0;
  for (; j + 8 * W <= n; j += 8 * W) row_block<T, 8>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate);
  if (j + 4 * W <= n) row_block<T, 4>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate), j += 4 * W;
  if (j + 2 * W <= n) row_block<T, 2>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate), j += 2 * W;
  if (j + W <= n) row_block<T, 1>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate), j += W;
  for (; j < n; ++j) {
    T sum = 0;
    for (std::size_t k = 0; k < K; ++k) sum += a[k * a_stride] * b[k * ldb + j];
    c[j] = alpha * sum + (accumulate ? c[j] : T(0));
  }
}

/// c[n] (+)= alpha * a . b[n * ldb + 0:K] for n in groups of W rows (attention scores of one query
/// against cached keys): W dot products share each load of a and end in one horizontal add
/// (haddp) instead of W. Returns how many of the N outputs it wrote (a multiple of W; 0 unless
/// K is a multiple of W); the caller finishes the rest.
template <class T>
std::size_t dots_with_rows(T* c, const T* a, const T* b, std::size_t ldb, std::size_t K, std::size_t N, T alpha,
                           bool accumulate) {
  using B = Batch<T>;
  constexpr std::size_t W = B::size;
  if (K % W != 0) return 0;
  std::size_t n = 0;
  for (; n + W <= N; n += W) {
    B acc[W];
    for (auto& x : acc) x = B(T(0));
    for (std::size_t k = 0; k < K; k += W) {
      B x = B::load_unaligned(a + k);
      for (std::size_t r = 0; r < W; ++r) acc[r] = xsimd::fma(x, B::load_unaligned(b + (n + r) * ldb + k), acc[r]);
    }
    B sums = xsimd::haddp(acc) * B(alpha);
    if (accumulate) sums += B::load_unaligned(c + n);
    sums.store_unaligned(c + n);
  }
  return n;
}

/// dst (cols, rows) = src (rows, cols) with row stride ld_src, transposed into a packed buffer.
template <class T>
void transpose_into(T* dst, const T* src, std::size_t rows, std::size_t cols, std::size_t ld_src) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * ld_src + c];
}

}  // namespace tapegrad::detail
