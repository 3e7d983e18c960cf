// This level's activation quantizer for the packed block kernels (core/quant/packed_kernels.h):
// each row of x cut into blocks of 32 and rounded to 8-bit codes with their scale and sums,
// as Note [Packed products] fixes them; AVX-512 runs the same operations sixteen lanes at a time.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/kernels/quant_matmul_tiles.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

// x rounded to the nearest integer, ties to even, for |x| < 2^22 (the default rounding mode).
float round_even(float x) {
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23: adding it leaves no fraction bits
  return x >= 0 ? (x + magic) - magic : -((-x + magic) - magic);
}

// d and 1 / d of a block whose largest magnitude is amax (Note [Packed products]).
inline void block_scale(float amax, float& d, float& inverse) {
  d = amax / 127;
  inverse = d >= std::numeric_limits<float>::min() ? 1 / d : 0;
}

// A block's sums, from its codes and d: -sum of its q, -sum of each half's, and d * float(sum).
inline void block_sums(const std::int8_t* q, float d, std::int32_t* neg_sum, std::int32_t* neg_halves, float* scaled_sum) {
  int halves[2] = {};
  for (int j = 0; j < 32; ++j) halves[j / 16] += q[j];
  neg_halves[0] = -halves[0], neg_halves[1] = -halves[1];
  *neg_sum = -(halves[0] + halves[1]);
  *scaled_sum = d * float(halves[0] + halves[1]);
}

// The reference the AVX-512 quantizer below matches bit for bit; unused at that level.
[[maybe_unused]] inline void quantize_row_portable(const float* x, std::size_t cols, std::int8_t* q, float* d,
                                                   std::int32_t* neg_sums, std::int32_t* neg_half_sums,
                                                   float* scaled_sums) {
  for (std::size_t b = 0; 32 * b < cols; ++b, q += 32) {
    float block[32] = {};  // a partial last block reads zeros past the row's end
    if (32 * b < cols) std::copy_n(x + 32 * b, std::min<std::size_t>(32, cols - 32 * b), block);
    float amax = 0;
    bool finite = true;
    for (int j = 0; j < 32; ++j) {
      const float magnitude = std::fabs(block[j]);
      finite = finite && magnitude <= std::numeric_limits<float>::max();
      amax = std::max(amax, magnitude);
    }
    float scale, inverse;
    block_scale(amax, scale, inverse);
    if (!finite) scale = std::numeric_limits<float>::quiet_NaN(), inverse = 0;
    for (int j = 0; j < 32; ++j)
      q[j] = std::int8_t(std::clamp(finite ? round_even(block[j] * inverse) : 0.0f, -127.0f, 127.0f));
    d[b] = scale;
    block_sums(q, scale, neg_sums + b, neg_half_sums + 2 * b, scaled_sums + b);
  }
}

#if defined(__AVX512F__)

// quantize_row_portable's operations sixteen lanes at a time: the same bits.
void quantize_row_avx512(const float* x, std::size_t cols, std::int8_t* q, float* d, std::int32_t* neg_sums,
                         std::int32_t* neg_half_sums, float* scaled_sums) {
  const __m512 sign = _mm512_set1_ps(-0.0f), limit = _mm512_set1_ps(127.0f);
  for (std::size_t b = 0; 32 * b < cols; ++b, q += 32) {
    const std::size_t rest = cols - 32 * b;
    const __m512 x0 =
        rest >= 16 ? _mm512_loadu_ps(x + 32 * b) : _mm512_maskz_loadu_ps(detail::lanes_below(rest), x + 32 * b);
    const __m512 x1 = rest >= 32 ? _mm512_loadu_ps(x + 32 * b + 16)
                      : rest > 16 ? _mm512_maskz_loadu_ps(detail::lanes_below(rest - 16), x + 32 * b + 16)
                                  : _mm512_setzero_ps();
    const __m512 a0 = _mm512_andnot_ps(sign, x0), a1 = _mm512_andnot_ps(sign, x1);
    const __m512 largest = _mm512_set1_ps(std::numeric_limits<float>::max());
    const bool finite =
        (_mm512_cmp_ps_mask(a0, largest, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, largest, _CMP_NLE_UQ)) == 0;
    float scale, inverse;
    block_scale(_mm512_reduce_max_ps(_mm512_max_ps(a0, a1)), scale, inverse);
    if (!finite) scale = std::numeric_limits<float>::quiet_NaN(), inverse = 0;
    auto codes = [&](__m512 v) {  // round to nearest even, clamp, to 16 bytes
      const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(inverse)),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512 clamped = _mm512_min_ps(_mm512_max_ps(r, _mm512_sub_ps(_mm512_setzero_ps(), limit)), limit);
      return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(clamped));
    };
    const __m256i block = finite ? _mm256_set_m128i(codes(x1), codes(x0)) : _mm256_setzero_si256();
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), block);
    // each half's sum: four groups' sums of four codes, then the groups added in a tree
    const __m256i groups = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), block), _mm256_set1_epi16(1));
    const __m128i pairs = _mm_hadd_epi32(_mm256_castsi256_si128(groups), _mm256_extracti128_si256(groups, 1));
    const __m128i halves = _mm_hadd_epi32(pairs, pairs);  // half 0, half 1, half 0, half 1
    const int h0 = _mm_cvtsi128_si32(halves), h1 = _mm_extract_epi32(halves, 1);
    d[b] = scale;
    neg_half_sums[2 * b] = -h0, neg_half_sums[2 * b + 1] = -h1;
    neg_sums[b] = -(h0 + h1);
    scaled_sums[b] = scale * float(h0 + h1);
  }
}

#endif

}  // namespace

quant::RowQuantizer activation_quantizer() {
#if defined(__AVX512F__)
  return quantize_row_avx512;
#else
  return quantize_row_portable;
#endif
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
