// Private to core/kernels/: width-generic tiles of attention: a query's scores against cached
// keys, per-head and grouped (GQA) blocks of scores, and value rows weighted per head.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <utility>

#include "core/kernels/row_reductions.h"
#include "core/kernels/simd_primitives.h"

namespace tapegrad::detail {

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

/// Asks for `lines` cache lines from each of `heads` addresses `step` bytes apart, into L2. One
/// statement a line: written as a loop, GCC 12 dropped these prefetches (seen in the disassembly).
template <std::size_t heads, std::size_t lines, class S>
inline void request_lines(const S* at, std::size_t step) {
  const char* first = reinterpret_cast<const char*>(at);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (__builtin_prefetch(first + I / lines * step + I % lines * 64, 0, 2), ...);
  }(std::make_index_sequence<heads * lines>{});
}

/// Scores of G heads against NB blocks of P cached keys, each stored transposed (row c of a block
/// is coordinate c of its P keys) and block_stride apart: s[g * lds + b * P + 0:P] = alpha * sum_d
/// q[g * Dh + d] * block[b * block_stride + (g * Dh + d) * P + 0:P] for g < G, b < NB. Each score is
/// one FMA chain over d in order, whatever G and NB are: broadcast-FMAs over consecutive keys, with
/// no horizontal sums; G heads and NB blocks side by side keep G * NB * P / W chains in flight.
/// P must be a multiple of B::size.
/// With shared_keys, the G heads share one KV head's keys (grouped-query attention): every head
/// reads rows d of the block (not g * Dh + d), so a block's loads feed G heads. The keys are
/// B's values or halves (S = std::uint16_t: a 16-bit cache), widened exactly (load_stored).
template <class B, std::size_t G, std::size_t P, std::size_t NB = 1, class S>
inline void head_block_scores(typename B::value_type* s, std::size_t lds, const typename B::value_type* q,
                              const S* block, std::size_t block_stride, std::size_t Dh, typename B::value_type alpha,
                              bool shared_keys = false) {
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
        const S* row = block + b * block_stride + ((shared_keys ? 0 : g * Dh) + d) * P;
        for (std::size_t v = 0; v < V; ++v) acc[g][b * V + v] = fma(x, load_stored<B>(row + v * W), acc[g][b * V + v]);
      }
    }
  for (std::size_t g = 0; g < G; ++g)
    for (std::size_t u = 0; u < NB * V; ++u) (acc[g][u] * B(alpha)).store_unaligned(s + g * lds + u * W);
}

// c[0:V*W] for V vectors that start on a head boundary, VH vectors per head (V / VH heads, weights
// p + h * ldp and scale[h] for the h-th of them): each head's weight is broadcast once per row j.
// Head h reads v + h * v_step and writes c + h * c_step (both VH * W: consecutive heads; v_step 0:
// heads sharing one KV head's values). The values are B's or halves (load_stored).
template <class B, std::size_t V, std::size_t VH, class S>
inline void head_weighted_block(typename B::value_type* c, const typename B::value_type* p, std::size_t ldp,
                                const typename B::value_type* scale, const S* v, std::size_t ldv, std::size_t n,
                                std::size_t v_step = VH * B::size, std::size_t c_step = VH * B::size) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size, heads = V / VH;
  static_assert(V % VH == 0, "whole heads in a block");
  B acc[V];
  for (auto& a : acc) a = B(T(0));
  // A cache larger than the caches streams its rows from memory, and the hardware's prefetchers
  // pick each head's rows up late: the lines of the rows 4 KB ahead are asked for with row j's
  // loads (bench_cached_attention, 16-bit cache from memory, one Xeon core: 7.1-7.5 -> 5.8-6.1 ms
  // a step; from L2 3.01-3.04 -> 3.04-3.08).
  constexpr std::size_t lines = (VH * W * sizeof(S) + 63) / 64;
  const std::size_t ahead = std::max<std::size_t>(1, 4096 / (ldv * sizeof(S)));
  for (std::size_t j = 0; j < n; ++j) {
    const S* row = v + j * ldv;
    if (j + ahead < n) {
      if (v_step == 0) request_lines<1, lines>(row + ahead * ldv, 0);
      else request_lines<heads, lines>(row + ahead * ldv, v_step * sizeof(S));
    }
    for (std::size_t h = 0; h < heads; ++h) {
      B x(p[h * ldp + j]);
      for (std::size_t u = 0; u < VH; ++u)
        acc[h * VH + u] = fma(x, load_stored<B>(row + h * v_step + u * W), acc[h * VH + u]);
    }
  }
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t u = 0; u < VH; ++u) (acc[h * VH + u] * B(scale[h])).store_unaligned(c + h * c_step + u * W);
}

