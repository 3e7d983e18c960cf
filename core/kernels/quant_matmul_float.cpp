// This level's packed kernels for F16 and F32 weights (core/quant/packed_kernels.h): float
// products, the weights widened exactly, sixteen outputs' weights of one column side by side
// (core/quant/row_groups.h) meeting x's value broadcast, each output's operations as Note [Packed
// products] fixes them, in tiles of one group by MR rows of x. One loop for every level, on its
// widest batch with a fused multiply-add (two at AVX2 make a group, one at AVX-512 and emulated16,
// one 16-lane loop of std::fma at SSE2).
#include <bit>
#include <cmath>

#include "core/aligned.h"
#include "core/kernels/quant_matmul_tiles.h"
#include "core/kernels/register_transpose.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

using quant::ActivationRows;
using quant::PackedMatrix;
using quant::TensorType;

#if defined(__AVX2__) || defined(TAPEGRAD_EMULATED_BATCH)
using Floats = Batch<float>;
#else
using Floats = EmulatedBatch<float, 16>;  // SSE2 has no fused multiply-add: std::fma a lane
#endif
constexpr std::size_t batches = group_rows / Floats::size;  // a group's 16 lanes

// Column k's weights of a group (the unit at p), as floats, exactly (F16's halves widened).
template <TensorType type> inline void widen(const std::byte* p, Floats (&w)[batches]) {
  if constexpr (type == TensorType::F32) {
    for (std::size_t i = 0; i < batches; ++i) w[i] = Floats::load_unaligned(reinterpret_cast<const float*>(p) + i * Floats::size);
  } else {
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
    w[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
    for (std::size_t i = 0; i < batches; ++i) w[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)));
#else
    alignas(64) float f[group_rows];
    for (std::size_t l = 0; l < group_rows; ++l) f[l] = half_to_float(load_u16(p + 2 * l));
    for (std::size_t i = 0; i < batches; ++i) w[i] = Floats::load_aligned(f + i * Floats::size);
#endif
  }
}

// Outputs of groups g .. g + NG - 1 for x's rows m0 .. m0 + MR - 1 (at xs, ldx apart; with
// `columns`, x's rows transposed: row i's k at xs[k * MR + i]): acc = fma(w[k], x[k], acc), k in
// order. When `ahead` is not zero, it asks for the weights `ahead` bytes on into L2 as it goes: the
// next tile of groups streams from memory while this one's tiles of rows compute. `stream` as
// TileSums::store.
// With `columns`, the weights' lines and the runs' are asked into L1 this many columns ahead: a
// group's pass over 576 columns or more evicts the runs' lines before the next group reads them,
// so that both missed L1 at every k. 16 rows of SmolLM2's F32 file, one thread of a Xeon of family
// 6 model 167: 273-278 -> 306-309 tokens/s (8 columns ahead 298-303, 32 as 16; either alone 278-283).
constexpr std::size_t l1_ahead = 16;
template <TensorType type, int NG, int MR, bool columns = false>
void float_tile(float* y, std::size_t ldy, const float* xs, std::size_t ldx, const PackedMatrix& w,
                                      std::size_t g, std::size_t m0, std::size_t first, std::size_t last,
                                      std::size_t ahead, bool accumulate, bool stream = false) {
  constexpr std::size_t unit_bytes = quant::unit_layout(type).bytes;
  const std::byte* groups[NG];
  for (int j = 0; j < NG; ++j) groups[j] = w.group(g + j);
  TileSums<Floats, NG, MR, batches> sums;
  auto& acc = sums.lanes;
  for (std::size_t k = 0; k < w.cols; ++k) {
    Floats weights[NG][batches];
    for (int j = 0; j < NG; ++j) {
      if (ahead && (unit_bytes == 64 || k % 2 == 0))
        _mm_prefetch(reinterpret_cast<const char*>(groups[j] + k * unit_bytes + ahead), _MM_HINT_T1);
      if (columns && (unit_bytes == 64 || k % 2 == 0))
        _mm_prefetch(reinterpret_cast<const char*>(groups[j] + (k + l1_ahead) * unit_bytes), _MM_HINT_T0);
      widen<type>(groups[j] + k * unit_bytes, weights[j]);
    }
    if constexpr (columns) _mm_prefetch(reinterpret_cast<const char*>(xs + (k + l1_ahead) * MR), _MM_HINT_T0);
    for (int i = 0; i < MR; ++i) {
      const Floats xv(columns ? xs[k * MR + i] : xs[i * ldx + k]);
      for (int j = 0; j < NG; ++j)
        for (std::size_t b = 0; b < batches; ++b) acc[j][i][b] = fma(weights[j][b], xv, acc[j][i][b]);
    }
  }
  sums.store(y, ldy, g, m0, first, last, accumulate, stream);
}

