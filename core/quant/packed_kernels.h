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
// bits never depend on M, on the rows beside it, on the thread count or on the SIMD level. The
// weights are interleaved sixteen rows at a time (core/quant/row_groups.h), so that one SIMD lane
// is one output and runs that sequence alone: x's values are broadcast to the lanes, and no sum
// ever crosses lanes.
//
// Block formats (Q4_0, Q4_1, Q5_0, Q8_0; as llama.cpp's vec_dot with Q8_0/Q8_1 activations): x's row
// is cut into blocks of 32, each quantized to q = round_even(x * (1 / d)) clamped to +-127,
// d = amax / 127 (float32, not rounded to f16; 1 / d taken as 0 when d is below FLT_MIN). The
// weights' codes u are unsigned (Q4: the nibble 0..15; Q5_0: 0..31; Q8_0: q + 128) and q_w = u -
// offset (Q4_0 8, Q5_0 16, Q8_0 128, Q4_1 0). For each block b in order, an accumulator that starts
// at +0 takes
//   L[b] = sum_{32} u * q - offset * sum_{32} q           (int32, exact: q_w . q on the block)
//   acc = fma(float(L[b]), d_w[b] * d_x[b], acc)           (d_w the block's d)
//   acc = fma(m_w[b], d_x[b] * float(sum_{32} q), acc)    (then Q4_1's minimum)
// the scales' product rounded, then one fused multiply-add (the portable loops call std::fma,
// correctly rounded on a CPU without FMA, so every level computes the same).
// K-quants (Q4_K, Q6_K): a super-block of 256 is eight sub-blocks of 32, b counting them along the
// row, each met by x's block b as above. Q4_K: u the nibble, offset 0, d_w[b] = d * float(scale_b),
// m_w[b] = -(dmin * float(min_b)) (its 6-bit scale and minimum). Q6_K: u = q + 32 (0..63), offset
// 32, and each half h of the sub-block (16 elements) has its own 8-bit scale: L[b][h] is the sum
// over the half (offset times the half's sum of q), and acc = fma(float(L[b][h]), d_w[b][h] *
// d_x[b], acc) for h = 0 then 1, d_w[b][h] = d * float(scale_{2b + h}). A half times an integer of
// at most 8 bits has at most 19 significant bits: exact in float32, so the scales add no rounding.
// F16 and F32: the weights converted to float exactly, acc = fma(w[k], x[k], acc) for each
// element k in order, one rounding per element (std::fma in the portable loops, as above).
// BF16: bf16_gemm's contract (Note [bf16 products], core/kernels/matmul_bf16.cpp) with x's values
// rounded to bf16 as its operands are: per block of 32 k from k = 0 (x and the weights padded with
// zeros), a chain over the even k and one over the odd k from +0, acc = acc + (E + O), every
// result and operand below 2^-126 flushed to a zero of its sign; as llama.cpp computes BF16
// weights, and at the rate of VDPBF16PS where the CPU has it (twice the FMA's on a Zen 4).
// Then y = acc, or y's old value + acc when accumulating. A row past the matrix's end is zeros in
// its group and its outputs are never stored.
// Each level may compute the integer sums with any instructions (VNNI's vpdpbusd, AVX2's
// vpmaddubsw, plain loops): they are exact. A block's float work is a conversion, a product and an
// FMA for sixteen outputs of one row of x, so the integer dot products, not the float work, bound
// prefill and batched decoding.

namespace tapegrad::quant {

/// x's rows for a packed product: the floats (F16, F32), for BF16 their bf16 pairs, and for the
/// block formats x quantized (Note [Packed products]) in blocks of 32, a partial last block padded
/// with zeros.
struct ActivationRows {
  const float* x = nullptr;  ///< (rows, cols)
  std::size_t rows = 0, cols = 0;
  const std::uint32_t* bf16_pairs = nullptr;  ///< (rows, bf16_words): x rounded, as the table's pair_row writes it
  std::size_t bf16_words = 0;                 ///< a row's words: bf16_block_words a block of 32
  std::size_t blocks = 0;                      ///< blocks of 32 per row
  const std::int8_t* q = nullptr;              ///< (rows, blocks * 32)
  const float* d = nullptr;                    ///< (rows, blocks): the block's d
  const std::int32_t* neg_sums = nullptr;      ///< (rows, blocks): -sum of the block's q
  const std::int32_t* neg_half_sums = nullptr; ///< (rows, blocks * 2): -sum of each half's 16 q (Q6_K)
  const float* scaled_sums = nullptr;          ///< (rows, blocks): d * float(sum of the block's q)
};

/// The kernel of one format: y[m * ldy + n] for every row m of x and n in [first, last).
using PackedKernel = void (*)(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w,
                              std::size_t first, std::size_t last, bool accumulate);

/// Quantizes one row of x (cols floats) into blocks = ceil(cols / 32) blocks (Note [Packed
/// products]; a partial last block reads zeros past cols): q (blocks * 32), and per block d,
/// neg_sums, neg_half_sums (two) and scaled_sums. A block holding an infinity or a NaN gets d = NaN
/// and q = 0, so that its outputs are NaN.
using RowQuantizer = void (*)(const float* x, std::size_t cols, std::int8_t* q, float* d, std::int32_t* neg_sums,
                              std::int32_t* neg_half_sums, float* scaled_sums);

/// Rounds one row of x (cols floats) to bf16 operands (Note [Packed products]) in the order a
/// BF16 unit pairs its columns (row_groups.h), zeros past cols: for VDPBF16PS, 16 words a block of
/// 32, each two operands as the unit's word; for the FMA chains, 32, each word's two operands'
/// float bits one after the other (slot 1's first), for broadcasts straight from memory.
using RowPairer = void (*)(const float* x, std::size_t cols, std::uint32_t* words);

/// One SIMD level's packed kernels.
struct PackedKernelTable {
  PackedKernel q4_0 = nullptr, q4_1 = nullptr, q5_0 = nullptr, q8_0 = nullptr, q4_k = nullptr, q6_k = nullptr;
  PackedKernel bf16 = nullptr, f16 = nullptr, f32 = nullptr;
  RowQuantizer quantize_row = nullptr;
  RowPairer pair_row = nullptr;
  std::size_t bf16_block_words = 16;  ///< what pair_row writes a block of 32: 16 or 32
  const char* integer_dot = "";  ///< how the level forms the integer sums ("avx512vnni", ...)
  const char* bf16_dot = "";     ///< how its BF16 kernel forms the chains ("vdpbf16ps", "fma")
};

/// Quantizes x's rows into blocks (Note [Packed products]); `storage` keeps the arrays.
struct QuantizedActivations {
  ActivationRows rows;
  std::unique_ptr<std::byte[]> storage;
  std::size_t capacity = 0;
  AlignedVector<std::uint32_t> pairs;  ///< the bf16 pairs
};
void quantize_activations(const float* x, std::size_t rows, std::size_t cols, QuantizedActivations& out);
/// Rounds and pairs x's rows for BF16 (into out.pairs and out.rows.bf16_pairs) with `table`'s pair_row.
void pair_activations(const PackedKernelTable& table, const float* x, std::size_t rows, std::size_t cols,
                      QuantizedActivations& out);

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
