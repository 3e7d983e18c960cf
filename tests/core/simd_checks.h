// Checks of the SIMD primitives the kernels rely on and of the width-generic helpers of
// core/kernels/simd_helpers.h, each against a plain scalar loop. Templates on the batch type B:
// the per-level objects (simd_checks_level.cpp) run them on xsimd's batches as compiled for each SIMD
// level, test_simd.cpp on emulated batches of any width. They return failure messages rather
// than use doctest, so that no test-framework code is compiled with a level's flags.
//
// Inputs are small integers wherever the result is a sum of products: every partial sum is then
// exact in float, so the SIMD and scalar results must be equal whatever order the lanes are added
// in, and a lane that lands in the wrong place cannot hide inside a tolerance.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "core/kernels/simd_helpers.h"

namespace tapegrad::simd_checks {

struct Failures {
  std::vector<std::string> messages;
  template <class... A> void add(fmt::format_string<A...> f, A&&... a) {
    if (messages.size() < 20) messages.push_back(fmt::format(f, std::forward<A>(a)...));
  }
};

// Deterministic small integers in [-4, 4], as T.
template <class T> std::vector<T> small_ints(std::size_t n, std::size_t seed) {
  std::vector<T> v(n);
  std::size_t s = seed * 2654435761u + 12345;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = T(int((s >> 33) % 9) - 4);
  }
  return v;
}

template <class T> bool close(T got, T want, T rtol) { return std::fabs(got - want) <= rtol * std::fabs(want) + rtol * 1e-30; }

// The xsimd operations the kernels and helpers use, lane by lane against scalar arithmetic.
template <class B> void check_primitives(Failures& f, std::string_view name, bool fused_fma) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  const T exp_rtol = sizeof(T) == 4 ? T(4e-7) : T(1e-15);
  alignas(64) T x[4 * W], y[4 * W], out[4 * W];
  auto xs = small_ints<T>(4 * W, 1), ys = small_ints<T>(4 * W, 2);
  for (std::size_t i = 0; i < 4 * W; ++i) x[i] = xs[i] + T(i) / T(8), y[i] = ys[i] == 0 ? T(3) : ys[i];
  for (std::size_t offset = 0; offset < W; ++offset) {  // unaligned loads and stores
    B::load_unaligned(x + offset).store_unaligned(out + offset);
    for (std::size_t i = 0; i < W; ++i)
      if (out[offset + i] != x[offset + i]) f.add("{}: load/store_unaligned at offset {}: lane {}", name, offset, i);
  }
  // The partial vectors (masked instructions at AVX2 and AVX-512): lanes below count, zeros or
  // untouched memory above it. The source holds exactly count elements (a sanitizer sees any read
  // past them).
  for (std::size_t count = 0; count <= W; ++count) {
    std::vector<T> source(x + 1, x + 1 + count);
    detail::load_partial<B>(source.data(), count).store_aligned(out);
    for (std::size_t i = 0; i < W; ++i)
      if (out[i] != (i < count ? x[1 + i] : T(0))) f.add("{}: load_partial count {}: lane {} is {}", name, count, i, out[i]);
    detail::first_lanes(B::load_unaligned(x + 1), count).store_aligned(out);
    for (std::size_t i = 0; i < W; ++i)
      if (out[i] != (i < count ? x[1 + i] : T(0))) f.add("{}: first_lanes count {}: lane {} is {}", name, count, i, out[i]);
    std::vector<T> target(W + 2, T(99));
    detail::store_partial(B::load_unaligned(x + 1), target.data() + 1, count);
    for (std::size_t i = 0; i < W + 2; ++i)
      if (target[i] != (i >= 1 && i <= count ? x[i] : T(99)))
        f.add("{}: store_partial count {}: element {} is {}", name, count, i, target[i]);
  }
  B a = B::load_aligned(x), b = B::load_aligned(y), c = B::load_aligned(x + W);
  auto expect = [&](B got, const char* op, auto scalar) {
    got.store_aligned(out);
    for (std::size_t i = 0; i < W; ++i)
      if (out[i] != scalar(i)) f.add("{}: {} lane {}: got {}, want {}", name, op, i, out[i], scalar(i));
  };
  expect(B(T(2.5)), "broadcast", [&](std::size_t) { return T(2.5); });
  expect(a + b, "add", [&](std::size_t i) { return x[i] + y[i]; });
  expect(a - b, "sub", [&](std::size_t i) { return x[i] - y[i]; });
  expect(a * b, "mul", [&](std::size_t i) { return x[i] * y[i]; });
  expect(a / b, "div", [&](std::size_t i) { return x[i] / y[i]; });
  expect(-a, "neg", [&](std::size_t i) { return -x[i]; });
  expect(detail::fma(a, b, c), "fma", [&](std::size_t i) { return std::fma(x[i], y[i], x[W + i]); });
  // The kernels' fma rounds once wherever the level has the instruction: (1 + e)(1 - e) - 1 is
  // -e^2 fused and 0 when the product is rounded first (as xsimd 8.1's AVX-512 fma does).
  const T e = sizeof(T) == 4 ? T(1.0 / 8192) : T(1.0 / 268435456.0);
  const T rounded_once = fused_fma ? -(e * e) : T(0);
  expect(detail::fma(B(T(1) + e), B(T(1) - e), B(T(-1))), "fma rounding once",
         [&](std::size_t) { return rounded_once; });
  expect(xsimd::max(a, c), "max", [&](std::size_t i) { return std::max(x[i], x[W + i]); });
  expect(xsimd::sqrt(xsimd::abs(a)), "sqrt(abs)", [&](std::size_t i) { return std::sqrt(std::fabs(x[i])); });
  T sum = 0;
  for (std::size_t i = 0; i < W; ++i) sum += x[i];
  if (T got = xsimd::hadd(a); got != sum) f.add("{}: hadd: got {}, want {}", name, got, sum);
  // exp over the range softmax and SiLU use, including underflow to 0.
  for (T v : {T(-200), T(-87), T(-30), T(-1.5), T(-1e-3), T(0), T(1e-3), T(0.7), T(10), T(80)}) {
    B e = xsimd::exp(B(v) + B::load_aligned(x) * B(T(0.01)));
    e.store_aligned(out);
    for (std::size_t i = 0; i < W; ++i) {
      T want = std::exp(v + x[i] * T(0.01));
      if (!close(out[i], want, exp_rtol) && !(want < T(1e-30) && out[i] < T(1e-30)))
        f.add("{}: exp({}) lane {}: got {}, want {}", name, v + x[i] * T(0.01), i, out[i], want);
    }
  }
}

