// Private to core/kernels/: width-generic SIMD helpers for row kernels. Each is a template on the
// batch type B (xsimd::batch<T, Arch>, or the emulated wide batch of the tests), so the same code
// runs at 2, 4, 8 and 16 lanes. They use only loads, stores, lane-wise arithmetic, fma, max, exp
// and hadd (the sum of one batch's lanes); tests/core/test_simd.cpp checks each of those primitives
// and each helper against a scalar loop at every level. fma, max, exp and hadd are called
// unqualified so that a test batch type supplies its own by argument-dependent lookup.
//
// Every kernel follows the position rule (docs/architecture.md, "Position independence"): a
// loop's last, partial vector goes through the body's vector code, padded (load_partial), and
// only its valid lanes are stored (store_partial) or summed (first_lanes).
#pragma once

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace tapegrad::detail {

using xsimd::exp;
using xsimd::fma;
using xsimd::hadd;
using xsimd::max;

// xsimd 8.1 has no AVX-512 fma: its generic one is x * y + z, two roundings (and the kernels are
// compiled with -ffp-contract=off, so the compiler does not fuse it either). A kernel's fma means
// one rounding at every width, as AVX2's and the emulated batch's do: 16-lane batches get the
// instruction. More specialized than xsimd's template, so unqualified calls pick these.
#ifdef __AVX512F__
template <class A>
  requires std::is_base_of_v<xsimd::avx512f, A>
xsimd::batch<float, A> fma(const xsimd::batch<float, A>& x, const xsimd::batch<float, A>& y,
                           const xsimd::batch<float, A>& z) {
  return _mm512_fmadd_ps(x, y, z);
}
template <class A>
  requires std::is_base_of_v<xsimd::avx512f, A>
xsimd::batch<double, A> fma(const xsimd::batch<double, A>& x, const xsimd::batch<double, A>& y,
                            const xsimd::batch<double, A>& z) {
  return _mm512_fmadd_pd(x, y, z);
}
#endif

// The partial vectors below are one masked instruction where the level has one (AVX-512's mask
// registers, AVX2's maskload/maskstore, which never touch the lanes they leave out), and a loop
// through a stack buffer elsewhere (SSE2, the tests' emulated batches): the same lanes either way.
template <class B>
concept avx512_batch = requires { typename B::arch_type; } && std::is_base_of_v<xsimd::avx512f, typename B::arch_type>;
template <class B>
concept avx2_batch = requires { typename B::arch_type; } && std::is_base_of_v<xsimd::avx2, typename B::arch_type>;

#ifdef __AVX512F__
inline __mmask16 lanes_below(std::size_t count) { return __mmask16((1u << count) - 1); }  // count <= 16
#endif
#ifdef __AVX2__
// All ones in the 32-bit (or 64-bit, for double) lanes below count.
template <class T>
__m256i lanes_below(std::size_t count) {
  if constexpr (sizeof(T) == 4)
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  else
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(std::int64_t(count)), _mm256_setr_epi64x(0, 1, 2, 3));
}
#endif

/// A batch of x[0:count] (count <= B::size) in its first lanes, zeros in the rest; x[count:] is
/// never read.
template <class B>
B load_partial(const typename B::value_type* x, std::size_t count) {
  using T = typename B::value_type;
#ifdef __AVX512F__
  if constexpr (avx512_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm512_maskz_loadu_ps(lanes_below(count), x);
    else return _mm512_maskz_loadu_pd(__mmask8(lanes_below(count)), x);
  }
#endif
#ifdef __AVX2__
  if constexpr (avx2_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm256_maskload_ps(x, lanes_below<T>(count));
    else return _mm256_maskload_pd(x, lanes_below<T>(count));
  }
#endif
  // (Fixed-count lane loops: std::copy_n with a run-time count becomes a call to memcpy.)
  alignas(64) T lanes[B::size];
  for (std::size_t i = 0; i < B::size; ++i) lanes[i] = i < count ? x[i] : T(0);
  return B::load_aligned(lanes);
}

