// Private to core/kernels/: width-generic reductions along a row (dot, max, sums of shifted
// exponentials, the sums of several batches' lanes) on the primitives of simd_primitives.h.
#pragma once

#include <algorithm>
#include <cstddef>

#include "core/kernels/simd_primitives.h"

namespace tapegrad::detail {

/// sum(a[i] * b[i]) with SIMD lanes as partial sums: vector v goes to accumulator v % 2.
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
  if (i + W <= n) acc0 = fma(B::load_unaligned(a + i), B::load_unaligned(b + i), acc0), i += W;
  B& last = i % (2 * W) == 0 ? acc0 : acc1;
  if (i < n) last = fma(load_partial<B>(a + i, n - i), load_partial<B>(b + i, n - i), last);
  return hadd(acc0 + acc1);
}

/// max(x[0:n]); n >= 1.
template <class B>
typename B::value_type max_of(const typename B::value_type* x, std::size_t n) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  B acc(x[0]);
  std::size_t i = 0;
  for (; i + W <= n; i += W) acc = max(acc, B::load_unaligned(x + i));
  if (i < n) {  // the padding repeats x[0], which cannot change the maximum
    alignas(64) T lanes[W];
    std::fill(std::copy_n(x + i, n - i, lanes), lanes + W, x[0]);
    acc = max(acc, B::load_aligned(lanes));
  }
  alignas(64) T lanes[W];
  acc.store_aligned(lanes);
  return *std::max_element(lanes, lanes + W);
}

/// sum(exp(x[i] - shift)), x unchanged.
template <class B>
typename B::value_type sum_exp_shifted(const typename B::value_type* x, std::size_t n, typename B::value_type shift) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  B acc(T(0)), s(shift);
  for (std::size_t i = 0; i < n; i += W) {
    const std::size_t count = std::min(W, n - i);
    acc += first_lanes(exp(load_lanes<B>(x + i, count) - s), count);
  }
  return hadd(acc);
}

/// One vector of exp_shifted_sum and exp_shifted_sums, the lanes [0, count) of x: x = exp(x -
/// shift) in place, added to acc. Both sum with it, so a row gets the same bits from either.
template <class B>
inline void exp_shifted_vector(B& acc, typename B::value_type* x, std::size_t count, const B& shift) {
  B e = exp(load_lanes<B>(x, count) - shift);
  store_lanes(e, x, count);
  acc += first_lanes(e, count);
}

/// x[i] = exp(x[i] - shift) in place; returns the sum of the new values.
template <class B>
typename B::value_type exp_shifted_sum(typename B::value_type* x, std::size_t n, typename B::value_type shift) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  B acc(T(0)), s(shift);
  for (std::size_t i = 0; i < n; i += W) exp_shifted_vector(acc, x + i, std::min(W, n - i), s);
  return hadd(acc);
}

/// exp_shifted_sum of `rows` rows, row r at x + r * ld with shift[r], its sum to sums[r] (sums may
/// be shift). Up to 8 rows go side by side, so that their exponentials overlap: one row after
/// another, each waited on its exponentials' latency and its sum's, a third of the decoding
/// attention's time.
template <class B>
void exp_shifted_sums(typename B::value_type* x, std::size_t ld, std::size_t rows, std::size_t n,
                      const typename B::value_type* shift, typename B::value_type* sums) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size, most = 8;
  for (std::size_t r0 = 0; r0 < rows; r0 += most) {
    const std::size_t group = std::min(most, rows - r0);
    B acc[most], s[most];
    for (std::size_t g = 0; g < group; ++g) acc[g] = B(T(0)), s[g] = B(shift[r0 + g]);
    for (std::size_t i = 0; i < n; i += W)
      for (std::size_t g = 0; g < group; ++g)
        exp_shifted_vector(acc[g], x + (r0 + g) * ld + i, std::min(W, n - i), s[g]);
    for (std::size_t g = 0; g < group; ++g) sums[r0 + g] = hadd(acc[g]);
  }
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

}  // namespace tapegrad::detail
