// This level's packed_matmul kernels (core/quant/packed_kernels.h) and the activation quantizer
// they read: y = x W^T for W in a block format (integer dot products on 8-bit activation blocks) or
// in BF16 / F16 (float products), each output computed as Note [Packed products] fixes it, in
// register tiles of weight rows by activation rows. The portable loops run at SSE2 and emulated16;
// AVX2 forms the integer sums with AVX-VNNI or vpmaddubsw, AVX-512 with VNNI two blocks at a time.
#include <cpuid.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/kernels/level.h"
#include "core/quant/packed_kernels.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

using quant::ActivationRows;
using quant::PackedMatrix;
using quant::TensorType;

std::uint16_t load_u16(const std::byte* p) { return std::uint16_t(unsigned(p[0]) | (unsigned(p[1]) << 8)); }

// IEEE half to float, exactly (block_format.h's f16_to_f32, without its loop): the half's
// exponent and mantissa moved into a float's and scaled by 2^112; a subnormal half becomes a
// subnormal float first, whose scaling is exact too.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16, bits = std::uint32_t(h & 0x7FFF) << 13;
  if ((h & 0x7C00) == 0x7C00) return std::bit_cast<float>(sign | 0x7F800000u | bits);  // inf, NaN
  return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(std::bit_cast<float>(bits) * 0x1p112f));
}

// The layout of a block format's blocks of 32 (core/quant/block_format.cpp): bytes per block, where
// the codes start, the offset subtracted from the unsigned codes, and whether a minimum follows d.
template <TensorType type> struct Blocks;
template <> struct Blocks<TensorType::Q4_0> {
  static constexpr std::size_t bytes = 18, codes = 2;
  static constexpr int offset = 8, shift = 3;  // offset = 1 << shift
  static constexpr bool nibbles = true, has_min = false;
};
template <> struct Blocks<TensorType::Q4_1> {
  static constexpr std::size_t bytes = 20, codes = 4;
  static constexpr int offset = 0, shift = 0;
  static constexpr bool nibbles = true, has_min = true;
};
template <> struct Blocks<TensorType::Q8_0> {
  static constexpr std::size_t bytes = 34, codes = 2;
  static constexpr int offset = 128, shift = 7;
  static constexpr bool nibbles = false, has_min = false;
};

// y = the lanes' tree sum (Note [Packed products]), plus y's old value when accumulating.
inline void store_sum(float* y, const float t[16], bool accumulate) {
  float t8[8], t4[4];
  for (int l = 0; l < 8; ++l) t8[l] = t[l] + t[l + 8];
  for (int l = 0; l < 4; ++l) t4[l] = t8[l] + t8[l + 4];
  const float sum = (t4[0] + t4[2]) + (t4[1] + t4[3]);
  *y = accumulate ? *y + sum : sum;
}

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

// ---- portable: the definition, in plain loops --------------------------------------------------

template <TensorType type>
void block_rows_portable(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w,
                         std::size_t first, std::size_t last, bool accumulate) {
  using B = Blocks<type>;
  const std::size_t blocks = w.cols / 32;
  for (std::size_t n = first; n < last; ++n) {
    const std::byte* row = w.row(n);
    for (std::size_t m = 0; m < x.rows; ++m) {
      const std::int8_t* q = x.q + m * x.blocks * 32;
      const std::int32_t* neg_sums = x.neg_sums + m * x.blocks * 8;
      const float* d = x.d + m * x.blocks * 8;
      const float* scaled_sums = x.scaled_sums + m * x.blocks * 8;
      float acc[16] = {}, acc2[16] = {};
      for (std::size_t b = 0; b < blocks; ++b) {
        const std::byte* block = row + b * B::bytes;
        std::uint8_t u[32];
        for (int j = 0; j < 16 && B::nibbles; ++j) {
          u[j] = std::uint8_t(unsigned(block[B::codes + j]) & 0xF);
          u[j + 16] = std::uint8_t(unsigned(block[B::codes + j]) >> 4);
        }
        for (int j = 0; j < 32 && !B::nibbles; ++j) u[j] = std::uint8_t(unsigned(block[B::codes + j]) ^ 0x80);
        const float scale = half_to_float(load_u16(block)) * d[8 * b];
        for (std::size_t g = 0; g < 8; ++g) {
          std::int32_t sum = B::offset * neg_sums[8 * b + g];
          for (std::size_t j = 4 * g; j < 4 * g + 4; ++j) sum += std::int32_t(u[j]) * q[32 * b + j];
          acc[(b % 2) * 8 + g] += float(sum) * scale;
        }
        if constexpr (B::has_min) {
          const float min = half_to_float(load_u16(block + 2));
          for (std::size_t g = 0; g < 8; ++g) acc2[(b % 2) * 8 + g] += min * scaled_sums[8 * b + g];
        }
      }
      if constexpr (B::has_min)
        for (int l = 0; l < 16; ++l) acc[l] += acc2[l];
      store_sum(y + m * ldy + n, acc, accumulate);
    }
  }
}

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

