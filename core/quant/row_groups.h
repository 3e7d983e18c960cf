// Private to core/: how a PackedMatrix lays out its weights. Sixteen output rows are interleaved,
// unit by unit (a unit is a block of the format: 32 weights, a K-quant's 256, one weight of F16
// and F32, and 32 of BF16: a block of bf16_gemm's contract), so that a SIMD lane holds one
// output's weights: a kernel loads the same columns of sixteen rows at once and meets x's values
// broadcast, with no sum across lanes (Note [Packed products]). A matrix is its groups of 16 rows
// one after the other (the last padded with rows of zeros), a group its units in column order (a
// BF16 row's last unit padded with zero columns).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/quant/block_format.h"

namespace tapegrad::quant {

constexpr std::size_t group_rows = 16;

// A unit of 16 rows, byte offsets. Codes are unsigned (Note [Packed products]) and stored in
// chunks of 64 bytes, one 32-bit lane a row:
// - "nibble chunks": four chunks for 32 codes, chunk c's lane r byte t holding row r's code 4c + t
//   in its low nibble and code 16 + 4c + t in its high one;
// - "byte chunks" (Q8_0): eight, chunk j's lane r byte t holding row r's code 4j + t;
// - Q5_0's fifth bits: one chunk, lane r byte t bit j being the fifth bit of row r's code 4j + t;
// - Q6_K's high bits: two chunks, chunk a's lane r byte t bits 2c, 2c + 1 being the top two bits of
//   row r's code 4 (4a + c) + t.
// Halves (f16 bits) and scale bytes are 16 in a row, row r's at r.
// BF16: 16 words of 32 bits a row, word w of row r at 4 (16 w + r), holding two of the unit's
// columns as VDPBF16PS pairs them (Note [bf16 products]): column 4 (w / 2) + w % 2 in its high
// half (the instruction's slot 1) and that column + 2 in its low half (slot 0). Even words run the
// even columns' chain, odd words the odd columns'.
struct UnitLayout {
  std::size_t bytes = 0;
  std::size_t columns = 1;  ///< a row's weights in a unit
  std::size_t d = 0;       ///< 16 halves: the block's d (Q4_K's super-block d)
  std::size_t m = 0;       ///< 16 halves: Q4_1's minimum m, Q4_K's dmin
  std::size_t scales = 0;  ///< Q4_K: 8 x 16 scale bytes, then 8 x 16 minimum bytes; Q6_K: 16 x 16 signed scales
  std::size_t fifth = 0;   ///< Q5_0's fifth-bit chunk
  std::size_t codes = 0;   ///< the code chunks (K-quants: sub-block s's at codes + s * sub_bytes)
  std::size_t sub_bytes = 0;  ///< K-quants: a sub-block's code chunks (Q6_K: 4 nibble chunks, then 2 high-bit chunks)
  int offset = 0;  ///< subtracted from the unsigned codes: q_w = u - offset
};

constexpr UnitLayout unit_layout(TensorType type) {
  switch (type) {
    case TensorType::Q4_0: return {.bytes = 288, .columns = 32, .d = 0, .codes = 32, .offset = 8};
    case TensorType::Q4_1: return {.bytes = 320, .columns = 32, .d = 0, .m = 32, .codes = 64, .offset = 0};
    case TensorType::Q5_0: return {.bytes = 352, .columns = 32, .d = 0, .fifth = 32, .codes = 96, .offset = 16};
    case TensorType::Q8_0: return {.bytes = 544, .columns = 32, .d = 0, .codes = 32, .offset = 128};
    case TensorType::Q4_K:
      return {.bytes = 2368, .columns = 256, .d = 0, .m = 32, .scales = 64, .codes = 320, .sub_bytes = 256};
    case TensorType::Q6_K:
      return {.bytes = 3360, .columns = 256, .d = 0, .scales = 32, .codes = 288, .sub_bytes = 384, .offset = 32};
    case TensorType::F32: return {.bytes = 64};
    case TensorType::F16: return {.bytes = 32};
    case TensorType::BF16: return {.bytes = 1024, .columns = 32};
  }
  return {};
}

/// Writes the unit of 16 rows whose blocks (ggml's layout) are at rows[0..15]; a null row is a row
/// of zeros. BF16's last unit may hold `columns` < 32 of a row's weights, zeros after them.
void interleave_unit(TensorType type, const std::byte* const rows[group_rows], std::byte* unit,
                     std::size_t columns);

/// Writes `columns` weights of row r of a unit back in ggml's layout (the inverse of interleave_unit).
void deinterleave_unit(TensorType type, const std::byte* unit, std::size_t r, std::byte* block, std::size_t columns);

}  // namespace tapegrad::quant
