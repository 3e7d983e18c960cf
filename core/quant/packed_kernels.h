// Private to core/: the kernels of packed_matmul, one table per SIMD level (core/kernels/
// quant_matmul*.cpp, compiled per level as the float kernels are), and the 8-bit activation
// blocks the block formats' integer dot products read.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/aligned.h"
#include "core/quant/packed_matrix.h"

// Note [Packed products]
// Every output y[m][n] = x[m] . W[n] is computed by one fixed sequence of operations, so that its
// bits never depend on M, on the rows beside it, on the thread count or on the SIMD level:
//
// Block formats (Q4_0, Q4_1, Q5_0, Q8_0; as llama.cpp's vec_dot with Q8_0/Q8_1 activations): x's row
// is cut into blocks of 32, each quantized to q = round_even(x * (1 / d)) clamped to +-127,
// d = amax / 127 (float32, not rounded to f16; 1 / d taken as 0 when d is below FLT_MIN). The
// weights' codes u are unsigned (Q4: the nibble 0..15; Q5_0: 0..31; Q8_0: q + 128) and q_w = u -
// offset (Q4_0 8, Q5_0 16, Q8_0 128, Q4_1 0). For block b and group g of four elements,
//   L[b][g] = sum_{4} u * q - offset * sum_{4} q      (int32, exact: q_w . q on the group)
// and 16 float lanes, lane (b % 2) * 8 + g, accumulate in block order, starting at +0:
//   acc = fma(float(L[b][g]), d_w[b][g] * d_x[b], acc)  (d_w the block's d, one for eight groups)
//   acc = fma(m_w[b], d_x[b] * float(sum_{4} q), acc)    (then Q4_1's minimum, in the same lane)
// the scales' product rounded, then one fused multiply-add (the portable loops call std::fma,
// correctly rounded on a CPU without FMA, so every level computes the same; fused, a group's float
// work is a conversion, a product and an FMA, and prefill and batched decoding are bound by it).
// K-quants (Q4_K, Q6_K): a super-block of 256 is eight sub-blocks of 32, b counting them along the
// row, each met by x's block b exactly as above. Q4_K: u the nibble, offset 0, d_w[b][g] =
// d * float(scale_b), m_w[b] = -(dmin * float(min_b)) (its 6-bit scale and minimum). Q6_K: u =
// q + 32 (0..63), offset 32, d_w[b][g] = d * float(scale_{2b + g / 4}) (an 8-bit scale per 16
// elements), no minimum. A half times an integer of at most 8 bits has at most 19 significant bits:
// exact in float32, so the scales add no rounding, and per 32 elements the K-quants do the float
// operations of Q4_1 (Q4_K) and Q4_0 (Q6_K): per group one conversion, a product and an FMA (the
// minimum one FMA more). That is the fewest with x in blocks of 32: x's d_x changes every block,
// so the integer sums cannot run on across sub-blocks as llama.cpp's do over a super-block of Q8_K
// activations, and the groups of four are what vpdpbusd gives per 32-bit lane (a sum per block
// would cost integer shuffles a block to save a conversion and a product per group of lanes, which
// are one vector operation for sixteen lanes).
// BF16, F16 and F32: the weights converted to float exactly, one lane accumulates fma(w[k], x[k],
// lane) for each element k in order, one rounding per element (std::fma in the portable loops, as
// above): F16's and F32's lane k % 16, BF16's lane (k % 32) / 2. BF16's neighbours share a lane so that a
// 32-bit word of two weights widens into one lane of each of two vectors by a shift and a mask,
// with no shuffle (the kernels read x in that order: ActivationRows::pairs). Then
// every format sums its lanes t = acc in one tree, t[l] += t[l + 8], t[l] += t[l + 4],
// t[l] += t[l + 2], y = t[0] + t[1], and adds y's old value last when accumulating. A block or
// element past the row's end is no term at all (adding +0 leaves a lane that started at +0
// unchanged), so padding never changes a bit.
// Each level may compute the integer sums with any instructions (VNNI's vpdpbusd, AVX2's
// vpmaddubsw, plain loops), and may take the outputs in any tiles: the sums are exact, and each
// output's float operations are its own.

