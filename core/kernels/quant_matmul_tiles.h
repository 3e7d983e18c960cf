// Private to the packed kernels (core/kernels/quant_matmul*.cpp, compiled per level): what their
// files share: the walk over groups of 16 outputs in tiles of x's rows,
// storing a group's outputs, and the pieces each file contributes to the level's tables.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/kernels/level.h"
#include "core/quant/little_endian.h"
#include "core/quant/packed_kernels.h"
#include "core/quant/row_groups.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

using quant::group_rows;

using quant::load_u16;
using quant::load_u32;

using detail::half_to_float;

// Stores group g's outputs that lie in [first, last) (t, one float a lane) at y + its first
// output, adding y's old values when accumulating. With `stream`, a whole group written fresh to a
// line of y goes past the caches at AVX-512 (a non-temporal store; the caller fences): a store
// that misses would first read its line, and at 16 rows these reads, one a row and group, held
// the weights' stream back (16 rows of an F32 matrix: 1.2x as fast streamed, Xeon 167).
inline void store_group(float* y, const float t[16], std::size_t g, std::size_t first, std::size_t last,
                        bool accumulate, [[maybe_unused]] bool stream = false) {
  const std::size_t lo = std::max(first, g * group_rows) - g * group_rows;
  const std::size_t hi = std::min(last, (g + 1) * group_rows) - g * group_rows;
  if (lo == 0 && hi == group_rows) {  // a whole group: a loop of known length, not a call to memmove
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
    if (stream && !accumulate && reinterpret_cast<std::uintptr_t>(y) % 64 == 0)
      return _mm512_stream_ps(y, _mm512_loadu_ps(t));
#endif
    for (std::size_t l = 0; l < group_rows; ++l) y[l] = accumulate ? y[l] + t[l] : t[l];
    return;
  }
  for (std::size_t l = lo; l < hi; ++l) y[l] = accumulate ? y[l] + t[l] : t[l];
}

// Orders the streamed stores (store_group) before anything after them reads y.
inline void end_streamed_stores() {
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
  _mm_sfence();
#endif
}

// The float sums of a tile of NG groups by MR rows of x, a group's 16 lanes in `count` batches of
// B, from zero; store writes them as store_group does.
template <class B, int NG, int MR, std::size_t count>
struct TileSums {
  B lanes[NG][MR][count];
  TileSums() {
    for (auto& group : lanes)
      for (auto& row : group)
        for (B& batch : row) batch = B(0.0f);
  }
  // Group g + j's outputs for row m0 + i at y + (m0 + i) * ldy + (g + j) * 16; `stream` as store_group.
  void store(float* y, std::size_t ldy, std::size_t g, std::size_t m0, std::size_t first, std::size_t last,
             bool accumulate, bool stream = false) const {
    alignas(64) float out[group_rows];
    for (int j = 0; j < NG; ++j)
      for (int i = 0; i < MR; ++i) {
        for (std::size_t b = 0; b < count; ++b) lanes[j][i][b].store_aligned(out + b * B::size);
        store_group(y + (m0 + i) * ldy + (g + j) * group_rows, out, g + j, first, last, accumulate, stream);
      }
  }
};

// Runs tile.template operator()<NG, MR>(g, m0) over the groups of 16 outputs that meet [first,
// last), NG at a time (the last few one at a time), and x's rows in tiles of MR (the last few in
// one tile of fewer): groups g .. g + NG - 1 by rows m0 .. m0 + MR - 1. Each output's operations
// are its own whatever tile it falls in, so the tiling never changes a bit. The groups' weights
// stay in L1 or L2 while every tile of x's rows passes.
template <int NG, int MR, class Tile>
void run_rows(const Tile& tile, std::size_t M, std::size_t g, std::size_t m0) {
  for (; m0 + MR <= M; m0 += MR) tile.template operator()<NG, MR>(g, m0);
  if constexpr (MR > 1)
    if (m0 < M) run_rows<NG, MR - 1>(tile, M, g, m0);
}
template <int NG, int MR, class Tile>
void run_groups(const Tile& tile, std::size_t M, std::size_t first, std::size_t last) {
  const std::size_t end = (last + group_rows - 1) / group_rows;
  std::size_t g = first / group_rows;
  for (; g + NG <= end; g += NG) run_rows<NG, MR>(tile, M, g, 0);
  if constexpr (NG > 1)
    for (; g < end; ++g) run_rows<1, MR>(tile, M, g, 0);
}

// A tile asks for the next groups' weights ahead of its work (into L2) only when x has at least
// this many rows: with fewer, a group's arithmetic is too short to cover the requests, and the
// hardware's prefetchers alone stream the weights faster. SmolLM2 on a Zen 4, one thread,
// tokens/s without the requests below 8 rows against with them: Q8_0 one row 196 / 131, four
// 464-486 / 428; F32 four 171 / 155; at 16 rows the requests win (Q8_0 603 / 501).
constexpr std::size_t rows_to_prefetch = 8;

// How a table forms the integer sums of the block formats.
enum class IntegerDot { portable, avx2_maddubs, avx_vnni, avx512_vnni };

// The pieces of a table, one file each: the float formats' kernels (quant_matmul_float.cpp), BF16's
// kernel and pairing of x (quant_matmul_bf16.cpp; with VDPBF16PS when `instruction`, at the AVX-512
// level only) and the activation quantizer (quant_matmul_activations.cpp).
void set_float_kernels(quant::PackedKernelTable& table);
void set_bf16_kernels(quant::PackedKernelTable& table, bool instruction);
quant::RowQuantizer activation_quantizer();

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