// The groups of a block, from its codes and d: -sum, d and d * sum of each group's four q.
inline void block_groups(const std::int8_t* q, float d, std::int32_t* neg_sums, float* ds, float* scaled_sums) {
  for (int g = 0; g < 8; ++g) {
    const int sum = q[4 * g] + q[4 * g + 1] + q[4 * g + 2] + q[4 * g + 3];
    neg_sums[g] = -sum;
    ds[g] = d;
    scaled_sums[g] = d * float(sum);
  }
}

inline void quantize_row_portable(const float* x, std::size_t cols, std::size_t blocks, std::int8_t* q,
                                  std::int32_t* neg_sums, float* d, float* scaled_sums) {
  for (std::size_t b = 0; b < blocks; ++b, q += 32, neg_sums += 8, d += 8, scaled_sums += 8) {
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
    block_groups(q, scale, neg_sums, d, scaled_sums);
  }
}

template <TensorType type> float weight_at(const std::byte* row, std::size_t k) {
  const std::uint16_t bits = load_u16(row + 2 * k);
  if constexpr (type == TensorType::BF16) return std::bit_cast<float>(std::uint32_t(bits) << 16);
  else return half_to_float(bits);
}

template <TensorType type>
void float_rows_portable(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w,
                         std::size_t first, std::size_t last, bool accumulate) {
  for (std::size_t n = first; n < last; ++n)
    for (std::size_t m = 0; m < x.rows; ++m) {
      const float* xm = x.x + m * x.cols;
      float acc[16] = {};
      for (std::size_t k = 0; k < w.cols; ++k) acc[k % 16] += weight_at<type>(w.row(n), k) * xm[k];
      store_sum(y + m * ldy + n, acc, accumulate);
    }
}

#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)

// ---- AVX2: register tiles, a block at a time; integer sums by AVX-VNNI's vpdpbusd where the CPU
// has it, else by vpmaddubsw + vpmaddwd -----------------------------------------------------------

// y = the tree of lanes lo (0-7) and hi (8-15), as store_sum.
inline void store_sum256(float* y, __m256 lo, __m256 hi, bool accumulate) {
  const __m256 t8 = _mm256_add_ps(lo, hi);
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));  // t4[0] + t4[2], t4[1] + t4[3]
  const float sum = _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
  *y = accumulate ? *y + sum : sum;
}

// A block's 32 codes in element order: Q4's nibbles (unsigned), Q8_0's signed bytes as stored.
template <TensorType type> __m256i codes256(const std::byte* block) {
  using B = Blocks<type>;
  if constexpr (!B::nibbles) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + B::codes));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + B::codes));
    const __m128i low = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
  }
}

