// This level's packed kernels for the K-quants Q4_K and Q6_K (core/quant/packed_kernels.h): each
// super-block of 256 weights is eight sub-blocks of 32 met by x's 8-bit blocks, its scales folded
// into each group's d_w (exact: Note [Packed products]), in register tiles of weight rows by
// activation rows. Portable loops at SSE2 and emulated16; AVX2 a sub-block at a time with AVX-VNNI
// or vpmaddubsw; AVX-512 with VNNI a pair of sub-blocks at a time.
#include <array>
#include <cmath>

#include "core/kernels/quant_matmul_tiles.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

using quant::ActivationRows;
using quant::PackedMatrix;
using quant::TensorType;

// The layout of a super-block (core/quant/block_format.cpp): its bytes and the offset subtracted
// from the unsigned codes.
template <TensorType type> struct SuperBlocks;
template <> struct SuperBlocks<TensorType::Q4_K> {
  static constexpr std::size_t bytes = 144;
  static constexpr int offset = 0, shift = 0;
  static constexpr bool has_min = true;
};
template <> struct SuperBlocks<TensorType::Q6_K> {
  static constexpr std::size_t bytes = 210;
  static constexpr int offset = 32, shift = 5;  // offset = 1 << shift
  static constexpr bool has_min = false;
};

// A super-block's scales as floats: Q4_K's d * scale_i (0-7) and -(dmin * min_i) (8-15), Q6_K's
// d * scale_s (0-15). Each is exact (Note [Packed products]).
// Q4_K's twelve bytes of 6-bit scales and minimums as sixteen bytes: scales 0-7, minimums 0-7.
// Bytes 4-7: scales 0-3 (low 6 bits); 8-11: minimums 0-3; 12-15: the low 4 bits of scales (low
// nibble) and minimums (high nibble) 4-7, whose top 2 bits are bytes 4-11's top bits.
inline std::array<std::uint32_t, 4> q4_k_scale_words(const std::byte* block) {
  const std::uint32_t a = load_u32(block + 4), b = load_u32(block + 8), c = load_u32(block + 12);
  return {a & 0x3F3F3F3F, (c & 0x0F0F0F0F) | ((a >> 2) & 0x30303030), b & 0x3F3F3F3F,
          ((c >> 4) & 0x0F0F0F0F) | ((b >> 2) & 0x30303030)};
}

template <TensorType type> std::array<float, 16> super_scales(const std::byte* block) {
  std::array<float, 16> out;
  if constexpr (type == TensorType::Q4_K) {
    const std::array<std::uint32_t, 4> words = q4_k_scale_words(block);
    const float d = half_to_float(load_u16(block)), neg_dmin = -half_to_float(load_u16(block + 2));
    for (int i = 0; i < 16; ++i) out[i] = (i < 8 ? d : neg_dmin) * float((words[i / 4] >> (8 * (i % 4))) & 0xFF);
  } else {
    const float d = half_to_float(load_u16(block + 208));
    for (int s = 0; s < 16; ++s) out[s] = d * float(std::int8_t(block[192 + s]));
  }
  return out;
}

// Sub-block i's 32 unsigned codes, in element order.
template <TensorType type> void sub_block_codes(const std::byte* block, int i, std::uint8_t u[32]) {
  if constexpr (type == TensorType::Q4_K) {
    // sub-blocks 2k and 2k + 1: the low and high nibbles of bytes 16 + 32k ..
    for (int l = 0; l < 32; ++l) u[l] = std::uint8_t((unsigned(block[16 + 32 * (i / 2) + l]) >> (4 * (i % 2))) & 0xF);
  } else {
    // sub-block 4h + j: the low 4 bits from ql[64h + 32 (j % 2) ..] >> 4 (j / 2), the top 2 from
    // qh[32h ..] >> 2j
    const int half = i / 4, j = i % 4;
    for (int l = 0; l < 32; ++l) {
      const unsigned low = (unsigned(block[64 * half + 32 * (j % 2) + l]) >> (4 * (j / 2))) & 0xF;
      const unsigned high = (unsigned(block[128 + 32 * half + l]) >> (2 * j)) & 0x3;
      u[l] = std::uint8_t(low | (high << 4));
    }
  }
}

