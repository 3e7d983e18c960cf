// Causal multi-head attention (Vaswani et al. 2017) over packed heads, computed flash-style
// (Dao et al. 2022, FlashAttention; Dao 2023, FlashAttention-2): tiles of queries and keys, an online
// softmax, only the log-sum-exp of each row saved, and probabilities recomputed in backward, so
// memory is O(T) per head. Head h of a row is columns [h*Dh, (h+1)*Dh) of the (.., H*Dh) tensors;
// with grouped-query attention it reads KV head h / group, columns of the (.., KVH*Dh) k and v.
// Each (batch, head) pair runs on one thread (in backward, each (batch, KV head) pair with its
// query heads in order), in a fixed order: results do not depend on the thread count.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "core/aligned.h"
#include "core/kernels/level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

// 64 x 64 tiles: a tile of scores (16 KiB in float) and the key and query slices it is made from
// stay in L1/L2 at Dh <= 64.
constexpr std::size_t q_tile = 64, k_tile = 64;
// A tile on the causal diagonal goes in chunks of this many rows, the register block of
// tile_product, each only over the keys (or queries) it pairs with.
constexpr std::size_t diagonal_chunk = 6;

template <class T> constexpr T minus_infinity = -std::numeric_limits<T>::infinity();

std::size_t round_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }

struct HeadView {  // one (batch, head) pair's slices: q's and out's column, k's and v's
  std::size_t q_row0, kv_row0, col0, kv_col0, lse0;
};

HeadView head_view(const AttentionShape& s, std::size_t pair) {
  std::size_t b = pair / s.n_heads, h = pair % s.n_heads;
  return {b * s.q_len, b * s.kv_len, h * s.head_dim, h / s.group() * s.head_dim, pair * s.q_len};
}

/// dst (rows, ld) = the head's slice src (rows, Dh) of a (.., D) tensor, zero-padded to ld columns.
template <class T>
void copy_padded(T* dst, std::size_t ld, const T* src, std::size_t D, std::size_t rows, std::size_t Dh) {
  for (std::size_t r = 0; r < rows; ++r) {  // a plain loop: a memmove call per short row costs more
    for (std::size_t d = 0; d < Dh; ++d) dst[r * ld + d] = src[r * D + d];
    for (std::size_t d = Dh; d < ld; ++d) dst[r * ld + d] = T(0);
  }
}

/// A head's rows (rows, Dp) as tile_product's B operand: whole vectors per row.
template <class T>
struct Operand {
  const T* data;
  std::size_t ld;
  const T* row(std::size_t r) const { return data + r * ld; }
};

/// Whether rows row_bytes apart, read in place, spread a tile's 64 rows over at least 16 of L1's
/// 64 sets (of 64-byte lines, repeating every 4 KiB). At 1 KiB apart (D = 256 floats) they share
/// 4 sets of 8 ways and every pass over the tile evicts itself: cachegrind counts 55-70% more L1
/// misses for the attention at D = 256 read in place than copied, 8% more at D = 64.
inline bool rows_spread_over_l1(std::size_t row_bytes) {
  constexpr std::size_t line = 64, sets = 64;
  if (row_bytes % line != 0) return true;  // rows straddle lines: consecutive rows start in different sets
  return sets / std::gcd(sets, row_bytes / line) >= 16;
}

/// The head's slice src (rows, Dh) of a (.., D) tensor read in place when Dh is a whole number of
/// vectors (Dh == Dp) and the rows spread over L1, else copied into scratch zero-padded to Dp columns.
template <class T>
Operand<T> whole_vectors(AlignedVector<T>& scratch, const T* src, std::size_t D, std::size_t rows, std::size_t Dh,
                         std::size_t Dp) {
  if (Dh == Dp && rows_spread_over_l1(D * sizeof(T))) return {src, D};
  scratch.resize(rows * Dp);
  copy_padded(scratch.data(), Dp, src, D, rows, Dh);
  return {scratch.data(), Dp};
}

/// The leading dimension of a transposed (Dh, keys) operand: whole vectors, plus one more when
/// its rows would otherwise crowd into a few L1 sets (keys = 256 floats: 4 sets; 1024: 1 set).
template <class T>
std::size_t transposed_ld(std::size_t keys) {
  const std::size_t ld = round_up(keys, Batch<T>::size);
  return rows_spread_over_l1(ld * sizeof(T)) ? ld : ld + Batch<T>::size;
}

