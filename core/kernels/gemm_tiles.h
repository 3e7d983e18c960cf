// Private to core/kernels/: width-generic matrix products held in registers, for the products
// BLAS handles badly (decoding's rows, attention's tiles) and for the row-stable product whose
// every element is one FMA chain over k in order (tests/core/test_kernel_positions.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/kernels/simd_primitives.h"

namespace tapegrad::detail {

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


// C[i, 0:V*W] (+)= alpha * sum_k A(i, k) b[k * ldb + 0:V*W] for R rows i at once, A(i, k) =
// a[i * a_row + k * a_col]: R x V accumulators stay in registers across all of k (R = 6, V = 2 is
// the 6x16 block of AVX2 sgemm kernels: 12 accumulators, 2 loads and 6 broadcasts per 12 FMAs).
// With l1_ahead, b's lines are asked into L1 that many rows of b ahead (packed_product's panels).
template <class B, std::size_t R, std::size_t V, std::size_t l1_ahead = 0>
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
    if constexpr (l1_ahead > 0) {
      constexpr std::size_t line = 64 / sizeof(T);
      for (std::size_t v = 0; v < V * W; v += line) __builtin_prefetch(b + (k + l1_ahead) * ldb + v, 0, 3);
    }
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

/// Asks for the lines of a block of rows (`rows` of row_bytes, ld_bytes apart) in memory order, a
/// few at a time, into L2: a slice of weights read next, fetched while the one before it is used.
class LineStream {
 public:
  LineStream() = default;
  LineStream(const void* first, std::size_t ld_bytes, std::size_t row_bytes, std::size_t rows)
      : row_(static_cast<const char*>(first)), ld_bytes_(ld_bytes), row_bytes_(row_bytes),
        left_(rows * ((row_bytes + 63) / 64)) {}
  std::size_t lines_left() const { return left_; }
  void fetch(std::size_t lines) {
    for (; lines > 0 && left_ > 0; --lines, --left_) {
      __builtin_prefetch(row_ + column_, 0, 2);
      column_ += 64;
      if (column_ >= row_bytes_) column_ = 0, row_ += ld_bytes_;
    }
  }

 private:
  const char* row_ = nullptr;
  std::size_t ld_bytes_ = 0, row_bytes_ = 0, column_ = 0, left_ = 0;
};

// part[r * ldp + 0:V*W] for R rows: the FMA chains over kc rows of b continued from part (from
// zero when `first`), stored back unrounded, so that slices of k give each element the chain the
// whole of k gives it. Each iteration asks `ahead` for lines_each lines.
template <class B, std::size_t R, std::size_t V>
inline void tile_slice(typename B::value_type* part, std::size_t ldp, const typename B::value_type* a, std::size_t lda,
                       const typename B::value_type* b, std::size_t ldb, std::size_t kc, bool first, LineStream& ahead,
                       std::size_t lines_each) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size;
  B sum[R][V];
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t v = 0; v < V; ++v) sum[r][v] = first ? B(T(0)) : B::load_unaligned(part + r * ldp + v * W);
  for (std::size_t k = 0; k < kc; ++k) {
    ahead.fetch(lines_each);
    B col[V];
    for (std::size_t v = 0; v < V; ++v) col[v] = B::load_unaligned(b + k * ldb + v * W);
    for (std::size_t r = 0; r < R; ++r) {
      B x(a[r * lda + k]);
      for (std::size_t v = 0; v < V; ++v) sum[r][v] = fma(x, col[v], sum[r][v]);
    }
  }
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t v = 0; v < V; ++v) sum[r][v].store_unaligned(part + r * ldp + v * W);
}