// The eight group sums L[b][g] of one block (Note [Packed products]) from its codes and x's block.
// The functions that take vnni as a parameter are compiled for AVX-VNNI in both versions; the one
// without calls no VNNI intrinsic and holds no loop a compiler could turn into one.
template <TensorType type, bool vnni>
[[gnu::target("avxvnni")]] inline __m256i group_sums256(__m256i codes, __m256i xq, const std::int32_t* neg_sums) {
  using B = Blocks<type>;
  __m256i bias = _mm256_setzero_si256();
  if constexpr (B::offset != 0 && (vnni || B::nibbles))
    bias = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(neg_sums)), B::shift);
  if constexpr (vnni) {  // unsigned codes: Q8_0's offset by 128
    return _mm256_dpbusd_avx_epi32(bias, B::nibbles ? codes : _mm256_xor_si256(codes, _mm256_set1_epi8(char(0x80))), xq);
  } else {
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (!B::nibbles)  // signed codes: |w| times q with w's sign, pairs below 2 * 128 * 127
      return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(codes), _mm256_sign_epi8(xq, codes)), ones);
    const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xq), ones);  // pairs below 2 * 15 * 127
    return B::offset == 0 ? sums : _mm256_add_epi32(sums, bias);
  }
}

// Block b of the tile's NR weight rows against its MR activation rows, into the lanes of b's parity.
template <TensorType type, bool vnni, int NR, int MR, int parity>
[[gnu::target("avxvnni,f16c")]] inline void block_step256(const std::byte* rows[NR], const ActivationRows& x,
                                                          std::size_t m0, std::size_t b, __m256 (&acc)[NR][MR][2],
                                                          __m256 (&acc2)[NR][MR][2]) {
  using B = Blocks<type>;
  __m256i codes[NR];
  __m256 d[NR], min[NR];
  for (int r = 0; r < NR; ++r) {
    const std::byte* block = rows[r] + b * B::bytes;
    _mm_prefetch(reinterpret_cast<const char*>(block + 16 * B::bytes), _MM_HINT_T0);  // as tile_step's
    codes[r] = codes256<type>(block);
    d[r] = _mm256_set1_ps(_cvtsh_ss(load_u16(block)));
    if constexpr (B::has_min) min[r] = _mm256_set1_ps(_cvtsh_ss(load_u16(block + 2)));
  }
  for (int i = 0; i < MR; ++i) {
    const std::size_t at = (m0 + i) * x.blocks + b;
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 32 * at));
    const __m256 dx = _mm256_loadu_ps(x.d + 8 * at);
    for (int r = 0; r < NR; ++r) {
      const __m256 sums = _mm256_cvtepi32_ps(group_sums256<type, vnni>(codes[r], xq, x.neg_sums + 8 * at));
      acc[r][i][parity] = _mm256_add_ps(acc[r][i][parity], _mm256_mul_ps(sums, _mm256_mul_ps(d[r], dx)));
      if constexpr (B::has_min)
        acc2[r][i][parity] =
            _mm256_add_ps(acc2[r][i][parity], _mm256_mul_ps(min[r], _mm256_loadu_ps(x.scaled_sums + 8 * at)));
    }
  }
}

// Outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1): weight row n0 at `row`, the next ones `stride` on.
template <TensorType type, bool vnni, int NR, int MR>
[[gnu::target("avxvnni,f16c")]] void block_tile_avx2(float* y, std::size_t ldy, const ActivationRows& x, std::size_t m0,
                                                     const std::byte* row, std::size_t stride, std::size_t blocks,
                                                     std::size_t n0, bool accumulate) {
  const std::byte* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = row + r * stride;
  __m256 acc[NR][MR][2], acc2[NR][MR][2];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) acc[r][i][0] = acc[r][i][1] = acc2[r][i][0] = acc2[r][i][1] = _mm256_setzero_ps();
  std::size_t b = 0;
  for (; b + 1 < blocks; b += 2) {
    block_step256<type, vnni, NR, MR, 0>(rows, x, m0, b, acc, acc2);
    block_step256<type, vnni, NR, MR, 1>(rows, x, m0, b + 1, acc, acc2);
  }
  if (b < blocks) block_step256<type, vnni, NR, MR, 0>(rows, x, m0, b, acc, acc2);
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) {
      if constexpr (Blocks<type>::has_min)
        for (int h = 0; h < 2; ++h) acc[r][i][h] = _mm256_add_ps(acc[r][i][h], acc2[r][i][h]);
      store_sum256(y + (m0 + i) * ldy + n0 + r, acc[r][i][0], acc[r][i][1], accumulate);
    }
}