/// dst (Dh, ld) = the head's slice src (rows, Dh) transposed; columns rows..ld are zero. Eight
/// source rows at a time, so that each store writes 8 consecutive elements of a row of dst (one
/// element per store, strided by ld, measured as half of the forward's own time at T = 256).
template <class T>
void copy_transposed(T* dst, std::size_t ld, const T* src, std::size_t D, std::size_t rows, std::size_t Dh) {
  constexpr std::size_t block = 8;
  for (std::size_t d = 0; d < Dh; ++d) std::fill(dst + d * ld + rows, dst + (d + 1) * ld, T(0));
  std::size_t r0 = 0;
  for (; r0 + block <= rows; r0 += block)
    for (std::size_t d = 0; d < Dh; ++d)
      for (std::size_t r = 0; r < block; ++r) dst[d * ld + r0 + r] = src[(r0 + r) * D + d];
  for (std::size_t r = r0; r < rows; ++r)
    for (std::size_t d = 0; d < Dh; ++d) dst[d * ld + r] = src[r * D + d];
}

/// dst[r * ld_dst + d] += src[r * ld_src + d] for r < rows, d < Dh; = with overwrite.
template <class T>
void add_rows(T* dst, std::size_t ld_dst, const T* src, std::size_t ld_src, std::size_t rows, std::size_t Dh,
              bool overwrite) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t d = 0; d < Dh; ++d)
      dst[r * ld_dst + d] = overwrite ? src[r * ld_src + d] : dst[r * ld_dst + d] + src[r * ld_src + d];
}

/// Scores of a tile, s (rows, cols_pad) = scale * q_tile kt[:, j0:], with -inf where query i0 + i
/// (absolute position q_offset + i0 + i) may not see key j0 + j, and in the padding columns.
template <class T>
void tile_scores(T* s, const T* q, std::size_t D, const T* kt, std::size_t ld_kt, std::size_t rows, std::size_t cols,
                 std::size_t cols_pad, std::size_t Dh, T scale, std::size_t first_query_pos, std::size_t j0) {
  detail::tile_product<Batch<T>>(s, k_tile, q, D, 1, kt + j0, ld_kt, rows, cols_pad, Dh, scale, false);
  for (std::size_t i = 0; i < rows; ++i) {
    std::size_t last_key = first_query_pos + i;  // inclusive
    std::size_t visible = last_key < j0 ? 0 : std::min(cols, last_key - j0 + 1);
    std::fill(s + i * k_tile + visible, s + i * k_tile + cols_pad, minus_infinity<T>);
  }
}

/// The one-query (decoding) form, for one or two query rows: scores with dot products straight
/// from the key rows, no tiles and no transposed copies. p (q_offset + q_len) is scratch.
template <class T>
void attention_rows(T* oh, T* lse, const T* qh, const T* kh, const T* vh, const AttentionShape& s, T* p) {
  const std::size_t D = s.model_dim(), Dkv = s.kv_dim(), Dh = s.head_dim;
  const T scale = T(1) / std::sqrt(T(Dh));
  for (std::size_t i = 0; i < s.q_len; ++i) {
    std::size_t visible = s.q_offset + i + 1;
    // Every score one way: W keys at a time when Dh is a multiple of W, else each by dot.
    if (detail::dots_with_rows<Batch<T>>(p, qh + i * D, kh, Dkv, Dh, visible, scale, false) == 0)
      for (std::size_t j = 0; j < visible; ++j) p[j] = scale * detail::dot<Batch<T>>(qh + i * D, kh + j * Dkv, Dh);
    T m = detail::max_of<Batch<T>>(p, visible);
    T sum = detail::exp_shifted_sum<Batch<T>>(p, visible, m);
    detail::row_times_matrix<Batch<T>>(oh + i * D, p, 1, vh, Dkv, visible, Dh, T(1) / sum, false);
    if (lse) lse[i] = m + std::log(sum);
  }
}

