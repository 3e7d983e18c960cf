// Private to core/: width-generic SIMD helpers for row kernels. Each is a template on the batch
// type B (xsimd::batch<T, Arch>, or the emulated wide batch of the tests), so the same code runs
// at 2, 4, 8 and 16 lanes. They use only loads, stores, lane-wise arithmetic, fma, max, exp and
// hadd (the sum of one batch's lanes); tests/core/test_simd.cpp checks each of those primitives and
// each helper against a scalar loop at every level. fma, max, exp and hadd are called
// unqualified so that a test batch type supplies its own by argument-dependent lookup.
#pragma once

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace tapegrad::detail {

using xsimd::exp;
using xsimd::fma;
using xsimd::hadd;
using xsimd::max;

/// sum(a[i] * b[i]) with SIMD lanes as partial sums.
template <class B>
typename B::value_type dot(const typename B::value_type* a, const typename B::value_type* b, std::size_t n) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  B acc0(T(0)), acc1(T(0));
  std::size_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    acc0 = fma(B::load_unaligned(a + i), B::load_unaligned(b + i), acc0);
    acc1 = fma(B::load_unaligned(a + i + W), B::load_unaligned(b + i + W), acc1);
  }
  for (; i + W <= n; i += W) acc0 = fma(B::load_unaligned(a + i), B::load_unaligned(b + i), acc0);
  T sum = hadd(acc0 + acc1);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

/// max(x[0:n]); n >= 1.
template <class B>
typename B::value_type max_of(const typename B::value_type* x, std::size_t n) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  T m = x[0];
  std::size_t i = 0;
  if (n >= W) {
    B acc = B::load_unaligned(x);
    for (i = W; i + W <= n; i += W) acc = max(acc, B::load_unaligned(x + i));
    alignas(64) T lanes[W];
    acc.store_aligned(lanes);
    m = *std::max_element(lanes, lanes + W);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

/// sum(exp(x[i] - shift)), x unchanged.
template <class B>
typename B::value_type sum_exp_shifted(const typename B::value_type* x, std::size_t n, typename B::value_type shift) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  B acc(T(0)), s(shift);
  std::size_t i = 0;
  for (; i + W <= n; i += W) acc += exp(B::load_unaligned(x + i) - s);
  T sum = hadd(acc);
  for (; i < n; ++i) sum += std::exp(x[i] - shift);
  return sum;
}

/// x[i] = exp(x[i] - shift) in place; returns the sum of the new values.
template <class B>
typename B::value_type exp_shifted_sum(typename B::value_type* x, std::size_t n, typename B::value_type shift) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  B acc(T(0)), s(shift);
  std::size_t i = 0;
  for (; i + W <= n; i += W) {
    B e = exp(B::load_unaligned(x + i) - s);
    e.store_unaligned(x + i);
    acc += e;
  }
  T sum = hadd(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

/// Lane r of the result is the sum of the lanes of acc[r]. xsimd::haddp does it in one shuffle
/// network, but xsimd 8.1 returns the sums of 16-lane float batches in a permuted order (rows
/// 2-3 and 4-5 swapped, likewise 10-11 and 12-13), so 16 lanes, and batch types without haddp
/// (the tests' emulated ones), take one hadd per row instead.
template <class B>
B sums_of_lanes(const B* acc) {
  using T = typename B::value_type;
  if constexpr (B::size < 16 && requires { xsimd::haddp(acc); }) {
    return xsimd::haddp(acc);
  } else {
    alignas(64) T sums[B::size];
    for (std::size_t r = 0; r < B::size; ++r) sums[r] = hadd(acc[r]);
    return B::load_aligned(sums);
  }
}

// c[0:V*W] = alpha * sum_k a[k * a_stride] * b[k * ldb + 0:V*W] (+ c when accumulating), with the
// V column vectors in registers across all of k, and U independent chains over k so that short
// rows still keep the FMA units busy (FMA latency is 4-5 cycles).
template <class B, std::size_t V>
inline void row_block(typename B::value_type* c, const typename B::value_type* a, std::size_t a_stride,
                      const typename B::value_type* b, std::size_t ldb, std::size_t K, typename B::value_type alpha,
                      bool accumulate) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size, U = V >= 4 ? 1 : 4 / V;
  B sum[U][V];
  for (auto& chain : sum)
    for (auto& s : chain) s = B(T(0));
  std::size_t k = 0;
  for (; k + U <= K; k += U)
    for (std::size_t u = 0; u < U; ++u) {
      B scale(a[(k + u) * a_stride]);
      const T* row = b + (k + u) * ldb;
      for (std::size_t v = 0; v < V; ++v) sum[u][v] = fma(scale, B::load_unaligned(row + v * W), sum[u][v]);
    }
  for (; k < K; ++k) {
    B scale(a[k * a_stride]);
    for (std::size_t v = 0; v < V; ++v) sum[0][v] = fma(scale, B::load_unaligned(b + k * ldb + v * W), sum[0][v]);
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
template <class B>
void row_times_matrix(typename B::value_type* c, const typename B::value_type* a, std::size_t a_stride,
                      const typename B::value_type* b, std::size_t ldb, std::size_t K, std::size_t n,
                      typename B::value_type alpha, bool accumulate) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  std::size_t j = 0;
  for (; j + 8 * W <= n; j += 8 * W) row_block<B, 8>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate);
  if (j + 4 * W <= n) row_block<B, 4>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate), j += 4 * W;
  if (j + 2 * W <= n) row_block<B, 2>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate), j += 2 * W;
  if (j + W <= n) row_block<B, 1>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate), j += W;
  for (; j < n; ++j) {
    T sum = 0;
    for (std::size_t k = 0; k < K; ++k) sum += a[k * a_stride] * b[k * ldb + j];
    c[j] = alpha * sum + (accumulate ? c[j] : T(0));
  }
}

/// c[n] (+)= alpha * a . b[n * ldb + 0:K] for n in groups of W rows (attention scores of one query
/// against cached keys): W dot products share each load of a. Returns how many of the N outputs
/// it wrote (a multiple of W; 0 unless K is a multiple of W); the caller finishes the rest.
template <class B>
std::size_t dots_with_rows(typename B::value_type* c, const typename B::value_type* a,
                           const typename B::value_type* b, std::size_t ldb, std::size_t K, std::size_t N,
                           typename B::value_type alpha, bool accumulate) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  if (K % W != 0) return 0;
  std::size_t n = 0;
  for (; n + W <= N; n += W) {
    B acc[W];
    for (auto& x : acc) x = B(T(0));
    for (std::size_t k = 0; k < K; k += W) {
      B x = B::load_unaligned(a + k);
      for (std::size_t r = 0; r < W; ++r) acc[r] = fma(x, B::load_unaligned(b + (n + r) * ldb + k), acc[r]);
    }
    B sums = sums_of_lanes(acc) * B(alpha);
    if (accumulate) sums += B::load_unaligned(c + n);
    sums.store_unaligned(c + n);
  }
  return n;
}

}  // namespace tapegrad::detail