// Sixteen registers: a tile holds at most eight accumulators (two an output, four for Q4_1's).
template <TensorType type, bool vnni>
void block_rows_avx2(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                     std::size_t last, bool accumulate) {
  const std::size_t stride = w.row_bytes(), blocks = w.cols / 32;
  auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
    block_tile_avx2<type, vnni, NR, MR>(y, ldy, x, m0, w.bytes.data() + n * stride, stride, blocks, n, accumulate);
  };
  if (Blocks<type>::has_min || x.rows == 1) return run_tiles<2, 1>(tile, x.rows, 0, first, last);
  run_tiles<2, 2>(tile, x.rows, 0, first, last);
}

// Eight BF16 or F16 weights as floats; count < 8 reads only the first count (the rest are zeros).
// F16C converts halves: every AVX2 CPU has it, though the level's flags do not name it.
template <TensorType type> [[gnu::target("f16c")]] __m256 weights256(const std::byte* p, std::size_t count) {
  __m128i h;
  if (count >= 8) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {
    std::uint16_t lanes[8] = {};
    std::memcpy(lanes, p, 2 * count);
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lanes));
  }
  if constexpr (type == TensorType::BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  else return _mm256_cvtph_ps(h);
}

inline __m256 load_x256(const float* x, std::size_t count) {
  return count >= 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, detail::lanes_below<float>(count));
}

// Outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1) of BF16 or F16 weights, lanes 0-7 in lo and 8-15
// in hi: each weight vector widened once for the MR rows, each x vector loaded once for the NR rows.
template <TensorType type, int NR, int MR>
[[gnu::target("f16c")]] void float_tile_avx2(float* y, std::size_t ldy, const ActivationRows& x, std::size_t m0,
                                             const std::byte* row, std::size_t n0, bool accumulate) {
  const std::byte* rows[NR];
  __m256 lo[NR][MR], hi[NR][MR];
  for (int r = 0; r < NR; ++r) {
    rows[r] = row + r * 2 * x.cols;
    for (int i = 0; i < MR; ++i) lo[r][i] = hi[r][i] = _mm256_setzero_ps();
  }
  for (std::size_t k = 0; k < x.cols; k += 16) {
    const std::size_t rest = x.cols - k;
    __m256 w_lo[NR], w_hi[NR];
    for (int r = 0; r < NR; ++r) {
      w_lo[r] = weights256<type>(rows[r] + 2 * k, rest);
      if (rest > 8) w_hi[r] = weights256<type>(rows[r] + 2 * k + 16, rest - 8);
    }
    for (int i = 0; i < MR; ++i) {
      const float* xm = x.x + (m0 + i) * x.cols + k;
      const __m256 x_lo = load_x256(xm, rest);
      for (int r = 0; r < NR; ++r) lo[r][i] = _mm256_add_ps(lo[r][i], _mm256_mul_ps(w_lo[r], x_lo));
      if (rest > 8) {
        const __m256 x_hi = load_x256(xm + 8, rest - 8);
        for (int r = 0; r < NR; ++r) hi[r][i] = _mm256_add_ps(hi[r][i], _mm256_mul_ps(w_hi[r], x_hi));
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) store_sum256(y + (m0 + i) * ldy + n0 + r, lo[r][i], hi[r][i], accumulate);
}

template <TensorType type>
void float_rows_avx2(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                     std::size_t last, bool accumulate) {
  auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
    float_tile_avx2<type, NR, MR>(y, ldy, x, m0, w.row(n), n, accumulate);
  };
  if (x.rows == 1) return run_tiles<2, 1>(tile, x.rows, 0, first, last);
  run_tiles<2, 2>(tile, x.rows, 0, first, last);
}

#endif

#if defined(__AVX512F__)

// ---- AVX-512 with VNNI: register tiles of NR weight rows by MR activation rows -----------------
// A pair of blocks of each of NR weight rows is decoded once (codes, scales, minimums) and meets MR
// activation rows, whose blocks are loaded once for the NR rows: one-row decoding runs 4 x 1 tiles,
// prefill and batched decoding 2 x 4 or 4 x 4. Each output keeps its own accumulators and its own
// sequence of operations, so the tile a row falls in never changes its bits.

inline std::uint32_t load_u32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The codes of blocks a and b (absent: no second block) as 64 unsigned bytes in the order of
// x's quantized pair: a's 32 then b's 32 (an absent block's codes count for zero). With GFNI one
// affine transform per byte takes the nibbles (a bit matrix per 64-bit lane: the low or the high
// four bits) where a shift and a mask take two instructions.
template <TensorType type, bool pair, bool gfni>
[[gnu::target("gfni")]] inline __m512i codes512(const std::byte* a) {
  using B = Blocks<type>;
  if constexpr (B::nibbles) {
    const __m128i low_a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + B::codes));
    __m512i packed = _mm512_maskz_broadcast_i32x4(pair ? 0xFFFF : 0x00FF, low_a);  // a, a, 0, 0
    if constexpr (pair)
      packed = _mm512_mask_broadcast_i32x4(packed, 0xFF00,
                                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + B::bytes + B::codes)));
    // 128-bit lanes a, a, b, b: the second of each keeps the high nibbles
    if constexpr (gfni) {
      constexpr long long low = 0x0102040800000000, high = 0x1020408000000000;
      return _mm512_gf2p8affine_epi64_epi8(packed, _mm512_set_epi64(high, high, low, low, high, high, low, low), 0);
    }
    const __m512i shifted = _mm512_srlv_epi64(packed, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_and_si512(shifted, _mm512_set1_epi8(0xF));
  } else {
    const __m256i ua = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + B::codes));
    const __m256i ub = pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + B::bytes + B::codes))
                            : _mm256_set1_epi8(char(0x80));
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(ua), ub, 1), _mm512_set1_epi8(char(0x80)));
  }
}