// ---- portable: the definition, in plain loops --------------------------------------------------

template <TensorType type>
void k_rows_portable(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                     std::size_t last, bool accumulate) {
  using S = SuperBlocks<type>;
  for (std::size_t n = first; n < last; ++n)
    for (std::size_t m = 0; m < x.rows; ++m) {
      float acc[16] = {};
      for (std::size_t s = 0; s < w.cols / 256; ++s) {
        const std::byte* block = w.row(n) + s * S::bytes;
        const std::array<float, 16> scales = super_scales<type>(block);
        for (int i = 0; i < 8; ++i) {
          const std::size_t b = 8 * s + i, at = m * x.blocks + b;
          std::uint8_t u[32];
          sub_block_codes<type>(block, i, u);
          for (std::size_t g = 0; g < 8; ++g) {
            std::int32_t sum = S::offset * x.neg_sums[8 * at + g];
            for (std::size_t j = 4 * g; j < 4 * g + 4; ++j) sum += std::int32_t(u[j]) * x.q[32 * at + j];
            const float d_w = type == TensorType::Q4_K ? scales[i] : scales[2 * i + g / 4];
            float& lane = acc[(b % 2) * 8 + g];
            lane = std::fma(float(sum), d_w * x.d[8 * at + g], lane);
            if constexpr (S::has_min) lane = std::fma(scales[8 + i], x.scaled_sums[8 * at + g], lane);
          }
        }
      }
      store_sum(y + m * ldy + n, acc, accumulate);
    }
}

#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)

// ---- AVX2: register tiles, a sub-block at a time ----------------------------------------------

// super_scales in two registers (lanes 0-7, 8-15), the same products.
template <TensorType type> [[gnu::target("f16c")]] inline void super_scales256(const std::byte* block, __m256& lo, __m256& hi) {
  if constexpr (type == TensorType::Q4_K) {
    const std::array<std::uint32_t, 4> words = q4_k_scale_words(block);
    const __m128i bytes = _mm_set_epi32(int(words[3]), int(words[2]), int(words[1]), int(words[0]));
    const __m128 halves = _mm_cvtph_ps(_mm_cvtsi32_si128(int(load_u32(block))));  // d, dmin
    lo = _mm256_mul_ps(_mm256_set1_ps(_mm_cvtss_f32(halves)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)));
    const __m256 neg_dmin = _mm256_set1_ps(-_mm_cvtss_f32(_mm_movehdup_ps(halves)));
    hi = _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))));
  } else {
    const __m256 d = _mm256_set1_ps(half_to_float(load_u16(block + 208)));
    const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192));
    lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scales)));
    hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(scales, 8))));
  }
}

// Sub-block i's codes (sub_block_codes) in a register.
template <TensorType type> __m256i codes256(const std::byte* block, int i) {
  const __m256i low4 = _mm256_set1_epi8(0xF);
  if constexpr (type == TensorType::Q4_K) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 + 32 * (i / 2)));
    return _mm256_and_si256(_mm256_srl_epi16(packed, _mm_cvtsi32_si128(4 * (i % 2))), low4);
  } else {
    const int half = i / 4, j = i % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half + 32 * (j % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half));
    const __m256i low = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (j / 2))), low4);
    const __m256i high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(0x3));
    return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
  }
}