namespace tapegrad::quant {

/// x's rows for a packed product: the floats (BF16, F16, F32) and, for the block formats, x quantized
/// (Note [Packed products]), each row padded with zero blocks to an even number of blocks.
struct ActivationRows {
  const float* x = nullptr;  ///< (rows, cols)
  std::size_t rows = 0, cols = 0;
  std::size_t blocks = 0;                 ///< blocks of 32 per row, rounded up to even
  const std::int8_t* q = nullptr;         ///< (rows, blocks * 32)
  /// (rows, blocks * 32): q + 128, unsigned, for kernels whose integer dot takes x as its unsigned
  /// operand and Q8_0's signed codes as they are (the same sums: Note [Packed products])
  const std::uint8_t* q_plus_128 = nullptr;
  const std::int32_t* neg_sums = nullptr;  ///< (rows, blocks * 8): -sum of each group's four q
  const float* d = nullptr;               ///< (rows, blocks * 8): the block's d, once per group
  const float* scaled_sums = nullptr;     ///< (rows, blocks * 8): d * float(sum of the group's q)
  /// For BF16: (rows, pairs_cols) floats, each block of 32 of x's row as its 16 even elements then
  /// its 16 odd ones (BF16's lanes, Note [Packed products]), zeros past cols; pairs_cols is cols
  /// rounded up to 32.
  const float* pairs = nullptr;
  std::size_t pairs_cols = 0;
};

/// The kernel of one format: y[m * ldy + n] for every row m of x and n in [first, last).
using PackedKernel = void (*)(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w,
                              std::size_t first, std::size_t last, bool accumulate);

/// The weight rows a product walks at a time (the block formats' in packed_matmuls, BF16's and
/// F16's in their kernels): they stay in L2 while every row of x passes.
constexpr std::size_t panel_bytes = 128 << 10;
/// The weight rows of row_bytes in a panel: a multiple of 16, so that every tile of rows is whole
/// (the one-row tiles left at the end of a panel of 42 took a sixth of a tile's time for a quarter
/// of its outputs).
constexpr std::size_t panel_rows(std::size_t row_bytes) {
  return std::max<std::size_t>(16, panel_bytes / row_bytes / 16 * 16);
}

/// Quantizes one row of x (cols floats) into `blocks` blocks (Note [Packed products]; those past
/// cols are zeros, a partial last block reads zeros past cols): q (blocks * 32), and per group of
/// four neg_sums, d and scaled_sums (blocks * 8 each). A block holding an infinity or a NaN gets
/// d = NaN and q = 0, so that its outputs are NaN.
using RowQuantizer = void (*)(const float* x, std::size_t cols, std::size_t blocks, std::int8_t* q,
                              std::int32_t* neg_sums, float* d, float* scaled_sums);

/// One SIMD level's packed kernels.
struct PackedKernelTable {
  PackedKernel q4_0 = nullptr, q4_1 = nullptr, q5_0 = nullptr, q8_0 = nullptr, q4_k = nullptr, q6_k = nullptr;
  PackedKernel bf16 = nullptr, f16 = nullptr, f32 = nullptr;
  RowQuantizer quantize_row = nullptr;
  const char* integer_dot = "";  ///< how the level forms the integer sums ("avx512vnni", ...)
};

/// Quantizes x's rows into blocks (Note [Packed products]); `storage` keeps the arrays.
struct QuantizedActivations {
  ActivationRows rows;
  std::unique_ptr<std::byte[]> storage;
  std::size_t capacity = 0;
  AlignedVector<float> pairs;
};
void quantize_activations(const float* x, std::size_t rows, std::size_t cols, QuantizedActivations& out);
/// Fills out.rows.pairs (BF16's order of x) from out.rows.x.
void pair_activations(QuantizedActivations& out);

/// The table packed_matmul runs: the first of the level in use's packed_tables().
const PackedKernelTable& active_packed_table();

/// Every table of the level in use that this CPU runs (each level's packed_tables()).
std::span<const PackedKernelTable> level_packed_tables();

}  // namespace tapegrad::quant

// Each level's tables this CPU runs, the fastest first: AVX-512 with VNNI, then AVX-VNNI's and
// vpmaddubsw's at the levels with AVX2; the tests run every one.
namespace tapegrad::kernels {
namespace sse2 { std::span<const quant::PackedKernelTable> packed_tables(); }
namespace avx2 { std::span<const quant::PackedKernelTable> packed_tables(); }
namespace avx512 { std::span<const quant::PackedKernelTable> packed_tables(); }
namespace emulated16 { std::span<const quant::PackedKernelTable> packed_tables(); }  // in builds with the tests
}  // namespace tapegrad::kernels