// Every helper of core/kernels/simd_helpers.h against a scalar loop, for sizes 0 to 3W + 1 (9W + 1 where
// the helper has blocks of up to 8W), unaligned pointers, and the strides the kernels pass.
template <class B> void check_helpers(Failures& f, std::string_view name) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  const T exp_rtol = sizeof(T) == 4 ? T(2e-6) : T(1e-13);
  const std::size_t big = 9 * W + 1;
  auto a = small_ints<T>(4 * big + 8, 3), b = small_ints<T>(4 * big * big + 8, 4);

  for (std::size_t n = 0; n <= 3 * W + 1; ++n) {
    const T* x = a.data() + 1;  // unaligned on purpose
    const T* y = b.data() + 3;
    T want = 0;
    for (std::size_t i = 0; i < n; ++i) want += x[i] * y[i];
    if (T got = detail::dot<B>(x, y, n); got != want) f.add("{}: dot n={}: got {}, want {}", name, n, got, want);
    if (n == 0) continue;
    T m = x[0];
    for (std::size_t i = 1; i < n; ++i) m = std::max(m, x[i]);
    if (T got = detail::max_of<B>(x, n); got != m) f.add("{}: max_of n={}: got {}, want {}", name, n, got, m);
    double exp_sum = 0;
    for (std::size_t i = 0; i < n; ++i) exp_sum += std::exp(double(x[i] - m));
    if (T got = detail::sum_exp_shifted<B>(x, n, m); !close(got, T(exp_sum), exp_rtol))
      f.add("{}: sum_exp_shifted n={}: got {}, want {}", name, n, got, exp_sum);
    std::vector<T> z(x, x + n);
    T total = detail::exp_shifted_sum<B>(z.data(), n, m);
    if (!close(total, T(exp_sum), exp_rtol)) f.add("{}: exp_shifted_sum n={}: sum {}, want {}", name, n, total, exp_sum);
    for (std::size_t i = 0; i < n; ++i)
      if (!close(z[i], T(std::exp(double(x[i] - m))), exp_rtol)) f.add("{}: exp_shifted_sum n={}: element {}", name, n, i);
    // Rows side by side (more than one group of 8, with a shift each): every row's values and sum
    // have the bits of exp_shifted_sum on that row alone.
    const std::size_t rows = 11, ld = n + 3;
    std::vector<T> together(rows * ld), shifts(rows), sums(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      std::copy_n(a.data() + r, n, together.data() + r * ld);
      shifts[r] = m - T(r % 3);
    }
    std::vector<T> before = together;
    detail::exp_shifted_sums<B>(together.data(), ld, rows, n, shifts.data(), sums.data());
    for (std::size_t r = 0; r < rows; ++r) {
      std::vector<T> alone(before.begin() + r * ld, before.begin() + r * ld + n);
      const T sum = detail::exp_shifted_sum<B>(alone.data(), n, shifts[r]);
      if (sum != sums[r] || !std::equal(alone.begin(), alone.end(), together.begin() + r * ld))
        f.add("{}: exp_shifted_sums n={}: row {} differs from exp_shifted_sum alone", name, n, r);
      if (!std::equal(before.begin() + r * ld + n, before.begin() + (r + 1) * ld, together.begin() + r * ld + n))
        f.add("{}: exp_shifted_sums n={}: row {} wrote past n", name, n, r);
    }
  }

  {  // sums_of_lanes: lane r is the sum of acc[r]'s lanes
    B acc[W];
    alignas(64) T lanes[W], got[W] = {};
    for (std::size_t r = 0; r < W; ++r) {
      for (std::size_t i = 0; i < W; ++i) lanes[i] = T(100 * r + i);
      acc[r] = B::load_aligned(lanes);
    }
    detail::sums_of_lanes(acc).store_aligned(got);
    for (std::size_t r = 0; r < W; ++r) {
      T want = T(100 * r * W + W * (W - 1) / 2);
      if (got[r] != want) f.add("{}: sums_of_lanes row {}: got {}, want {}", name, r, got[r], want);
    }
  }

  // row_times_matrix: c[0:n] (+)= alpha * sum_k a[k * a_stride] * b[k * ldb + j]; a_stride 1 (a row)
  // and 5 (a column of a transposed operand), ldb > n (a slice of a wider matrix).
  for (std::size_t K : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(7)})
    for (std::size_t a_stride : {std::size_t(1), std::size_t(5)})
      for (std::size_t n = 0; n <= big; ++n)
        for (bool accumulate : {false, true}) {
          std::size_t ldb = n + 3;
          const T* ap = a.data() + 1;
          const T* bp = b.data() + 2;
          T alpha = T(0.5);
          std::vector<T> c = small_ints<T>(n + 1, n), want = c;
          for (std::size_t j = 0; j < n; ++j) {
            T sum = 0;
            for (std::size_t k = 0; k < K; ++k) sum += ap[k * a_stride] * bp[k * ldb + j];
            want[j] = alpha * sum + (accumulate ? want[j] : T(0));
          }
          detail::row_times_matrix<B>(c.data(), ap, a_stride, bp, ldb, K, n, alpha, accumulate);
          for (std::size_t j = 0; j <= n; ++j)  // c[n] is past the end and must be untouched
            if (c[j] != want[j])
              f.add("{}: row_times_matrix K={} a_stride={} n={} accumulate={}: c[{}] = {}, want {}", name, K, a_stride,
                    n, accumulate, j, c[j], want[j]);
        }

  // dots_with_rows: c[r] (+)= alpha * a . b[r * ldb + 0:K] for every row when K is a multiple of W
  // (the last group padded), none otherwise.
  for (std::size_t K : {std::size_t(0), W, 2 * W, 3 * W, W + 1})
    for (std::size_t N = 0; N <= 3 * W + 1; ++N)
      for (bool accumulate : {false, true}) {
        std::size_t ldb = K + 3;
        const T* ap = a.data() + 1;
        const T* bp = b.data() + 2;
        T alpha = T(0.25);
        std::vector<T> c = small_ints<T>(N, N + 7), before = c;
        std::size_t done = detail::dots_with_rows<B>(c.data(), ap, bp, ldb, K, N, alpha, accumulate);
        std::size_t expected_done = K % W == 0 ? N : 0;
        if (done != expected_done) f.add("{}: dots_with_rows K={} N={}: did {} rows, want {}", name, K, N, done, expected_done);
        for (std::size_t r = 0; r < N; ++r) {
          T want = before[r];
          if (r < done) {
            T sum = 0;
            for (std::size_t k = 0; k < K; ++k) sum += ap[k] * bp[r * ldb + k];
            want = alpha * sum + (accumulate ? before[r] : T(0));
          }
          if (c[r] != want)
            f.add("{}: dots_with_rows K={} N={} accumulate={}: c[{}] = {}, want {}", name, K, N, accumulate, r, c[r], want);
        }
      }

  // head_block_scores: G heads' scores over NB blocks of 16 keys stored transposed (a block and a
  // gap apart), each an FMA chain over d (exact on integers), written to G rows of a wider scores
  // buffer and nowhere else.
  if constexpr (16 % W == 0) {
    constexpr std::size_t P = 16;
    auto check_scores = [&](auto heads, auto blocks, std::size_t Dh) {
      constexpr std::size_t G = decltype(heads)::value, NB = decltype(blocks)::value;
      const std::size_t lds = NB * P + 5, stride = G * Dh * P + 3;
      const std::vector<T> q = small_ints<T>(G * Dh + 1, G + Dh), block = small_ints<T>(NB * stride + 1, G + 2 * Dh);
      std::vector<T> s(G * lds, T(7)), want = s;
      const T alpha = T(0.25);
      for (std::size_t g = 0; g < G; ++g)
        for (std::size_t t = 0; t < NB * P; ++t) {
          T sum = 0;
          for (std::size_t d = 0; d < Dh; ++d) sum += q[1 + g * Dh + d] * block[1 + t / P * stride + (g * Dh + d) * P + t % P];
          want[g * lds + t] = alpha * sum;
        }
      detail::head_block_scores<B, G, P, NB>(s.data(), lds, q.data() + 1, block.data() + 1, stride, Dh, alpha);
      for (std::size_t i = 0; i < s.size(); ++i)
        if (s[i] != want[i])
          f.add("{}: head_block_scores G={} NB={} Dh={}: s[{}] = {}, want {}", name, G, NB, Dh, i, s[i], want[i]);
    };
    using one = std::integral_constant<std::size_t, 1>;
    using two = std::integral_constant<std::size_t, 2>;
    for (std::size_t Dh : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(16)}) {
      check_scores(one{}, one{}, Dh);
      check_scores(two{}, one{}, Dh);
      check_scores(std::integral_constant<std::size_t, 4>{}, two{}, Dh);
      check_scores(one{}, std::integral_constant<std::size_t, 3>{}, Dh);
      check_scores(std::integral_constant<std::size_t, 5>{}, one{}, Dh);
    }
  }

  // head_weighted_rows: c[x] = scale[h] * sum_j p[h * ldp + j] * v(h, j, x - h * Dh), h = x / Dh,
  // every head at once, head h's rows in rows of all heads (v + h * Dh, ldv > D) or in a plane of
  // its own (v + h * plane, ldv > Dh). D = H * Dh up to 20W covers the 8-, 4-, 2- and 1-vector
  // blocks with heads of 1, 2 and 4 vectors, and Dh = 3W blocks that start inside a head; c[D] is
  // past the end and must be untouched.
  for (bool planes : {false, true})
    for (std::size_t Dh : {W, 2 * W, 3 * W, 4 * W})
      for (std::size_t H : {std::size_t(1), std::size_t(3), std::size_t(5)})
        for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(6)}) {
          const std::size_t D = H * Dh, ldp = n + 2, ldv = (planes ? Dh : D) + 3;
          const std::size_t head_step = planes ? (n + 1) * ldv : Dh;
          const std::vector<T> p = small_ints<T>(H * ldp, n + H), v = small_ints<T>(H * head_step + n * ldv + 1, D + n);
          std::vector<T> scale(H), c = small_ints<T>(D + 1, D), want = c;
          for (std::size_t h = 0; h < H; ++h) scale[h] = T(1) / T(1 << h);
          for (std::size_t x = 0; x < D; ++x) {
            const std::size_t h = x / Dh;
            T sum = 0;
            for (std::size_t j = 0; j < n; ++j) sum += p[h * ldp + j] * v[h * head_step + j * ldv + x - h * Dh];
            want[x] = scale[h] * sum;
          }
          detail::head_weighted_rows<B>(c.data(), p.data(), ldp, scale.data(), v.data(), ldv, n, D, Dh, head_step);
          for (std::size_t x = 0; x <= D; ++x)
            if (c[x] != want[x])
              f.add("{}: head_weighted_rows ({}) Dh={} H={} n={}: c[{}] = {}, want {}", name,
                    planes ? "a plane per head" : "rows of all heads", Dh, H, n, x, c[x], want[x]);
        }

  // tile_product: C (M, N) (+)= alpha * A B, A row-major (a_row = lda, a_col = 1) or transposed
  // (a_row = 1, a_col = lda); M up to 13 covers two 6-row blocks and every remainder, N up to 9W
  // the 2- and 4-vector column blocks and their 1-vector remainder.
  for (std::size_t M : {std::size_t(0), std::size_t(1), std::size_t(5), std::size_t(6), std::size_t(7), std::size_t(13)})
    for (std::size_t N : {std::size_t(0), W, 2 * W, 3 * W, 5 * W, 9 * W})
      for (std::size_t K : {std::size_t(0), std::size_t(1), std::size_t(5)})
        for (bool transposed : {false, true})
          for (bool accumulate : {false, true}) {
            const std::size_t lda = transposed ? M + 3 : K + 2, ldb = N + 1, ldc = N + 2;
            const std::size_t a_row = transposed ? 1 : lda, a_col = transposed ? lda : 1;
            const std::vector<T> a_tile = small_ints<T>(16 * 16 + 1, M + K), b_tile = small_ints<T>(5 * ldb + 2, N + K);
            const T* ap = a_tile.data() + 1;  // unaligned on purpose
            const T* bp = b_tile.data() + 2;
            T alpha = T(0.5);
            std::vector<T> c = small_ints<T>(M * ldc + 1, M + N), want = c;
            for (std::size_t i = 0; i < M; ++i)
              for (std::size_t j = 0; j < N; ++j) {
                T sum = 0;
                for (std::size_t k = 0; k < K; ++k) sum += ap[i * a_row + k * a_col] * bp[k * ldb + j];
                want[i * ldc + j] = alpha * sum + (accumulate ? want[i * ldc + j] : T(0));
              }
            detail::tile_product<B>(c.data(), ldc, ap, a_row, a_col, bp, ldb, M, N, K, alpha, accumulate);
            for (std::size_t i = 0; i < c.size(); ++i)  // the padding columns and c[M * ldc] stay untouched
              if (c[i] != want[i])
                f.add("{}: tile_product M={} N={} K={} transposed={} accumulate={}: c[{}] = {}, want {}", name, M, N, K,
                      transposed, accumulate, i, c[i], want[i]);
          }

  // row_stable_product: C (M, N) (+)= A B. With small integers the result is exact; with fractions
  // (rounding in every FMA) each row must equal, bit for bit, the same row computed alone (M = 1):
  // M covers the few-row path (< 6) and the 6-row tiles with their remainders, N the wide column
  // blocks, single vectors and the zero-padded tail (a panel of up to 256 rows of B, and past that
  // row by row).
  for (std::size_t M : {std::size_t(1), std::size_t(2), std::size_t(5), std::size_t(6), std::size_t(7), std::size_t(13)})
    for (std::size_t N : {std::size_t(1), W - 1, W + 1, 2 * W + 3, 9 * W + 1})
      for (std::size_t K : {std::size_t(1), std::size_t(4), std::size_t(17), std::size_t(257)})
        for (bool accumulate : {false, true}) {
          const std::size_t lda = K + 1, ldb = N + 2, ldc = N + 3;
          std::vector<T> a = small_ints<T>(M * lda, M + K), b = small_ints<T>(K * ldb, N + K);
          std::vector<T> c = small_ints<T>(M * ldc, M + N), want = c;
          for (std::size_t i = 0; i < M; ++i)
            for (std::size_t j = 0; j < N; ++j) {
              T sum = 0;
              for (std::size_t k = 0; k < K; ++k) sum += a[i * lda + k] * b[k * ldb + j];
              want[i * ldc + j] = sum + (accumulate ? want[i * ldc + j] : T(0));
            }
          detail::row_stable_product<B>(c.data(), ldc, a.data(), lda, b.data(), ldb, M, N, K, accumulate);
          for (std::size_t i = 0; i < c.size(); ++i)
            if (c[i] != want[i])
              f.add("{}: row_stable_product M={} N={} K={} accumulate={}: c[{}] = {}, want {}", name, M, N, K, accumulate,
                    i, c[i], want[i]);
          for (auto& x : a) x = x / T(3) + T(0.1);  // inexact products from here on
          for (auto& x : b) x = x / T(7) - T(0.05);
          std::vector<T> together(M * ldc, T(1)), alone(ldc, T(1));
          detail::row_stable_product<B>(together.data(), ldc, a.data(), lda, b.data(), ldb, M, N, K, accumulate);
          for (std::size_t i = 0; i < M; ++i) {
            std::fill(alone.begin(), alone.end(), T(1));
            detail::row_stable_product<B>(alone.data(), ldc, a.data() + i * lda, lda, b.data(), ldb, 1, N, K, accumulate);
            for (std::size_t j = 0; j < N; ++j)
              if (together[i * ldc + j] != alone[j])
                f.add("{}: row_stable_product M={} N={} K={}: row {} column {} differs from the row alone ({} vs {})",
                      name, M, N, K, i, j, together[i * ldc + j], alone[j]);
          }
        }
}

}  // namespace tapegrad::simd_checks