/// x[0:count] = the first count lanes of b; x[count:] is never written.
template <class B>
void store_partial(const B& b, typename B::value_type* x, std::size_t count) {
  using T = typename B::value_type;
#ifdef __AVX512F__
  if constexpr (avx512_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm512_mask_storeu_ps(x, lanes_below(count), b);
    else return _mm512_mask_storeu_pd(x, __mmask8(lanes_below(count)), b);
  }
#endif
#ifdef __AVX2__
  if constexpr (avx2_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm256_maskstore_ps(x, lanes_below<T>(count), b);
    else return _mm256_maskstore_pd(x, lanes_below<T>(count), b);
  }
#endif
  alignas(64) T lanes[B::size];
  b.store_aligned(lanes);
  for (std::size_t i = 0; i < B::size; ++i)
    if (i < count) x[i] = lanes[i];
}

/// b with the lanes from count on set to zero: a padded batch's terms, kept out of a sum.
template <class B>
B first_lanes(const B& b, std::size_t count) {
  using T = typename B::value_type;
  if (count == B::size) return b;
#ifdef __AVX512F__
  if constexpr (avx512_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm512_maskz_mov_ps(lanes_below(count), b);
    else return _mm512_maskz_mov_pd(__mmask8(lanes_below(count)), b);
  }
#endif
#ifdef __AVX2__
  if constexpr (avx2_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm256_and_ps(b, _mm256_castsi256_ps(lanes_below<T>(count)));
    else return _mm256_and_pd(b, _mm256_castsi256_pd(lanes_below<T>(count)));
  }
#endif
  alignas(64) T lanes[B::size];
  b.store_aligned(lanes);
  std::fill(lanes + count, lanes + B::size, T(0));
  return B::load_aligned(lanes);
}

/// The count = min(B::size, n) elements of x from which a loop over n elements loads its vector:
/// a whole load in the body, a padded one at the end.
template <class B>
B load_lanes(const typename B::value_type* x, std::size_t count) {
  return count == B::size ? B::load_unaligned(x) : load_partial<B>(x, count);
}
template <class B>
void store_lanes(const B& b, typename B::value_type* x, std::size_t count) {
  if (count == B::size) b.store_unaligned(x);
  else store_partial(b, x, count);
}

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

// c[0:cols] = alpha * sum_k a[k * a_stride] * b[k * ldb + 0:cols] (+ c when accumulating), with the
// V column vectors in registers across all of k; cols > (V - 1) * W, and a cols < V * W pads the
// last vector.
template <class B, std::size_t V>
inline void row_block(typename B::value_type* c, const typename B::value_type* a, std::size_t a_stride,
                      const typename B::value_type* b, std::size_t ldb, std::size_t K, typename B::value_type alpha,
                      bool accumulate, std::size_t cols = V * B::size) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  const std::size_t last = cols - (V - 1) * W;  // the last vector's columns
  B sum[V];
  for (auto& s : sum) s = B(T(0));
  // Rows of b are ldb apart (a decoding step's column passes over weights that come from L3 when
  // they outgrow L2): the lines of the row about 16 lines ahead are asked for early. On a Zen 3 at
  // AVX2 (4 lines a row) 4 rows ahead measured best (docs/benchmarks.md, "Measurements behind
  // choices in the code"). Not at 16 lanes: the AVX-512 cores seen hold these weights in their
  // 1-2 MB of L2, and a block of 16 vectors is 16 lines a row (a prefetch per load). It changes
  // no arithmetic.
  constexpr std::size_t line = 64 / sizeof(T), lines = (V * W + line - 1) / line;
  constexpr std::size_t ahead = sizeof(B) < 64 && lines <= 4 ? 16 / lines : 0;
  for (std::size_t k = 0; k < K; ++k) {
    B scale(a[k * a_stride]);
    const T* row = b + k * ldb;
    if (ahead > 0 && k + ahead < K)
      for (std::size_t l = 0; l < lines; ++l) __builtin_prefetch(row + ahead * ldb + l * line);
    for (std::size_t v = 0; v + 1 < V; ++v) sum[v] = fma(scale, B::load_unaligned(row + v * W), sum[v]);
    sum[V - 1] = fma(scale, load_lanes<B>(row + (V - 1) * W, last), sum[V - 1]);
  }
  for (std::size_t v = 0; v < V; ++v) {
    const std::size_t count = std::min(W, cols - v * W);
    B total = sum[v] * B(alpha);
    if (accumulate) total += load_lanes<B>(c + v * W, count);
    store_lanes(total, c + v * W, count);
  }
}