// The weights' scales d_w (lanes 0-7 block a's, 8-15 b's) and, for Q4_1, minimums m_w the same way.
template <TensorType type, bool pair> void scales512(const std::byte* a, __m512& d, __m512& min) {
  using B = Blocks<type>;
  // d and m (or d and the first codes) of each block, four halves converted at once
  const __m128i halves =
      _mm_insert_epi32(_mm_cvtsi32_si128(int(load_u32(a))), pair ? int(load_u32(a + B::bytes)) : 0, 1);
  const __m512 both = _mm512_cvtph_ps(_mm256_castsi128_si256(halves));  // d_a, m_a, d_b, m_b, ...
  d = _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), both);
  if constexpr (B::has_min)
    min = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), both);
}

// One pair of blocks (b, b + 1; pair false: b alone, the row's last) of the tile.
template <TensorType type, bool gfni, int NR, int MR, bool pair>
[[gnu::target("avx512vnni,gfni")]] inline void tile_step(const std::byte* rows[NR], const ActivationRows& x,
                                                         std::size_t m0, std::size_t b, __m512 (&acc)[NR][MR],
                                                         __m512 (&acc2)[NR][MR]) {
  using B = Blocks<type>;
  __m512i codes[NR];
  __m512 d[NR], min[NR];
  for (int r = 0; r < NR; ++r) {
    // NR rows read side by side are NR streams in one page, more than the hardware prefetcher
    // follows: each row asks for its blocks 16 ahead (5-7% on SmolLM2's head streamed from L3).
    _mm_prefetch(reinterpret_cast<const char*>(rows[r] + (b + 16) * B::bytes), _MM_HINT_T0);
    codes[r] = codes512<type, pair, gfni>(rows[r] + b * B::bytes);
    scales512<type, pair>(rows[r] + b * B::bytes, d[r], min[r]);
  }
  for (int i = 0; i < MR; ++i) {
    const std::size_t at = (m0 + i) * x.blocks + b;
    const __m512i xq = _mm512_loadu_si512(x.q + 32 * at);
    const __m512 dx = _mm512_loadu_ps(x.d + 8 * at);
    __m512i bias = _mm512_setzero_si512();
    if constexpr (B::offset != 0) bias = _mm512_slli_epi32(_mm512_loadu_si512(x.neg_sums + 8 * at), B::shift);
    for (int r = 0; r < NR; ++r) {
      const __m512 sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, codes[r], xq));
      acc[r][i] = _mm512_add_ps(acc[r][i], _mm512_mul_ps(sums, _mm512_mul_ps(d[r], dx)));
      if constexpr (B::has_min)
        acc2[r][i] = _mm512_add_ps(acc2[r][i], _mm512_mul_ps(min[r], _mm512_loadu_ps(x.scaled_sums + 8 * at)));
    }
  }
}

// Outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1): weight row n0 at `row`, the next ones `stride` on.
template <TensorType type, bool gfni, int NR, int MR>
[[gnu::target("avx512vnni,gfni")]] void block_tile_vnni(float* y, std::size_t ldy, const ActivationRows& x,
                                                        std::size_t m0, const std::byte* row, std::size_t stride,
                                                        std::size_t blocks, std::size_t n0, bool accumulate) {
  const std::byte* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = row + r * stride;
  __m512 acc[NR][MR], acc2[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) acc[r][i] = acc2[r][i] = _mm512_setzero_ps();
  std::size_t b = 0;
  for (; b + 1 < blocks; b += 2) tile_step<type, gfni, NR, MR, true>(rows, x, m0, b, acc, acc2);
  if (b < blocks) tile_step<type, gfni, NR, MR, false>(rows, x, m0, b, acc, acc2);
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) {
      const __m512 t = Blocks<type>::has_min ? _mm512_add_ps(acc[r][i], acc2[r][i]) : acc[r][i];
      store_sum256(y + (m0 + i) * ldy + n0 + r, _mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1), accumulate);
    }
}

// The functions that take gfni as a parameter are compiled for GFNI in both versions: the one
// without calls no GFNI intrinsic and holds no loop over bytes a compiler could turn into one.
template <TensorType type, bool gfni>
void block_rows_vnni(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                     std::size_t last, bool accumulate) {
  // One activation row: two weight rows share its loads (four ran up to 18% slower with the
  // weights streaming from L3, as decoding reads them; docs/quantization.md). More: a tile of 2
  // (Q4_1: two accumulators an output) or 4 weight rows by 4 activation rows, in 32 registers.
  const std::size_t stride = w.row_bytes(), blocks = w.cols / 32;
  auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
    block_tile_vnni<type, gfni, NR, MR>(y, ldy, x, m0, w.bytes.data() + n * stride, stride, blocks, n, accumulate);
  };
  if (x.rows == 1) return run_tiles<2, 1>(tile, x.rows, 0, first, last);
  run_tiles<Blocks<type>::has_min ? 2 : 4, 4>(tile, x.rows, 0, first, last);
}

// quantize_row_portable's operations sixteen lanes at a time: the same bits.
void quantize_row_avx512(const float* x, std::size_t cols, std::size_t blocks, std::int8_t* q,
                         std::int32_t* neg_sums, float* d, float* scaled_sums) {
  const __m512 sign = _mm512_set1_ps(-0.0f), limit = _mm512_set1_ps(127.0f);
  for (std::size_t b = 0; b < blocks; ++b, q += 32, neg_sums += 8, d += 8, scaled_sums += 8) {
    const std::size_t rest = 32 * b < cols ? cols - 32 * b : 0;
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
    const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), block), _mm256_set1_epi16(1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(neg_sums), _mm256_sub_epi32(_mm256_setzero_si256(), sums));
    _mm256_storeu_ps(d, _mm256_set1_ps(scale));
    _mm256_storeu_ps(scaled_sums, _mm256_mul_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(sums)));
  }
}

