// Private to the packed kernels (core/kernels/quant_matmul*.cpp, compiled per level): what their
// files share: reading a block's halves, the lanes' tree sum of Note [Packed products], the tile
// runner, and the pieces each file contributes to the level's tables.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/kernels/level.h"
#include "core/quant/packed_kernels.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

inline std::uint16_t load_u16(const std::byte* p) { return std::uint16_t(unsigned(p[0]) | (unsigned(p[1]) << 8)); }

inline std::uint32_t load_u32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// IEEE half to float, exactly (block_format.h's f16_to_f32, without its loop): the half's
// exponent and mantissa moved into a float's and scaled by 2^112; a subnormal half becomes a
// subnormal float first, whose scaling is exact too.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16, bits = std::uint32_t(h & 0x7FFF) << 13;
  if ((h & 0x7C00) == 0x7C00) return std::bit_cast<float>(sign | 0x7F800000u | bits);  // inf, NaN
  return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(std::bit_cast<float>(bits) * 0x1p112f));
}

// How far ahead of the element it reads a tile of NR weight rows (row_bytes apart) prefetches:
// the same element two tiles of rows on. NR rows read side by side are more streams in one page
// than the hardware prefetcher follows; a fixed distance (16 blocks, 1 KB) fell inside the tile's
// own next row, since SmolLM2's rows are 576 or 1536 weights, and each tile began waiting on memory.
template <int NR> constexpr std::size_t prefetch_distance(std::size_t row_bytes) { return 2 * NR * row_bytes; }

// y = the lanes' tree sum (Note [Packed products]), plus y's old value when accumulating.
inline void store_sum(float* y, const float t[16], bool accumulate) {
  float t8[8], t4[4];
  for (int l = 0; l < 8; ++l) t8[l] = t[l] + t[l + 8];
  for (int l = 0; l < 4; ++l) t4[l] = t8[l] + t8[l + 4];
  const float sum = (t4[0] + t4[2]) + (t4[1] + t4[3]);
  *y = accumulate ? *y + sum : sum;
}

#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
// y = the tree of lanes lo (0-7) and hi (8-15), as store_sum.
inline void store_sum256(float* y, __m256 lo, __m256 hi, bool accumulate) {
  const __m256 t8 = _mm256_add_ps(lo, hi);
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));  // t4[0] + t4[2], t4[1] + t4[3]
  const float sum = _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
  *y = accumulate ? *y + sum : sum;
}
#endif

// Runs tile.template operator()<NR, MR>(m0, n) over x's rows from m0 on in tiles of MR (the last
// few in one tile of fewer) and the weight rows first .. last - 1 in tiles of NR (the last few one
// at a time). Each output has its own accumulators whatever tile it falls in, so the tiling never
// changes a bit.
template <int NR, int MR, class Tile>
void run_tiles(const Tile& tile, std::size_t rows, std::size_t m0, std::size_t first, std::size_t last) {
  for (; m0 + MR <= rows; m0 += MR) {
    std::size_t n = first;
    for (; n + NR <= last; n += NR) tile.template operator()<NR, MR>(m0, n);
    for (; n < last; ++n) tile.template operator()<1, MR>(m0, n);
  }
  if constexpr (MR > 1)
    if (m0 < rows) run_tiles<NR, MR - 1>(tile, rows, m0, first, last);
}

// The integer kernels' tiles (block formats and K-quants alike), given tile.operator()<NR, MR>(m0, n):
// one row of x runs 2 x 1 everywhere (two weight rows share its loads; four ran up to 18% slower
// with the weights streaming from L3, docs/quantization.md); more rows 2 x 2 in AVX2's 16 registers
// and 2 x 8 in AVX-512's 32 (16 accumulators: each pair of blocks decoded once for 8 rows of x;
// 4 x 4 and, with two accumulators an output for a minimum, 2 x 4 were up to 1.25x slower).
template <class Tile>
void run_integer_tiles_avx2(const Tile& tile, std::size_t rows, std::size_t first, std::size_t last) {
  if (rows == 1) return run_tiles<2, 1>(tile, rows, 0, first, last);
  run_tiles<2, 2>(tile, rows, 0, first, last);
}
template <class Tile>
void run_integer_tiles_avx512(const Tile& tile, std::size_t rows, std::size_t first, std::size_t last) {
  if (rows == 1) return run_tiles<2, 1>(tile, rows, 0, first, last);
  run_tiles<2, 8>(tile, rows, 0, first, last);
}