/// The columns of row_stable_product in whole blocks of V vectors, for a few rows (batched
/// decoding): k in slices of KC rows of b, each slice's blocks passed by every 6-row tile while
/// the slice is in L1, and the next slice (KC whole rows: memory order) fetched into L2 meanwhile.
/// The chains' partial sums wait in a scratch array between slices. b is read from memory once, in
/// its own order: a decoding step's products of SmolLM2's F32 layers, one thread, went from 5.0
/// to 8.7 GB/s at 16 rows, and from 6.0 to 12.4 at 4 (one pass over b per row before). Returns
/// the columns done; `scratch` holds the partial sums (grown to M x the columns done).
template <class B, std::size_t V>
std::size_t sliced_columns(typename B::value_type* c, std::size_t ldc, const typename B::value_type* a, std::size_t lda,
                           const typename B::value_type* b, std::size_t ldb, std::size_t M, std::size_t N,
                           std::size_t K, bool accumulate, std::vector<typename B::value_type>& scratch) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size, R = 6, KC = 64;
  const std::size_t whole = N / (V * W) * (V * W), blocks = whole / (V * W), tiles = (M + R - 1) / R;
  if (whole == 0 || K == 0) return 0;
  if (scratch.size() < M * whole) scratch.resize(M * whole);
  T* part = scratch.data();
  for (std::size_t k0 = 0; k0 < K; k0 += KC) {
    const std::size_t kc = std::min(KC, K - k0), next_rows = std::min(KC, K - k0 - kc);
    LineStream ahead(b + (k0 + kc) * ldb, ldb * sizeof(T), whole * sizeof(T), next_rows);
    const std::size_t passes = blocks * tiles * kc, lines_each = (ahead.lines_left() + passes - 1) / passes;
    for (std::size_t j = 0; j < whole; j += V * W) {
      auto tile = [&]<std::size_t rows>(std::size_t i) {
        tile_slice<B, rows, V>(part + i * whole + j, whole, a + i * lda + k0, lda, b + k0 * ldb + j, ldb, kc, k0 == 0,
                               ahead, lines_each);
      };
      std::size_t i = 0;
      for (; i + R <= M; i += R) tile.template operator()<R>(i);
      [&]<std::size_t... rows>(std::index_sequence<rows...>) {
        ((M - i == rows + 1 ? tile.template operator()<rows + 1>(i) : void()), ...);
      }(std::make_index_sequence<R - 1>{});
    }
  }
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < whole; j += W) {
      B total = B::load_unaligned(part + i * whole + j);
      if (accumulate) total += B::load_unaligned(c + i * ldc + j);
      total.store_unaligned(c + i * ldc + j);
    }
  return whole;
}

/// C (M, N) (+)= A (M, K) B (K, N), all row-major with leading dimensions, where every element of C
/// is one FMA chain over k = 0..K-1 starting from zero (then + C when accumulating). The tiling
/// (by M) and the SIMD width only decide which elements run side by side, never the order of an
/// element's sum, so a row's result does not depend on M or on the rows that come with it: one
/// sequence decoded alone gets the same bits as in a batch. One row goes through row_in_registers;
/// up to 32 through sliced_columns; more in 6-row tiles over the whole of k (each strip of columns
/// then stays in L2 while the tiles pass). The columns past the last whole block of 6-row tiles,
/// and past the last whole vector (a vocabulary of 65 leaves one), go through the same batch
/// arithmetic: single vectors, then a zero-padded copy of B's tail: a (K, W) panel made once and
/// then 6-row tiles, for K up to 256; row by row past that. `scratch` is sliced_columns' (a
/// decoding step's caller keeps one, so that steps allocate nothing; a local one when null).
template <class B>
void row_stable_product(typename B::value_type* c, std::size_t ldc, const typename B::value_type* a, std::size_t lda,
                        const typename B::value_type* b, std::size_t ldb, std::size_t M, std::size_t N, std::size_t K,
                        bool accumulate, std::vector<typename B::value_type>* scratch = nullptr) {
  using T = typename B::value_type;
  constexpr std::size_t W = B::size, wide = sizeof(B) >= 64 ? 4 : 2;  // tile_rows' vectors per 6-row tile
  constexpr std::size_t sliced_rows = 32;  // their partial sums (32 x 1536 floats at most) stay in L2
  if (M == 1) return row_in_registers<B>(c, a, b, ldb, K, N, accumulate);
  std::size_t j = 0;
  if (M <= sliced_rows) {
    std::vector<T> local;
    j = sliced_columns<B, wide>(c, ldc, a, lda, b, ldb, M, N, K, accumulate, scratch ? *scratch : local);
  }
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