/// One row of a matrix product without BLAS: c[0:n] (+)= alpha * sum_k a[k * a_stride] * b[k * ldb + 0:n].
/// For the small products BLAS handles badly (its packing dominates): decoding and attention.
/// Every element is one FMA chain over k in order, whatever n is and wherever the element falls.
template <class B>
void row_times_matrix(typename B::value_type* c, const typename B::value_type* a, std::size_t a_stride,
                      const typename B::value_type* b, std::size_t ldb, std::size_t K, std::size_t n,
                      typename B::value_type alpha, bool accumulate) {
  constexpr std::size_t W = B::size;
  std::size_t j = 0;
  for (; j + 8 * W <= n; j += 8 * W) row_block<B, 8>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate);
  if (j + 4 * W <= n) row_block<B, 4>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate), j += 4 * W;
  if (j + 2 * W <= n) row_block<B, 2>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate), j += 2 * W;
  for (; j < n; j += W) row_block<B, 1>(c + j, a, a_stride, b + j, ldb, K, alpha, accumulate, std::min(W, n - j));
}

/// c[n] (+)= alpha * a . b[n * ldb + 0:K] for n in groups of W rows (attention scores of one query
/// against cached keys): W dot products share each load of a. The last group repeats its last row
/// in the missing lanes and stores only its valid sums (a lane's sum never mixes with another's).
/// Returns N when K is a multiple of W, and otherwise 0: the caller then takes every output
/// through dot.
template <class B>
std::size_t dots_with_rows(typename B::value_type* c, const typename B::value_type* a,
                           const typename B::value_type* b, std::size_t ldb, std::size_t K, std::size_t N,
                           typename B::value_type alpha, bool accumulate) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  if (K % W != 0) return 0;
  for (std::size_t n = 0; n < N; n += W) {
    const std::size_t rows = std::min(W, N - n);
    const T* row[W];
    for (std::size_t r = 0; r < W; ++r) row[r] = b + (n + std::min(r, rows - 1)) * ldb;
    B acc[W];
    for (auto& x : acc) x = B(T(0));
    for (std::size_t k = 0; k < K; k += W) {
      B x = B::load_unaligned(a + k);
      for (std::size_t r = 0; r < W; ++r) acc[r] = fma(x, B::load_unaligned(row[r] + k), acc[r]);
    }
    B sums = sums_of_lanes(acc) * B(alpha);
    if (accumulate) sums += load_lanes<B>(c + n, rows);
    store_lanes(sums, c + n, rows);
  }
  return N;
}

