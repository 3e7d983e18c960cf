// Attention of a few query rows of one sequence over its KV cache (decoding and prefill). The
// cache keeps keys in blocks of key_block positions stored transposed, so a head's scores over a
// block are broadcast-FMAs over consecutive keys with no horizontal sums; a softmax per head; then
// each head's value rows are read once and added into its output, several heads side by side. The
// values lie in a plane per KV head: as rows of the whole width, a head of SmolLM2 read every third
// 256 bytes of 768-byte rows, at 7-9 GB/s against 24-31 for a plane (group_weighted_rows over 480
// sequence-layers of 128-1024 positions, one Zen 4 core). With grouped-query attention (fewer KV
// heads than heads) the heads of a group go side by side over their KV head's keys and values,
// which are read once for the group. A 16-bit cache holds the keys and values as IEEE halves,
// widened exactly as they are read: the bits of a float cache holding the same values.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "core/kernels/level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

// S: what the cache holds, T or std::uint16_t (halves).
template <class T, class S>
void attend_over_cache(T* out, const T* q, const S* keys, const S* values, const AttentionShape& s, T* scratch) {
  if (s.batch != 1 || s.q_offset + s.q_len > s.kv_len || (s.kv_capacity != 0 && s.kv_capacity < s.kv_len))
    throw std::invalid_argument(fmt::format("cached_attention: one sequence with q_offset + q_len <= kv_len <= "
                                            "kv_capacity; got batch {}, q_offset {}, q_len {}, kv_len {}, "
                                            "kv_capacity {}",
                                            s.batch, s.q_offset, s.q_len, s.kv_len, s.kv_capacity));
  if (s.n_heads == 0 || s.kv_heads() > s.n_heads || s.n_heads % s.kv_heads() != 0)
    throw std::invalid_argument(fmt::format("cached_attention: the KV heads must divide the heads; got n_heads {}, "
                                            "n_kv_heads {}",
                                            s.n_heads, s.n_kv_heads));
  if (s.first_head >= s.n_heads || s.heads_end() > s.n_heads)
    throw std::invalid_argument(fmt::format("cached_attention: heads {}..{} of {}", s.first_head, s.heads_end(),
                                            s.n_heads));
  using B = Batch<T>;
  // G heads at once; chains of FMAs: 16 where 32 registers hold them with the broadcasts and loads
  // (AVX-512: 4 heads of 16 floats, 4 key blocks at once rather than 2, took the scores of a query
  // over 58 positions from 340-400 to 270 TSC ticks), 8 in 16 registers.
  constexpr std::size_t W = B::size, G = W / 2 > 0 ? W / 2 : 1, chains = sizeof(B) >= 64 ? 16 : 8;
  static_assert(key_block % W == 0, "a key block holds whole vectors at every SIMD width");
  const std::size_t D = s.model_dim(), Dkv = s.kv_dim(), Dh = s.head_dim, H = s.n_heads, group = s.group();
  const std::size_t plane = s.value_plane();  // KV head g's values: rows of Dh at values + g * plane
  const T scale = T(1) / std::sqrt(T(Dh));
  const std::size_t h0 = s.first_head, h1 = s.heads_end();  // this call's heads; scratch rows h0..h1-1
  // One layout of the scratch for every query, so that calls on disjoint head ranges can share it.
  const std::size_t ld = (s.q_offset + s.q_len + key_block - 1) / key_block * key_block;
  for (std::size_t i = 0; i < s.q_len; ++i) {
    const std::size_t n = s.q_offset + i + 1;  // query i sees keys 0..n-1
    const std::size_t blocks = (n + key_block - 1) / key_block;
    T* p = scratch;           // (H, ld): scores, then probabilities
    T* inv = scratch + H * ld;  // (H): 1 / each head's sum of exponentials
    const T* qi = q + i * D;
    // g heads side by side, each over as many key blocks at once as make `chains` chains (4 heads
    // at 16 lanes: 4 blocks), then one block at a time. Without grouping, heads h.. read
    // consecutive KV heads; grouped, heads h.. are of one group and share their KV head's keys.
    auto scores = [&](auto side_by_side, std::size_t h) {
      constexpr std::size_t g = decltype(side_by_side)::value;
      constexpr std::size_t nb = std::max<std::size_t>(1, chains * W / (g * key_block));
      const S* head_keys = keys + h / group * Dh * key_block;
      std::size_t b = 0;
      for (; b + nb <= blocks; b += nb)
        detail::head_block_scores<B, g, key_block, nb>(p + h * ld + b * key_block, ld, qi + h * Dh,
                                                       head_keys + b * Dkv * key_block, Dkv * key_block, Dh, scale,
                                                       group > 1);
      for (; b < blocks; ++b)
        detail::head_block_scores<B, g, key_block>(p + h * ld + b * key_block, ld, qi + h * Dh,
                                                   head_keys + b * Dkv * key_block, Dkv * key_block, Dh, scale,
                                                   group > 1);
    };
    // Runs each(g, h) over heads first..last-1 in as few runs of g in {G, 4, 3, 2, 1} as fit.
    auto in_runs = [&](std::size_t first, std::size_t last, auto each) {
      std::size_t h = first;
      auto run = [&](auto side_by_side) {
        for (; h + decltype(side_by_side)::value <= last; h += decltype(side_by_side)::value) each(side_by_side, h);
      };
      run(std::integral_constant<std::size_t, G>{});
      if constexpr (G > 4) run(std::integral_constant<std::size_t, 4>{});
      if constexpr (G > 3) run(std::integral_constant<std::size_t, 3>{});
      if constexpr (G > 2) run(std::integral_constant<std::size_t, 2>{});
      run(std::integral_constant<std::size_t, 1>{});
    };
    // Each group's heads of the range, side by side (a range may start or end inside a group).
    auto in_groups = [&](auto each) {
      if (group == 1) return in_runs(h0, h1, each);
      for (std::size_t first = h0 / group * group; first < h1; first += group)
        in_runs(std::max(first, h0), std::min(first + group, h1), each);
    };
    in_groups(scores);
    // The softmax over whole vectors: keys n..n_pad-1 of the last block are not this query's (stale
    // or not yet written), and exp(-inf) = 0 leaves them out of the sum. The heads' maxima, then
    // their exponentials side by side; inv holds the maxima until it holds 1 / the sums.
    const std::size_t n_pad = (n + W - 1) / W * W;
    for (std::size_t h = h0; h < h1; ++h) {
      T* ph = p + h * ld;
      std::fill(ph + n, ph + n_pad, -std::numeric_limits<T>::infinity());
      inv[h] = detail::max_of<B>(ph, n_pad);
    }
    detail::exp_shifted_sums<B>(p + h0 * ld, ld, h1 - h0, n_pad, inv + h0, inv + h0);
    for (std::size_t h = h0; h < h1; ++h) inv[h] = T(1) / inv[h];
    T* oi = out + i * D;
    if (Dh % W == 0 && group == 1) {
      detail::head_weighted_rows<B>(oi + h0 * Dh, p + h0 * ld, ld, inv + h0, values + h0 * plane, Dh, n,
                                    (h1 - h0) * Dh, Dh, plane);
    } else if (Dh % W == 0) {  // each group's heads side by side over their KV head's values
      in_groups([&](auto side_by_side, std::size_t h) {
        detail::group_weighted_rows<B, decltype(side_by_side)::value>(oi + h * Dh, p + h * ld, ld, inv + h,
                                                                       values + h / group * plane, Dh, n, Dh);
      });
    } else if constexpr (std::is_same_v<S, T>) {  // a vector would span heads: one head at a time
      for (std::size_t h = h0; h < h1; ++h)
        detail::row_times_matrix<B>(oi + h * Dh, p + h * ld, 1, values + h / group * plane, Dh, n, Dh, inv[h], false);
    } else {  // row_times_matrix's chains (the level's fma, in every lane alike), one element at a time
      for (std::size_t h = h0; h < h1; ++h)
        for (std::size_t x = 0; x < Dh; ++x) {
          const S* column = values + h / group * plane + x;
          B acc(T(0));
          for (std::size_t j = 0; j < n; ++j)
            acc = fma(B(p[h * ld + j]), B(T(detail::half_to_float(column[j * Dh]))), acc);
          alignas(64) T lanes[W];
          (acc * B(inv[h])).store_aligned(lanes);
          oi[h * Dh + x] = lanes[0];
        }
    }
  }
}

}  // namespace

template <class T>
void cached_attention_forward(T* out, const T* q, const T* keys, const T* values, const AttentionShape& s, T* scratch) {
  attend_over_cache(out, q, keys, values, s, scratch);
}
TAPEGRAD_INSTANTIATE_KERNEL(cached_attention_forward)

template <class T>
void cached_attention_forward_f16(T* out, const T* q, const std::uint16_t* keys, const std::uint16_t* values,
                                  const AttentionShape& s, T* scratch) {
  attend_over_cache(out, q, keys, values, s, scratch);
}
TAPEGRAD_INSTANTIATE_KERNEL(cached_attention_forward_f16)

template <class T>
void round_to_halves(std::uint16_t* out, const T* x, std::size_t n) {
  using B = Batch<T>;
  constexpr std::size_t W = B::size;
  std::size_t i = 0;
  for (; i + W <= n; i += W) detail::store_halves(B::load_unaligned(x + i), out + i);
  for (; i < n; ++i) out[i] = detail::float_to_half(float(x[i]));  // F16C's rounding: the same bits
}
TAPEGRAD_INSTANTIATE_KERNEL(round_to_halves)

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