// 16 to 31 rows at 16 lanes: tiles of one group by 16 rows, so that each group's weights stream
// once, in one pass for the first 16 rows (a 3 x 8 tile's second pass over its groups computed
// from L2 while nothing streamed), and the outputs go past the caches (TileSums::store). x's rows
// in runs of 16 (the last one shorter), each run transposed: a tile's broadcasts at k are then one
// line, at fixed offsets (Intel cores split an FMA whose memory operand has an index register in
// two). 16 rows of 100 copies of SmolLM2's F32 gate matrix, one thread of a Xeon of family 6 model
// 167: 288-301 us a matrix against 340-371 with 3 x 8 tiles, 24 rows 369 against 443. From 32 rows
// the FMAs bound the product, and 3 x 8 tiles do more with each load (48 rows: 730 against 805).
template <TensorType type>
void sixteen_row_tiles(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                       std::size_t last, bool accumulate) {
  thread_local AlignedVector<float> runs;  // run r: rows 16r.., (cols, its rows)
  grow_to(runs, x.rows * x.cols);
  for (std::size_t m0 = 0; m0 < x.rows; m0 += 16) {
    const std::size_t n = std::min<std::size_t>(16, x.rows - m0);
    float* run = runs.data() + m0 * x.cols;
    const float* rows = x.x + m0 * x.cols;
    std::size_t k = 0;
    if (n == transpose_block)  // AVX-512: whole runs in 16 x 16 blocks
      for (; k + n <= x.cols; k += n) transpose_floats(rows + k, x.cols, run + k * n, n);
    for (; k < x.cols; ++k)
      for (std::size_t i = 0; i < n; ++i) run[k * n + i] = rows[i * x.cols + k];
  }
  auto tile = [&]<int NG, int MR>(std::size_t g, std::size_t m0) {
    const std::size_t ahead = m0 == 0 && g + 2 * NG <= w.groups() ? NG * w.group_bytes() : 0;
    float_tile<type, NG, MR, true>(y, ldy, runs.data() + m0 * x.cols, MR, w, g, m0, first, last, ahead, accumulate,
                                   true);
  };
  run_groups<1, 16>(tile, x.rows, first, last);
  end_streamed_stores();
}

// Tiles of as many accumulators as the level's registers hold beside a column's weights. One row
// of x meets one group at a time: the weights then stream as one run of bytes, which a Zen 4 core
// reads 1.1-1.3x as fast as 8 groups' runs side by side (F32 and F16 matrices of SmolLM2, 1 and 2
// threads; one chain of FMAs a lane still outruns memory: 64 bytes of F32 each 4 cycles).
// More rows meet several groups.
template <TensorType type>
void float_rows(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                std::size_t last, bool accumulate) {
  auto tile = [&]<int NG, int MR>(std::size_t g, std::size_t m0) {
    const bool asks = m0 == 0 && x.rows >= rows_to_prefetch && g + 2 * NG <= w.groups();
    const std::size_t ahead = asks ? NG * w.group_bytes() : 0;
    float_tile<type, NG, MR>(y, ldy, x.x + m0 * x.cols, x.cols, w, g, m0, first, last, ahead, accumulate);
  };
  if (x.rows == 1) return run_groups<1, 1>(tile, x.rows, first, last);
#if defined(__AVX512F__) || defined(TAPEGRAD_EMULATED_BATCH)
  if (x.rows >= 16 && x.rows < 32) return sixteen_row_tiles<type>(y, ldy, x, w, first, last, accumulate);
#endif
  if constexpr (batches == 1) run_groups<3, 8>(tile, x.rows, first, last);
  else run_groups<1, 12 / int(batches)>(tile, x.rows, first, last);
}

}  // namespace

void set_float_kernels(quant::PackedKernelTable& table) {
  table.f16 = float_rows<TensorType::F16>;
  table.f32 = float_rows<TensorType::F32>;
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