/// Scores of G heads against NB blocks of P cached keys, each stored transposed (row c of a block
/// is coordinate c of its P keys) and block_stride apart: s[g * lds + b * P + 0:P] = alpha * sum_d
/// q[g * Dh + d] * block[b * block_stride + (g * Dh + d) * P + 0:P] for g < G, b < NB. Each score is
/// one FMA chain over d in order, whatever G and NB are: broadcast-FMAs over consecutive keys, with
/// no horizontal sums; G heads and NB blocks side by side keep G * NB * P / W chains in flight.
/// P must be a multiple of B::size.
/// With shared_keys, the G heads share one KV head's keys (grouped-query attention): every head
/// reads rows d of the block (not g * Dh + d), so a block's loads feed G heads.
template <class B, std::size_t G, std::size_t P, std::size_t NB = 1>
inline void head_block_scores(typename B::value_type* s, std::size_t lds, const typename B::value_type* q,
                              const typename B::value_type* block, std::size_t block_stride, std::size_t Dh,
                              typename B::value_type alpha, bool shared_keys = false) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size, V = P / W;
  static_assert(P % W == 0, "a key block holds whole vectors");
  B acc[G][NB * V];
  for (auto& head : acc)
    for (auto& a : head) a = B(T(0));
  for (std::size_t d = 0; d < Dh; ++d)
    for (std::size_t g = 0; g < G; ++g) {
      B x(q[g * Dh + d]);
      for (std::size_t b = 0; b < NB; ++b) {
        const T* row = block + b * block_stride + ((shared_keys ? 0 : g * Dh) + d) * P;
        for (std::size_t v = 0; v < V; ++v) acc[g][b * V + v] = fma(x, B::load_unaligned(row + v * W), acc[g][b * V + v]);
      }
    }
  for (std::size_t g = 0; g < G; ++g)
    for (std::size_t u = 0; u < NB * V; ++u) (acc[g][u] * B(alpha)).store_unaligned(s + g * lds + u * W);
}

// c[0:V*W] for V vectors that start on a head boundary, VH vectors per head (V / VH heads, weights
// p + h * ldp and scale[h] for the h-th of them): each head's weight is broadcast once per row j.
// Head h reads v + h * v_step and writes c + h * c_step (both VH * W: consecutive heads; v_step 0:
// heads sharing one KV head's values).
template <class B, std::size_t V, std::size_t VH>
inline void head_weighted_block(typename B::value_type* c, const typename B::value_type* p, std::size_t ldp,
                                const typename B::value_type* scale, const typename B::value_type* v, std::size_t ldv,
                                std::size_t n, std::size_t v_step = VH * B::size, std::size_t c_step = VH * B::size) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size, heads = V / VH;
  static_assert(V % VH == 0, "whole heads in a block");
  B acc[V];
  for (auto& a : acc) a = B(T(0));
  for (std::size_t j = 0; j < n; ++j) {
    const T* row = v + j * ldv;
    for (std::size_t h = 0; h < heads; ++h) {
      B x(p[h * ldp + j]);
      for (std::size_t u = 0; u < VH; ++u)
        acc[h * VH + u] = fma(x, B::load_unaligned(row + h * v_step + u * W), acc[h * VH + u]);
    }
  }
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t u = 0; u < VH; ++u) (acc[h * VH + u] * B(scale[h])).store_unaligned(c + h * c_step + u * W);
}

/// head_weighted_rows for G heads that share one KV head's values (grouped-query attention):
/// c[g * Dh + x] = scale[g] * sum_{j < n} p[g * ldp + j] * v[j * ldv + x] for g < G, x < Dh, each
/// one FMA chain over j in order (head_weighted_rows' arithmetic); a row of v is read once for the
/// G heads. Dh must be a multiple of B::size.
template <class B, std::size_t G>
void group_weighted_rows(typename B::value_type* c, const typename B::value_type* p, std::size_t ldp,
                         const typename B::value_type* scale, const typename B::value_type* v, std::size_t ldv,
                         std::size_t n, std::size_t Dh) {
  constexpr std::size_t W = B::size, VH = G >= 8 ? 1 : 8 / G;  // at most 8 accumulators, as above
  std::size_t x = 0;
  for (; x + VH * W <= Dh; x += VH * W) head_weighted_block<B, G * VH, VH>(c + x, p, ldp, scale, v + x, ldv, n, 0, Dh);
  for (; x < Dh; x += W) head_weighted_block<B, G, 1>(c + x, p, ldp, scale, v + x, ldv, n, 0, Dh);
}