#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
// Stores an AVX2 integer tile's outputs, each the tree sum of its lanes (store_sum256).
template <int NR, int MR>
inline void store_tile256(float* y, std::size_t ldy, std::size_t m0, std::size_t n0, const __m256 (&acc)[NR][MR][2],
                          bool accumulate) {
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) store_sum256(y + (m0 + i) * ldy + n0 + r, acc[r][i][0], acc[r][i][1], accumulate);
}
#endif

#if defined(__AVX512F__)
// The tree sums of four outputs' lanes a, b, c and d (store_sum's pairs, t8, t4, t2 and y), side
// by side: each step's shuffles put the lanes it adds in the same places of two vectors, so four
// outputs take 9 shuffles and 5 additions instead of 16 of each.
inline __m128 tree_sums4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // t8, the low 8 lanes plus the high 8: [a's | b's], [c's | d's].
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // t4 = t8[0:4] + t8[4:8]: a, b, c and d in the four 128-bit lanes.
  const __m512 t4 = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  // t2 = (t4[0] + t4[2], t4[1] + t4[3]), then y = t2[0] + t2[1] in each 128-bit lane's first float.
  const __m512 t2 = _mm512_add_ps(t4, _mm512_shuffle_ps(t4, t4, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 sums = _mm512_add_ps(t2, _mm512_shuffle_ps(t2, t2, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), sums));
}

// Stores an AVX-512 tile's outputs y(m0 + i, n0 + r), each the tree sum of acc[r][i]'s lanes.
template <int NR, int MR>
[[gnu::always_inline]] inline void store_tile512(float* y, std::size_t ldy, std::size_t m0, std::size_t n0,
                                                 const __m512 (&acc)[NR][MR], bool accumulate) {
  if constexpr (NR % 4 == 0) {
    for (int i = 0; i < MR; ++i)
      for (int r = 0; r < NR; r += 4) {
        float* out = y + (m0 + i) * ldy + n0 + r;
        const __m128 sums = tree_sums4(acc[r][i], acc[r + 1][i], acc[r + 2][i], acc[r + 3][i]);
        _mm_storeu_ps(out, accumulate ? _mm_add_ps(_mm_loadu_ps(out), sums) : sums);
      }
  } else if constexpr (NR == 2 && MR % 2 == 0) {  // two outputs of each of two rows of x
    for (int i = 0; i < MR; i += 2) {
      auto* out = reinterpret_cast<__m64*>(y + (m0 + i) * ldy + n0);
      auto* next = reinterpret_cast<__m64*>(y + (m0 + i + 1) * ldy + n0);
      __m128 sums = tree_sums4(acc[0][i], acc[1][i], acc[0][i + 1], acc[1][i + 1]);
      if (accumulate) sums = _mm_add_ps(_mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), out), next), sums);
      _mm_storel_pi(out, sums), _mm_storeh_pi(next, sums);
    }
  } else {
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < MR; ++i)
        store_sum256(y + (m0 + i) * ldy + n0 + r, _mm512_castps512_ps256(acc[r][i]),
                     _mm512_extractf32x8_ps(acc[r][i], 1), accumulate);
  }
}
#endif

// How a table forms the integer sums of the block formats.
enum class IntegerDot { portable, avx2_maddubs, avx_vnni, avx512_vnni, avx512_vnni_gfni };

// The pieces of a table, one file each: the K-quants' kernels (quant_matmul_k.cpp), BF16's and
// F16's (quant_matmul_float.cpp) and the activation quantizer (quant_matmul_activations.cpp).
void set_k_quant_kernels(quant::PackedKernelTable& table, IntegerDot dot);
void set_float_kernels(quant::PackedKernelTable& table);
quant::RowQuantizer activation_quantizer();

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