// Before any thread starts: an exception cannot leave an OpenMP region.
void check_shape(const AttentionShape& s) {
  if (s.n_heads == 0 || s.kv_heads() > s.n_heads || s.n_heads % s.kv_heads() != 0)
    throw std::invalid_argument(fmt::format("attention: the KV heads must divide the heads; got n_heads {}, "
                                            "n_kv_heads {}",
                                            s.n_heads, s.n_kv_heads));
  if (s.q_offset + s.q_len > s.kv_len)
    throw std::invalid_argument(fmt::format("attention: q_offset + q_len exceeds kv_len; got q_offset {}, q_len {}, "
                                            "kv_len {}",
                                            s.q_offset, s.q_len, s.kv_len));
}

}  // namespace

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionShape& s) {
  check_shape(s);
  const std::size_t D = s.model_dim(), Dkv = s.kv_dim(), Dh = s.head_dim, Tq = s.q_len;
  constexpr std::size_t W = Batch<T>::size;
  const std::size_t keys = s.q_offset + Tq;  // keys any query sees; later ones (up to kv_len) are not read
  const std::size_t Dp = round_up(Dh, W), ld_kt = transposed_ld<T>(keys);
  const T scale = T(1) / std::sqrt(T(Dh));
  detail::parallel_for(s.batch * s.n_heads, Tq * keys * Dh * 2, [&](std::size_t pair) {
    HeadView hv = head_view(s, pair);
    const T* qh = q + hv.q_row0 * D + hv.col0;
    const T* kh = k + hv.kv_row0 * Dkv + hv.kv_col0;
    const T* vh = v + hv.kv_row0 * Dkv + hv.kv_col0;
    T* oh = out + hv.q_row0 * D + hv.col0;
    T* lh = lse ? lse + hv.lse0 : nullptr;
    if (Tq <= 2) {
      thread_local AlignedVector<T> p;
      p.resize(keys);
      return attention_rows(oh, lh, qh, kh, vh, s, p.data());
    }
    // Per pair: keys transposed (Dh, ld_kt) and values padded (keys, Dp), so that every tile
    // product reads whole vectors; per query tile: scores (q_tile, k_tile) and the output (q_tile, Dp).
    thread_local AlignedVector<T> kt, vp, scores, acc, row_max, row_sum;
    kt.resize(Dh * ld_kt), scores.resize(q_tile * k_tile), acc.resize(q_tile * Dp);
    row_max.resize(q_tile), row_sum.resize(q_tile);
    copy_transposed(kt.data(), ld_kt, kh, Dkv, keys, Dh);
    const Operand<T> values = whole_vectors(vp, vh, Dkv, keys, Dh, Dp);
    for (std::size_t i0 = 0; i0 < Tq; i0 += q_tile) {
      const std::size_t rows = std::min(q_tile, Tq - i0), first_pos = s.q_offset + i0;
      const std::size_t tile_keys = first_pos + rows;  // keys this tile's queries see: later tiles are skipped
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(row_max.begin(), row_max.end(), minus_infinity<T>);
      std::fill(row_sum.begin(), row_sum.end(), T(0));
      for (std::size_t j0 = 0; j0 < tile_keys; j0 += k_tile) {
        const std::size_t cols = std::min(k_tile, tile_keys - j0);
        // On the diagonal, chunks compute scores and P v only up to the last key their rows see:
        // about half of a diagonal tile's work, and 4 of the 10 tiles at T = 256 are diagonal.
        const bool diagonal = first_pos < j0 + cols - 1;
        const std::size_t chunk = diagonal ? diagonal_chunk : rows;
        for (std::size_t r0 = 0; r0 < rows; r0 += chunk) {
          const std::size_t n = std::min(chunk, rows - r0), last_key = first_pos + r0 + n - 1;  // inclusive
          if (last_key < j0) continue;  // no row of the chunk sees a key of this tile
          const std::size_t seen = std::min(cols, last_key - j0 + 1), seen_pad = round_up(seen, W);
          T* st = scores.data() + r0 * k_tile;
          tile_scores(st, qh + (i0 + r0) * D, D, kt.data(), ld_kt, n, seen, seen_pad, Dh, scale, first_pos + r0, j0);
          // Online softmax: m' = max(m, max_j s_j); l' = l e^(m - m') + sum_j e^(s_j - m'); the
          // output so far is rescaled by e^(m - m'). Key 0 is in every row's first tile, so m is
          // finite from then on and a row with no visible key in a later tile adds exactly 0.
          for (std::size_t i = r0; i < r0 + n; ++i) {
            T* sr = scores.data() + i * k_tile;
            T m = std::max(row_max[i], detail::max_of<Batch<T>>(sr, seen_pad));
            T sum = detail::exp_shifted_sum<Batch<T>>(sr, seen_pad, m);
            T correction = std::exp(row_max[i] - m);  // 0 on the first tile (m was -inf)
            row_sum[i] = row_sum[i] * correction + sum;
            row_max[i] = m;
            if (correction != T(1))
              for (std::size_t d = 0; d < Dp; ++d) acc[i * Dp + d] *= correction;
          }
          // acc (n, Dp) += P (n, seen) v[j0:j0+seen]
          detail::tile_product<Batch<T>>(acc.data() + r0 * Dp, Dp, st, k_tile, 1, values.row(j0), values.ld, n, Dp,
                                         seen, T(1), true);
        }
      }
      for (std::size_t i = 0; i < rows; ++i) {
        T inv = T(1) / row_sum[i];
        for (std::size_t d = 0; d < Dh; ++d) oh[(i0 + i) * D + d] = acc[i * Dp + d] * inv;
        if (lh) lh[i0 + i] = row_max[i] + std::log(row_sum[i]);
      }
    }
  });
}
TAPEGRAD_INSTANTIATE_KERNEL(attention_forward)