/// Value rows weighted per head (attention's probabilities times values, every head at once):
/// c[x] = scale[x / Dh] * sum_{j < n} p[(x / Dh) * ldp + j] * v[j * ldv + x] for x < D, each one FMA
/// chain over j in order. A row of v is read once for all heads, up to 8 vectors side by side.
/// Dh must be a multiple of B::size (every vector lies in one head) and D of Dh.
template <class B>
void head_weighted_rows(typename B::value_type* c, const typename B::value_type* p, std::size_t ldp,
                        const typename B::value_type* scale, const typename B::value_type* v, std::size_t ldv,
                        std::size_t n, std::size_t D, std::size_t Dh) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  const std::size_t per_head = Dh / W;
  // A block that starts on a head boundary takes its heads whole (1, 2 or 4 vectors each), or lies
  // in one head; any other block goes one vector at a time, each with its own head's weights.
  auto block = [&](auto vectors, std::size_t x0) {
    constexpr std::size_t V = decltype(vectors)::value;
    const std::size_t h0 = x0 / Dh;
    const T* ph = p + h0 * ldp;
    if (x0 == h0 * Dh) {
      if (per_head >= V) return head_weighted_block<B, V, V>(c + x0, ph, ldp, scale + h0, v + x0, ldv, n);
      if (per_head == 1) return head_weighted_block<B, V, 1>(c + x0, ph, ldp, scale + h0, v + x0, ldv, n);
      if constexpr (V % 2 == 0)
        if (per_head == 2) return head_weighted_block<B, V, 2>(c + x0, ph, ldp, scale + h0, v + x0, ldv, n);
      if constexpr (V % 4 == 0)
        if (per_head == 4) return head_weighted_block<B, V, 4>(c + x0, ph, ldp, scale + h0, v + x0, ldv, n);
    }
    for (std::size_t u = 0; u < V; ++u) {
      const std::size_t x = x0 + u * W, h = x / Dh;
      head_weighted_block<B, 1, 1>(c + x, p + h * ldp, ldp, scale + h, v + x, ldv, n);
    }
  };
  std::size_t x = 0;
  for (; x + 8 * W <= D; x += 8 * W) block(std::integral_constant<std::size_t, 8>{}, x);
  if (x + 4 * W <= D) block(std::integral_constant<std::size_t, 4>{}, x), x += 4 * W;
  if (x + 2 * W <= D) block(std::integral_constant<std::size_t, 2>{}, x), x += 2 * W;
  if (x + W <= D) block(std::integral_constant<std::size_t, 1>{}, x), x += W;
}

// C[i, 0:V*W] (+)= alpha * sum_k A(i, k) b[k * ldb + 0:V*W] for R rows i at once, A(i, k) =
// a[i * a_row + k * a_col]: R x V accumulators stay in registers across all of k (R = 6, V = 2 is
// the 6x16 block of AVX2 sgemm kernels: 12 accumulators, 2 loads and 6 broadcasts per 12 FMAs).
template <class B, std::size_t R, std::size_t V>
inline void tile_block(typename B::value_type* c, std::size_t ldc, const typename B::value_type* a, std::size_t a_row,
                       std::size_t a_col, const typename B::value_type* b, std::size_t ldb, std::size_t K,
                       typename B::value_type alpha, bool accumulate) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  B sum[R][V];
  for (auto& row : sum)
    for (auto& s : row) s = B(T(0));
  for (std::size_t k = 0; k < K; ++k) {
    B col[V];
    for (std::size_t v = 0; v < V; ++v) col[v] = B::load_unaligned(b + k * ldb + v * W);
    for (std::size_t r = 0; r < R; ++r) {
      B x(a[r * a_row + k * a_col]);
      for (std::size_t v = 0; v < V; ++v) sum[r][v] = fma(x, col[v], sum[r][v]);
    }
  }
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t v = 0; v < V; ++v) {
      B total = sum[r][v] * B(alpha);
      if (accumulate) total += B::load_unaligned(c + r * ldc + v * W);
      total.store_unaligned(c + r * ldc + v * W);
    }
}