// The eight group sums L[b][g] of a sub-block: codes below 64, so vpmaddubsw's pairs stay below
// 2 * 63 * 127 and never saturate.
template <TensorType type, bool vnni>
[[gnu::target("avxvnni")]] inline __m256i group_sums256(__m256i codes, __m256i xq, const std::int32_t* neg_sums) {
  using S = SuperBlocks<type>;
  __m256i bias = _mm256_setzero_si256();
  if constexpr (S::offset != 0)
    bias = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(neg_sums)), S::shift);
  if constexpr (vnni) return _mm256_dpbusd_avx_epi32(bias, codes, xq);
  const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xq), _mm256_set1_epi16(1));
  return S::offset == 0 ? sums : _mm256_add_epi32(sums, bias);
}

// Outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1): weight row n0 at `row`, the next ones `stride` on.
template <TensorType type, bool vnni, int NR, int MR>
[[gnu::target("avxvnni,f16c")]] void k_tile_avx2(float* y, std::size_t ldy, const ActivationRows& x, std::size_t m0,
                                            const std::byte* row, std::size_t stride, std::size_t supers,
                                            std::size_t n0, bool accumulate) {
  using S = SuperBlocks<type>;
  __m256 acc[NR][MR][2];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) acc[r][i][0] = acc[r][i][1] = _mm256_setzero_ps();
  for (std::size_t s = 0; s < supers; ++s) {
    const std::byte* blocks[NR];
    __m256 scales_lo[NR], scales_hi[NR];
    for (int r = 0; r < NR; ++r) {
      blocks[r] = row + r * stride + s * S::bytes;
      for (std::size_t line = 0; line < S::bytes; line += 64)  // two super-blocks ahead
        _mm_prefetch(reinterpret_cast<const char*>(blocks[r] + 2 * S::bytes + line), _MM_HINT_T0);
      super_scales256<type>(blocks[r], scales_lo[r], scales_hi[r]);
    }
    for (int sub = 0; sub < 8; ++sub) {
      const int parity = sub % 2;  // 256 is even: the sub-block's parity along the row
      // Q4_K: lane sub of the scales, of the minimums; Q6_K: lanes 2 sub and 2 sub + 1 of the 16
      const int k = 2 * (sub % 4);
      const __m256i lanes = type == TensorType::Q4_K ? _mm256_set1_epi32(sub)
                                                     : _mm256_set_epi32(k + 1, k + 1, k + 1, k + 1, k, k, k, k);
      __m256i codes[NR];
      __m256 d_w[NR], min[NR];
      for (int r = 0; r < NR; ++r) {
        codes[r] = codes256<type>(blocks[r], sub);
        if constexpr (type == TensorType::Q4_K) {
          d_w[r] = _mm256_permutevar8x32_ps(scales_lo[r], lanes);
          min[r] = _mm256_permutevar8x32_ps(scales_hi[r], lanes);
        } else {
          d_w[r] = _mm256_permutevar8x32_ps(sub < 4 ? scales_lo[r] : scales_hi[r], lanes);
        }
      }
      for (int i = 0; i < MR; ++i) {
        const std::size_t at = (m0 + i) * x.blocks + 8 * s + sub;
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 32 * at));
        const __m256 dx = _mm256_loadu_ps(x.d + 8 * at);
        for (int r = 0; r < NR; ++r) {
          const __m256 sums = _mm256_cvtepi32_ps(group_sums256<type, vnni>(codes[r], xq, x.neg_sums + 8 * at));
          acc[r][i][parity] = _mm256_fmadd_ps(sums, _mm256_mul_ps(d_w[r], dx), acc[r][i][parity]);
          if constexpr (S::has_min)
            acc[r][i][parity] = _mm256_fmadd_ps(min[r], _mm256_loadu_ps(x.scaled_sums + 8 * at), acc[r][i][parity]);
        }
      }
    }
  }
  store_tile256(y, ldy, m0, n0, acc, accumulate);
}

template <TensorType type, bool vnni>
void k_rows_avx2(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                 std::size_t last, bool accumulate) {
  const std::size_t stride = w.row_bytes(), supers = w.cols / 256;
  auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
    k_tile_avx2<type, vnni, NR, MR>(y, ldy, x, m0, w.bytes.data() + n * stride, stride, supers, n, accumulate);
  };
  run_integer_tiles_avx2(tile, x.rows, first, last);
}