// With P_ij = exp(s_ij - lse_i) recomputed per tile, dP = dout v^T and
// delta_i = sum_j P_ij dP_ij = dout_i . out_i (FlashAttention-2):
//   dS = P * (dP - delta) / sqrt(Dh);  dv += P^T dout;  dq += dS k;  dk += dS^T q.
// One thread per (batch, KV head) pair, its query heads in order. Per query head, key tiles are
// the outer loop (their dk, dv are summed in place); dq is summed over the key tiles of the head
// in a per-head buffer, so each element's sum has one fixed order. Each element of dq is written
// once, by its head's last step, and each of dk and dv once per query head of its KV head, so
// overwrite only changes the first of those steps.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, const AttentionShape& s, bool overwrite) {
  check_shape(s);
  const std::size_t D = s.model_dim(), Dkv = s.kv_dim(), Dh = s.head_dim, Tq = s.q_len, group = s.group();
  constexpr std::size_t W = Batch<T>::size;
  const std::size_t Dp = round_up(Dh, W), keys = s.q_offset + Tq, ld_t = transposed_ld<T>(keys);
  const T scale = T(1) / std::sqrt(T(Dh));
  if (!dq && !dk && !dv) return;
  detail::parallel_for(s.batch * s.kv_heads(), Tq * keys * Dh * 4 * group, [&](std::size_t kv_pair) {
    const std::size_t first_pair = kv_pair * group;  // (b, h) pairs are b * H + h, and KV head c's heads c*group..
    HeadView kv = head_view(s, first_pair);
    const T* kh = k + kv.kv_row0 * Dkv + kv.kv_col0;
    const T* vh = v + kv.kv_row0 * Dkv + kv.kv_col0;
    // Operands laid out for tile_product: q, dout and k as rows of whole vectors; k and v transposed.
    thread_local AlignedVector<T> qp, dop, kp, kt, vt, delta, dq_acc, dk_tile, dv_tile, p, ds;
    kt.resize(Dh * ld_t), vt.resize(Dh * ld_t);
    delta.resize(Tq), dk_tile.resize(k_tile * Dp), dv_tile.resize(k_tile * Dp);
    p.resize(q_tile * k_tile), ds.resize(q_tile * k_tile);
    const Operand<T> k_rows = whole_vectors(kp, kh, Dkv, keys, Dh, Dp);
    copy_transposed(kt.data(), ld_t, kh, Dkv, keys, Dh);
    copy_transposed(vt.data(), ld_t, vh, Dkv, keys, Dh);
    for (std::size_t pair = first_pair; pair < first_pair + group; ++pair) {
      HeadView hv = head_view(s, pair);
      const bool overwrite_kv = overwrite && pair == first_pair;
      const T* qh = q + hv.q_row0 * D + hv.col0;
      const T* doh = dout + hv.q_row0 * D + hv.col0;
      const T* oh = out + hv.q_row0 * D + hv.col0;
      const T* lh = lse + hv.lse0;
      dq_acc.assign(dq ? Tq * Dp : 0, T(0));
      const Operand<T> q_rows = whole_vectors(qp, qh, D, Tq, Dh, Dp), dout_rows = whole_vectors(dop, doh, D, Tq, Dh, Dp);
      for (std::size_t i = 0; i < Tq; ++i) delta[i] = detail::dot<Batch<T>>(doh + i * D, oh + i * D, Dh);
      for (std::size_t j0 = 0; j0 < keys; j0 += k_tile) {
        const std::size_t cols = std::min(k_tile, keys - j0), cols_pad = round_up(cols, W);
        // Query i sees key j when j <= q_offset + i: tiles of queries wholly before j0 are skipped.
        const std::size_t first_query = j0 > s.q_offset ? j0 - s.q_offset : 0;
        std::fill(dk_tile.begin(), dk_tile.end(), T(0));
        std::fill(dv_tile.begin(), dv_tile.end(), T(0));
        for (std::size_t i0 = first_query / q_tile * q_tile; i0 < Tq; i0 += q_tile) {
          const std::size_t rows = std::min(q_tile, Tq - i0), first_pos = s.q_offset + i0;
          // On the diagonal, chunks of queries (for P, dS and dq) and of keys (for dk and dv).
          const bool diagonal = first_pos < j0 + cols - 1;
          const std::size_t chunk = diagonal ? diagonal_chunk : std::max(rows, cols);
          T *pt = p.data(), *dst = ds.data();
          for (std::size_t r0 = 0; r0 < rows; r0 += chunk) {
            const std::size_t n = std::min(chunk, rows - r0), last_key = first_pos + r0 + n - 1;  // inclusive
            const std::size_t seen = last_key < j0 ? 0 : std::min(cols, last_key - j0 + 1), seen_pad = round_up(seen, W);
            T *pc = pt + r0 * k_tile, *dc = dst + r0 * k_tile;
            for (std::size_t i = 0; i < n; ++i) {  // the dk and dv products below read whole columns: zero the rest
              std::fill(pc + i * k_tile + seen_pad, pc + i * k_tile + cols_pad, T(0));
              std::fill(dc + i * k_tile + seen_pad, dc + i * k_tile + cols_pad, T(0));
            }
            if (seen == 0) continue;
            tile_scores(pc, qh + (i0 + r0) * D, D, kt.data(), ld_t, n, seen, seen_pad, Dh, scale, first_pos + r0, j0);
            for (std::size_t i = 0; i < n; ++i)
              detail::exp_shifted_sum<Batch<T>>(pc + i * k_tile, seen_pad, lh[i0 + r0 + i]);
            if (!dq && !dk) continue;
            // dP (n, seen_pad) = dout_chunk v^T, then dS in place.
            detail::tile_product<Batch<T>>(dc, k_tile, doh + (i0 + r0) * D, D, 1, vt.data() + j0, ld_t, n, seen_pad,
                                           Dh, T(1), false);
            for (std::size_t i = 0; i < n; ++i) {
              const T* pr = pc + i * k_tile;
              T* dr = dc + i * k_tile;
              const T centre = delta[i0 + r0 + i];
              for (std::size_t j = 0; j < seen_pad; ++j) dr[j] = pr[j] * (dr[j] - centre) * scale;
            }
            if (dq)  // dq_acc (n, Dp) += dS k[j0:j0+seen]
              detail::tile_product<Batch<T>>(dq_acc.data() + (i0 + r0) * Dp, Dp, dc, k_tile, 1, k_rows.row(j0),
                                             k_rows.ld, n, Dp, seen, T(1), true);
          }
          for (std::size_t c0 = 0; c0 < cols; c0 += chunk) {
            const std::size_t n = std::min(chunk, cols - c0);
            const std::size_t first = j0 + c0 > first_pos ? j0 + c0 - first_pos : 0;  // first query seeing key j0 + c0
            if (first >= rows) break;
            const std::size_t K = rows - first;
            if (dv)  // dv_tile (n, Dp) += P^T dout_tile
              detail::tile_product<Batch<T>>(dv_tile.data() + c0 * Dp, Dp, pt + first * k_tile + c0, 1, k_tile,
                                             dout_rows.row(i0 + first), dout_rows.ld, n, Dp, K, T(1), true);
            if (dk)  // dk_tile (n, Dp) += dS^T q_tile
              detail::tile_product<Batch<T>>(dk_tile.data() + c0 * Dp, Dp, dst + first * k_tile + c0, 1, k_tile,
                                             q_rows.row(i0 + first), q_rows.ld, n, Dp, K, T(1), true);
          }
        }
        if (dk) add_rows(dk + (hv.kv_row0 + j0) * Dkv + hv.kv_col0, Dkv, dk_tile.data(), Dp, cols, Dh, overwrite_kv);
        if (dv) add_rows(dv + (hv.kv_row0 + j0) * Dkv + hv.kv_col0, Dkv, dv_tile.data(), Dp, cols, Dh, overwrite_kv);
      }
      if (dq) add_rows(dq + hv.q_row0 * D + hv.col0, D, dq_acc.data(), Dp, Tq, Dh, overwrite);
    }
  });
}
TAPEGRAD_INSTANTIATE_KERNEL(attention_backward)

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