template <class B, std::size_t V>
inline void tile_rows(typename B::value_type* c, std::size_t ldc, const typename B::value_type* a, std::size_t a_row,
                      std::size_t a_col, const typename B::value_type* b, std::size_t ldb, std::size_t M, std::size_t K,
                      typename B::value_type alpha, bool accumulate) {
  constexpr std::size_t R = 6;
  std::size_t i = 0;
  for (; i + R <= M; i += R) tile_block<B, R, V>(c + i * ldc, ldc, a + i * a_row, a_row, a_col, b, ldb, K, alpha, accumulate);
  auto* ci = c + i * ldc;
  auto* ai = a + i * a_row;
  switch (M - i) {
    case 5: return tile_block<B, 5, V>(ci, ldc, ai, a_row, a_col, b, ldb, K, alpha, accumulate);
    case 4: return tile_block<B, 4, V>(ci, ldc, ai, a_row, a_col, b, ldb, K, alpha, accumulate);
    case 3: return tile_block<B, 3, V>(ci, ldc, ai, a_row, a_col, b, ldb, K, alpha, accumulate);
    case 2: return tile_block<B, 2, V>(ci, ldc, ai, a_row, a_col, b, ldb, K, alpha, accumulate);
    case 1: return tile_block<B, 1, V>(ci, ldc, ai, a_row, a_col, b, ldb, K, alpha, accumulate);
    default: return;
  }
}

/// A small matrix product held in registers, for attention's tiles: C (M, N) (+)= alpha * A B with
/// A(i, k) = a[i * a_row + k * a_col] (a row-major matrix, or with a_row = 1 a transposed one) and
/// B (K, N) row-major with leading dimension ldb. N must be a multiple of B::size (callers pad).
/// Blocks of V vectors, then the vectors left as one block: a head of 32 floats at 16 lanes is
/// one tile of 2 vectors (12 FMA chains), not two of 1 (6 chains, too few to hide the FMA's latency).
template <class B>
void tile_product(typename B::value_type* c, std::size_t ldc, const typename B::value_type* a, std::size_t a_row,
                  std::size_t a_col, const typename B::value_type* b, std::size_t ldb, std::size_t M, std::size_t N,
                  std::size_t K, typename B::value_type alpha, bool accumulate) {
  constexpr std::size_t W = B::size, V = sizeof(B) >= 64 ? 4 : 2;  // 32 vector registers at 512 bits, else 16
  std::size_t j = 0;
  for (; j + V * W <= N; j += V * W) tile_rows<B, V>(c + j, ldc, a, a_row, a_col, b + j, ldb, M, K, alpha, accumulate);
  const std::size_t rest = (N - j) / W;
  [&]<std::size_t... R>(std::index_sequence<R...>) {
    ((rest == R + 1 ? tile_rows<B, R + 1>(c + j, ldc, a, a_row, a_col, b + j, ldb, M, K, alpha, accumulate) : void()),
     ...);
  }(std::make_index_sequence<V - 1>{});
}

/// c[0:N] (+)= a[0:K] B (K, N), B row-major with leading dimension ldb: blocks of as many column
/// vectors as the registers hold beside the broadcast (16 of 32 registers, 8 of 16), then one block
/// of the vectors left, its last one padded. Each pass reads whole rows of B in order (a decoding
/// step streams its weights from L2), and every element is one FMA chain over k from zero.
template <class B>
void row_in_registers(typename B::value_type* c, const typename B::value_type* a, const typename B::value_type* b,
                      std::size_t ldb, std::size_t K, std::size_t N, bool accumulate) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size, most = sizeof(B) >= 64 ? 16 : 8;
  std::size_t j = 0;
  for (; j + most * W <= N; j += most * W) row_block<B, most>(c + j, a, 1, b + j, ldb, K, T(1), accumulate);
  if (j == N) return;
  const std::size_t cols = N - j, vectors = (cols + W - 1) / W;
  [&]<std::size_t... V>(std::index_sequence<V...>) {
    ((vectors == V + 1 ? row_block<B, V + 1>(c + j, a, 1, b + j, ldb, K, T(1), accumulate, cols) : void()), ...);
  }(std::make_index_sequence<most>{});
}