#endif

#if defined(__AVX512F__)

// ---- AVX-512 with VNNI: tiles of NR weight rows by MR activation rows, two sub-blocks a step ---

// Sub-blocks 2p and 2p + 1 of a super-block as 64 unsigned bytes in the order of x's pair.
template <TensorType type> __m512i codes512(const std::byte* block, int p) {
  const __m512i low4 = _mm512_set1_epi8(0xF);
  if constexpr (type == TensorType::Q4_K) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 + 32 * p));
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(packed), packed, 1);
    return _mm512_and_si512(_mm512_srlv_epi64(both, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)), low4);
  } else {
    // pair p is half p / 2's sub-blocks 2 (p % 2) and 2 (p % 2) + 1: ql's 64 bytes of the half
    // shifted by 4 (p % 2), qh's 32 twice, shifted by 4 (p % 2) and 4 (p % 2) + 2
    const int half = p / 2, upper = p % 2;
    const __m512i ql = _mm512_loadu_si512(block + 64 * half);
    const __m256i qh256 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half));
    const __m512i qh = _mm512_inserti64x4(_mm512_castsi256_si512(qh256), qh256, 1);
    const long long s = 4 * upper;
    const __m512i low = _mm512_and_si512(_mm512_srl_epi64(ql, _mm_cvtsi64_si128(s)), low4);
    const __m512i high = _mm512_and_si512(_mm512_srlv_epi64(qh, _mm512_set_epi64(s + 2, s + 2, s + 2, s + 2, s, s, s, s)),
                                          _mm512_set1_epi8(0x3));
    return _mm512_or_si512(low, _mm512_slli_epi16(high, 4));
  }
}

// super_scales in one register, the same products.
template <TensorType type> inline __m512 super_scales512(const std::byte* block) {
  if constexpr (type == TensorType::Q4_K) {
    const std::array<std::uint32_t, 4> words = q4_k_scale_words(block);
    const __m512 ints = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_set_epi32(int(words[3]), int(words[2]), int(words[1]), int(words[0]))));
    const __m512 halves = _mm512_cvtph_ps(_mm256_castsi128_si256(_mm_cvtsi32_si128(int(load_u32(block)))));  // d, dmin
    const __m512 factors =
        _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), halves);
    const __m512 negate = _mm512_castsi512_ps(_mm512_set_epi32(
        INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, 0, 0, 0, 0, 0, 0, 0, 0));
    return _mm512_mul_ps(_mm512_xor_ps(factors, negate), ints);  // d * scale, -dmin * min
  } else {
    const __m512 ints =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192))));
    return _mm512_mul_ps(_mm512_set1_ps(half_to_float(load_u16(block + 208))), ints);
  }
}

