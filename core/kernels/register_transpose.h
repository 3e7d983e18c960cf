// Private to core/kernels/: square blocks of 32-bit elements transposed in registers, for packing
// a transposed operand (packed_gemm's panels of B^T, the AMX path's tiles, the packed float
// kernels' runs of x). Declared in this level's namespace: each level's files compile them with
// their own instructions.
#pragma once

#include <immintrin.h>

#include <cstddef>

#include "core/kernels/level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
/// rows[i] becomes column i of the 16 x 16 block the rows held (element j of the new rows[i] is
/// element i of the old rows[j]): pairs of elements, pairs of pairs, then 128-bit lanes.
inline void transpose_16x16(__m512i rows[16]) {
  __m512i pairs[16];
  for (std::size_t i = 0; i < 16; i += 2) {  // 128-bit lane L: elements 4L.. of rows i and i + 1, interleaved
    pairs[i] = _mm512_unpacklo_epi32(rows[i], rows[i + 1]);
    pairs[i + 1] = _mm512_unpackhi_epi32(rows[i], rows[i + 1]);
  }
  __m512i quads[16];  // quads[g + c], lane L: column 4L + c of rows g .. g + 3
  for (std::size_t g = 0; g < 16; g += 4) {
    quads[g] = _mm512_unpacklo_epi64(pairs[g], pairs[g + 2]);
    quads[g + 1] = _mm512_unpackhi_epi64(pairs[g], pairs[g + 2]);
    quads[g + 2] = _mm512_unpacklo_epi64(pairs[g + 1], pairs[g + 3]);
    quads[g + 3] = _mm512_unpackhi_epi64(pairs[g + 1], pairs[g + 3]);
  }
  for (std::size_t c = 0; c < 4; ++c) {  // column 4L + c: lane L of quads[c], [4 + c], [8 + c], [12 + c]
    const __m512i low01 = _mm512_shuffle_i32x4(quads[c], quads[4 + c], 0x44);
    const __m512i low23 = _mm512_shuffle_i32x4(quads[c], quads[4 + c], 0xEE);
    const __m512i high01 = _mm512_shuffle_i32x4(quads[8 + c], quads[12 + c], 0x44);
    const __m512i high23 = _mm512_shuffle_i32x4(quads[8 + c], quads[12 + c], 0xEE);
    rows[c] = _mm512_shuffle_i32x4(low01, high01, 0x88);
    rows[4 + c] = _mm512_shuffle_i32x4(low01, high01, 0xDD);
    rows[8 + c] = _mm512_shuffle_i32x4(low23, high23, 0x88);
    rows[12 + c] = _mm512_shuffle_i32x4(low23, high23, 0xDD);
  }
}
#elif defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
/// transpose_16x16's 8 x 8 block of floats: pairs, pairs of pairs, then 128-bit lanes.
inline void transpose_8x8(__m256 rows[8]) {
  __m256 pairs[8];
  for (std::size_t i = 0; i < 8; i += 2) {
    pairs[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
    pairs[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
  }
  __m256 quads[8];  // quads[g + c], lane L: column 4L + c of rows g .. g + 3
  for (std::size_t g = 0; g < 8; g += 4) {
    quads[g] = _mm256_shuffle_ps(pairs[g], pairs[g + 2], 0x44);
    quads[g + 1] = _mm256_shuffle_ps(pairs[g], pairs[g + 2], 0xEE);
    quads[g + 2] = _mm256_shuffle_ps(pairs[g + 1], pairs[g + 3], 0x44);
    quads[g + 3] = _mm256_shuffle_ps(pairs[g + 1], pairs[g + 3], 0xEE);
  }
  for (std::size_t c = 0; c < 4; ++c) {
    rows[c] = _mm256_permute2f128_ps(quads[c], quads[4 + c], 0x20);
    rows[4 + c] = _mm256_permute2f128_ps(quads[c], quads[4 + c], 0x31);
  }
}
#endif

/// W x W blocks of floats transposed in registers (W = transpose_block: 16 at AVX-512, 8 at AVX2,
/// 4 at SSE2; 0 at emulated16, whose callers go element by element): dst[c * ldd + r] = src[r *
/// lds + c]. Element by element, packing the head's weight for its logits took as long as the
/// product, and x's runs for 16-row decoding 2.5-3% of a step.
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
constexpr std::size_t transpose_block = 16;
inline void transpose_floats(const float* src, std::size_t lds, float* dst, std::size_t ldd) {
  __m512i rows[16];
  for (std::size_t i = 0; i < 16; ++i) rows[i] = _mm512_castps_si512(_mm512_loadu_ps(src + i * lds));
  transpose_16x16(rows);
  for (std::size_t i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ldd, _mm512_castsi512_ps(rows[i]));
}
#elif defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
constexpr std::size_t transpose_block = 8;
inline void transpose_floats(const float* src, std::size_t lds, float* dst, std::size_t ldd) {
  __m256 rows[8];
  for (std::size_t i = 0; i < 8; ++i) rows[i] = _mm256_loadu_ps(src + i * lds);
  transpose_8x8(rows);
  for (std::size_t i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * ldd, rows[i]);
}
#elif defined(__SSE2__) && !defined(TAPEGRAD_EMULATED_BATCH)
constexpr std::size_t transpose_block = 4;
inline void transpose_floats(const float* src, std::size_t lds, float* dst, std::size_t ldd) {
  __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + lds), r2 = _mm_loadu_ps(src + 2 * lds),
         r3 = _mm_loadu_ps(src + 3 * lds);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(dst, r0), _mm_storeu_ps(dst + ldd, r1);
  _mm_storeu_ps(dst + 2 * ldd, r2), _mm_storeu_ps(dst + 3 * ldd, r3);
}
#else
constexpr std::size_t transpose_block = 0;
inline void transpose_floats(const float*, std::size_t, float*, std::size_t) {}
#endif

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