/// C (M, N) (+)= A (M, K) B (K, N), all row-major with leading dimensions, where every element of C
/// is one FMA chain over k = 0..K-1 starting from zero (then + C when accumulating). The tiling
/// (by M) and the SIMD width only decide which elements run side by side, never the order of an
/// element's sum, so a row's result does not depend on M or on the rows that come with it: one
/// sequence decoded alone gets the same bits as in a batch. Up to 5 rows go one by one through
/// row_in_registers; more in 6-row tiles, where the columns past the last whole vector (a
/// vocabulary of 65 leaves one) go through the same batch arithmetic on a zero-padded copy of B's
/// tail: a (K, W) panel made once and then 6-row tiles, for K up to 256; row by row past that.
template <class B>
void row_stable_product(typename B::value_type* c, std::size_t ldc, const typename B::value_type* a, std::size_t lda,
                        const typename B::value_type* b, std::size_t ldb, std::size_t M, std::size_t N, std::size_t K,
                        bool accumulate) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size, wide = sizeof(B) >= 64 ? 4 : 2;  // tile_rows' vectors per 6-row tile
  if (M < 6) {  // a few rows: each row in as few passes over b as the registers allow
    for (std::size_t i = 0; i < M; ++i) row_in_registers<B>(c + i * ldc, a + i * lda, b, ldb, K, N, accumulate);
    return;
  }
  std::size_t j = 0;  // 6-row tiles: each column load feeds 6 rows
  for (; j + wide * W <= N; j += wide * W) tile_rows<B, wide>(c + j, ldc, a, lda, 1, b + j, ldb, M, K, T(1), accumulate);
  for (; j + W <= N; j += W) tile_rows<B, 1>(c + j, ldc, a, lda, 1, b + j, ldb, M, K, T(1), accumulate);
  if (j == N) return;
  const std::size_t rest = N - j;
  constexpr std::size_t panel_k = 256, R = 6;
  if (K <= panel_k) {  // the tail columns zero-padded once into a (K, W) panel, then 6-row tiles on it
    alignas(64) T panel[panel_k * W], out[R * W] = {};  // (zeroed: GCC 12 warns falsely otherwise)
    for (std::size_t k = 0; k < K; ++k)
      for (std::size_t t = 0; t < W; ++t) panel[k * W + t] = t < rest ? b[k * ldb + j + t] : T(0);
    auto finish = [&](std::size_t i0, std::size_t rows) {  // out's rows i0.. go to c's tail columns
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t t = 0; t < rest; ++t) {
          T& y = c[(i0 + r) * ldc + j + t];
          y = accumulate ? out[r * W + t] + y : out[r * W + t];
        }
    };
    std::size_t i = 0;
    for (; i + R <= M; i += R) {
      tile_block<B, R, 1>(out, W, a + i * lda, lda, 1, panel, W, K, T(1), false);
      finish(i, R);
    }
    for (; i < M; ++i) {
      tile_block<B, 1, 1>(out, W, a + i * lda, lda, 1, panel, W, K, T(1), false);
      finish(i, 1);
    }
    return;
  }
  for (std::size_t i = 0; i < M; ++i)
    row_block<B, 1>(c + i * ldc + j, a + i * lda, 1, b + j, ldb, K, T(1), accumulate, rest);
}

}  // namespace tapegrad::detail