// One pair of sub-blocks (2p, 2p + 1 of super-block s) of the tile. scales[r]: row r's
// super_scales as 16 lanes.
template <TensorType type, int NR, int MR>
[[gnu::target("avx512vnni")]] inline void k_step(const std::byte* blocks[NR], const __m512 (&scales)[NR],
                                                 const ActivationRows& x, std::size_t m0, std::size_t b, int p,
                                                 __m512 (&acc)[NR][MR]) {
  using S = SuperBlocks<type>;
  // lanes 0-7 sub-block 2p's, 8-15 2p + 1's: Q4_K's one scale each, Q6_K's two each (groups 0-3
  // and 4-7); Q4_K's minimums at 8 + 2p and 9 + 2p
  const __m512i d_lanes = type == TensorType::Q4_K
                              ? _mm512_add_epi32(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                                 _mm512_set1_epi32(2 * p))
                              : _mm512_add_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                                 _mm512_set1_epi32(4 * p));
  __m512i codes[NR];
  __m512 d_w[NR], min[NR];
  for (int r = 0; r < NR; ++r) {
    codes[r] = codes512<type>(blocks[r], p);
    d_w[r] = _mm512_permutexvar_ps(d_lanes, scales[r]);
    if constexpr (S::has_min) min[r] = _mm512_permutexvar_ps(_mm512_add_epi32(d_lanes, _mm512_set1_epi32(8)), scales[r]);
  }
  for (int i = 0; i < MR; ++i) {
    const std::size_t at = (m0 + i) * x.blocks + b;
    const __m512i xq = _mm512_loadu_si512(x.q + 32 * at);
    const __m512 dx = _mm512_loadu_ps(x.d + 8 * at);
    __m512i bias = _mm512_setzero_si512();
    if constexpr (S::offset != 0) bias = _mm512_slli_epi32(_mm512_loadu_si512(x.neg_sums + 8 * at), S::shift);
    for (int r = 0; r < NR; ++r) {
      const __m512 sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, codes[r], xq));
      acc[r][i] = _mm512_fmadd_ps(sums, _mm512_mul_ps(d_w[r], dx), acc[r][i]);
      if constexpr (S::has_min)
        acc[r][i] = _mm512_fmadd_ps(min[r], _mm512_loadu_ps(x.scaled_sums + 8 * at), acc[r][i]);
    }
  }
}

template <TensorType type, int NR, int MR>
[[gnu::target("avx512vnni")]] void k_tile_vnni(float* y, std::size_t ldy, const ActivationRows& x, std::size_t m0,
                                               const std::byte* row, std::size_t stride, std::size_t supers,
                                               std::size_t n0, bool accumulate) {
  using S = SuperBlocks<type>;
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  for (std::size_t s = 0; s < supers; ++s) {
    const std::byte* blocks[NR];
    __m512 scales[NR];
    for (int r = 0; r < NR; ++r) {
      blocks[r] = row + r * stride + s * S::bytes;
      for (std::size_t line = 0; line < S::bytes; line += 64)  // two super-blocks ahead
        _mm_prefetch(reinterpret_cast<const char*>(blocks[r] + 2 * S::bytes + line), _MM_HINT_T0);
      scales[r] = super_scales512<type>(blocks[r]);
    }
    for (int p = 0; p < 4; ++p) k_step<type, NR, MR>(blocks, scales, x, m0, 8 * s + 2 * p, p, acc);
  }
  store_tile512(y, ldy, m0, n0, acc, accumulate);
}

template <TensorType type>
void k_rows_vnni(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                 std::size_t last, bool accumulate) {
  const std::size_t stride = w.row_bytes(), supers = w.cols / 256;
  auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
    k_tile_vnni<type, NR, MR>(y, ldy, x, m0, w.bytes.data() + n * stride, stride, supers, n, accumulate);
  };
  run_integer_tiles_avx512(tile, x.rows, first, last);
}

#endif

}  // namespace

void set_k_quant_kernels(quant::PackedKernelTable& table, IntegerDot dot) {
  switch (dot) {
#if defined(__AVX512F__)
    case IntegerDot::avx512_vnni_gfni:
    case IntegerDot::avx512_vnni:
      table.q4_k = k_rows_vnni<TensorType::Q4_K>, table.q6_k = k_rows_vnni<TensorType::Q6_K>;
      return;
#endif
#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
    case IntegerDot::avx_vnni:
      table.q4_k = k_rows_avx2<TensorType::Q4_K, true>, table.q6_k = k_rows_avx2<TensorType::Q6_K, true>;
      return;
    case IntegerDot::avx2_maddubs:
      table.q4_k = k_rows_avx2<TensorType::Q4_K, false>, table.q6_k = k_rows_avx2<TensorType::Q6_K, false>;
      return;
#endif
    default:
      table.q4_k = k_rows_portable<TensorType::Q4_K>, table.q6_k = k_rows_portable<TensorType::Q6_K>;
      return;
  }
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