/// head_weighted_rows for G heads that share one KV head's values (grouped-query attention):
/// c[g * Dh + x] = scale[g] * sum_{j < n} p[g * ldp + j] * v[j * ldv + x] for g < G, x < Dh, each
/// one FMA chain over j in order (head_weighted_rows' arithmetic); a row of v is read once for the
/// G heads. Dh must be a multiple of B::size. The values are B's or halves (load_stored).
template <class B, std::size_t G, class S>
void group_weighted_rows(typename B::value_type* c, const typename B::value_type* p, std::size_t ldp,
                         const typename B::value_type* scale, const S* v, std::size_t ldv, std::size_t n,
                         std::size_t Dh) {
  // As many accumulators as the registers hold beside the loads and broadcasts: 16 of 32 (8 of
  // 16), VH a power of two. Each row j costs one FMA latency per block, so fewer, wider blocks
  // keep more FMAs in flight (AVX-512, 3 heads of 64: 12 chains in one block, not 6 in two).
  constexpr std::size_t W = B::size, chains = sizeof(B) >= 64 ? 16 : 8;
  constexpr std::size_t VH = std::bit_floor(std::max<std::size_t>(1, chains / G));
  std::size_t x = 0;
  auto blocks_of = [&](auto vectors) {
    constexpr std::size_t vh = decltype(vectors)::value;
    for (; x + vh * W <= Dh; x += vh * W) head_weighted_block<B, G * vh, vh>(c + x, p, ldp, scale, v + x, ldv, n, 0, Dh);
  };
  blocks_of(std::integral_constant<std::size_t, VH>{});
  if constexpr (VH >= 16) blocks_of(std::integral_constant<std::size_t, 8>{});
  if constexpr (VH >= 8) blocks_of(std::integral_constant<std::size_t, 4>{});
  if constexpr (VH >= 4) blocks_of(std::integral_constant<std::size_t, 2>{});
  if constexpr (VH >= 2) blocks_of(std::integral_constant<std::size_t, 1>{});
}

/// Value rows weighted per head (attention's probabilities times values, every head at once):
/// c[x] = scale[h] * sum_{j < n} p[h * ldp + j] * v[h * head_step + j * ldv + x - h * Dh] for x < D,
/// h = x / Dh, each one FMA chain over j in order: head h's rows at v + h * head_step (head_step
/// Dh: rows of all heads, ldv >= D; a plane per head: head_step >= n * ldv), up to 8 vectors side
/// by side. Dh must be a multiple of B::size (every vector lies in one head) and D of Dh. The values
/// are B's or halves (load_stored).
template <class B, class S>
void head_weighted_rows(typename B::value_type* c, const typename B::value_type* p, std::size_t ldp,
                        const typename B::value_type* scale, const S* v, std::size_t ldv, std::size_t n,
                        std::size_t D, std::size_t Dh, std::size_t head_step) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  const std::size_t per_head = Dh / W;
  // A block that starts on a head boundary takes its heads whole (1, 2 or 4 vectors each), or lies
  // in one head; any other block goes one vector at a time, each with its own head's weights.
  auto block = [&](auto vectors, std::size_t x0) {
    constexpr std::size_t V = decltype(vectors)::value;
    const std::size_t h0 = x0 / Dh;
    const T* ph = p + h0 * ldp;
    const S* vh = v + h0 * head_step + (x0 - h0 * Dh);
    if (x0 == h0 * Dh) {
      if (per_head >= V) return head_weighted_block<B, V, V>(c + x0, ph, ldp, scale + h0, vh, ldv, n);
      if (per_head == 1) return head_weighted_block<B, V, 1>(c + x0, ph, ldp, scale + h0, vh, ldv, n, head_step);
      if constexpr (V % 2 == 0)
        if (per_head == 2) return head_weighted_block<B, V, 2>(c + x0, ph, ldp, scale + h0, vh, ldv, n, head_step);
      if constexpr (V % 4 == 0)
        if (per_head == 4) return head_weighted_block<B, V, 4>(c + x0, ph, ldp, scale + h0, vh, ldv, n, head_step);
    }
    for (std::size_t u = 0; u < V; ++u) {
      const std::size_t x = x0 + u * W, h = x / Dh;
      head_weighted_block<B, 1, 1>(c + x, p + h * ldp, ldp, scale + h, v + h * head_step + (x - h * Dh), ldv, n);
    }
  };
  std::size_t x = 0;
  for (; x + 8 * W <= D; x += 8 * W) block(std::integral_constant<std::size_t, 8>{}, x);
  if (x + 4 * W <= D) block(std::integral_constant<std::size_t, 4>{}, x), x += 4 * W;
  if (x + 2 * W <= D) block(std::integral_constant<std::size_t, 2>{}, x), x += 2 * W;
  if (x + W <= D) block(std::integral_constant<std::size_t, 1>{}, x), x += W;
}

}  // namespace tapegrad::detail