template <TensorType type> __m512 weights512(const std::byte* p, std::size_t count) {
  const __m256i h = count >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                : _mm256_maskz_loadu_epi16(__mmask16((1u << count) - 1), p);
  if constexpr (type == TensorType::BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  else return _mm512_cvtph_ps(h);
}

// Outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1) of BF16 or F16 weights: each weight vector
// widened once for the MR rows, each x vector loaded once for the NR rows.
template <TensorType type, int NR, int MR>
void float_tile_avx512(float* y, std::size_t ldy, const ActivationRows& x, std::size_t m0, const std::byte* row,
                       std::size_t n0, bool accumulate) {
  const std::byte* rows[NR];
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r) {
    rows[r] = row + r * 2 * x.cols;
    for (int i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  for (std::size_t k = 0; k < x.cols; k += 16) {
    const std::size_t rest = x.cols - k;
    __m512 weights[NR];
    for (int r = 0; r < NR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + 2 * k + 1024), _MM_HINT_T0);  // as tile_step's
      weights[r] = weights512<type>(rows[r] + 2 * k, rest);
    }
    for (int i = 0; i < MR; ++i) {
      const float* xm = x.x + (m0 + i) * x.cols + k;
      const __m512 xs = rest >= 16 ? _mm512_loadu_ps(xm) : _mm512_maskz_loadu_ps(detail::lanes_below(rest), xm);
      for (int r = 0; r < NR; ++r) acc[r][i] = _mm512_add_ps(acc[r][i], _mm512_mul_ps(weights[r], xs));
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i)
      store_sum256(y + (m0 + i) * ldy + n0 + r, _mm512_castps512_ps256(acc[r][i]),
                   _mm512_extractf32x8_ps(acc[r][i], 1), accumulate);
}

template <TensorType type>
void float_rows_avx512(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                       std::size_t last, bool accumulate) {
  auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
    float_tile_avx512<type, NR, MR>(y, ldy, x, m0, w.row(n), n, accumulate);
  };
  if (x.rows == 1) return run_tiles<2, 1>(tile, x.rows, 0, first, last);
  run_tiles<4, 4>(tile, x.rows, 0, first, last);
}

#endif

// AVX-VNNI is CPUID leaf 7 subleaf 1, EAX bit 4, asked of CPUID itself: clang 14's
// __builtin_cpu_supports does not know the name "avxvnni".
[[maybe_unused]] bool cpu_has_avx_vnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
}

std::vector<quant::PackedKernelTable> make_tables() {
  std::vector<quant::PackedKernelTable> tables;
#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
  __builtin_cpu_init();
#if defined(__AVX512F__)
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("gfni"))
    tables.push_back({block_rows_vnni<TensorType::Q4_0, true>, block_rows_vnni<TensorType::Q4_1, true>,
                      block_rows_vnni<TensorType::Q8_0, true>, float_rows_avx512<TensorType::BF16>,
                      float_rows_avx512<TensorType::F16>, quantize_row_avx512, "avx512vnni gfni"});
  if (__builtin_cpu_supports("avx512vnni"))
    tables.push_back({block_rows_vnni<TensorType::Q4_0, false>, block_rows_vnni<TensorType::Q4_1, false>,
                      block_rows_vnni<TensorType::Q8_0, false>, float_rows_avx512<TensorType::BF16>,
                      float_rows_avx512<TensorType::F16>, quantize_row_avx512, "avx512vnni"});
  const quant::PackedKernelTable floats = {nullptr, nullptr, nullptr, float_rows_avx512<TensorType::BF16>,
                                           float_rows_avx512<TensorType::F16>, quantize_row_avx512, ""};
#else
  const quant::PackedKernelTable floats = {nullptr, nullptr, nullptr, float_rows_avx2<TensorType::BF16>,
                                           float_rows_avx2<TensorType::F16>, quantize_row_portable, ""};
#endif
  if (cpu_has_avx_vnni())
    tables.push_back({block_rows_avx2<TensorType::Q4_0, true>, block_rows_avx2<TensorType::Q4_1, true>,
                      block_rows_avx2<TensorType::Q8_0, true>, floats.bf16, floats.f16, floats.quantize_row,
                      "avxvnni"});
  tables.push_back({block_rows_avx2<TensorType::Q4_0, false>, block_rows_avx2<TensorType::Q4_1, false>,
                    block_rows_avx2<TensorType::Q8_0, false>, floats.bf16, floats.f16, floats.quantize_row,
                    "avx2 vpmaddubsw"});
#else
  tables.push_back({block_rows_portable<TensorType::Q4_0>, block_rows_portable<TensorType::Q4_1>,
                    block_rows_portable<TensorType::Q8_0>, float_rows_portable<TensorType::BF16>,
                    float_rows_portable<TensorType::F16>, quantize_row_portable, "portable"});
#endif
  return tables;
}

}  // namespace

std::span<const quant::PackedKernelTable> packed_tables() {
  static const std::vector<quant::PackedKernelTable> tables = make_tables();
  return tables;
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
