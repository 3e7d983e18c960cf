// This level's packed kernels for the block formats of 32 (Q4_0, Q4_1, Q5_0, Q8_0; core/quant/
// packed_kernels.h): integer dot products on 8-bit activation blocks, each output computed as Note
// [Packed products] fixes it, in register tiles of weight rows by activation rows; and the level's
// tables. The portable loops run at SSE2 and emulated16; AVX2 forms the integer sums with AVX-VNNI
// or vpmaddubsw, AVX-512 with VNNI two blocks at a time.
#include <cpuid.h>

#include <cmath>
#include <vector>

#include "core/kernels/quant_matmul_tiles.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

using quant::ActivationRows;
using quant::PackedMatrix;
using quant::TensorType;

// The layout of a block format's blocks of 32 (core/quant/block_format.cpp): bytes per block, where
// the codes start, the offset subtracted from the unsigned codes, whether a minimum follows d, and
// whether a 32-bit word after d holds each code's fifth bit (Q5_0).
template <TensorType type> struct Blocks;
template <> struct Blocks<TensorType::Q4_0> {
  static constexpr std::size_t bytes = 18, codes = 2;
  static constexpr int offset = 8, shift = 3;  // offset = 1 << shift
  static constexpr bool nibbles = true, has_min = false, fifth_bits = false;
};
template <> struct Blocks<TensorType::Q4_1> {
  static constexpr std::size_t bytes = 20, codes = 4;
  static constexpr int offset = 0, shift = 0;
  static constexpr bool nibbles = true, has_min = true, fifth_bits = false;
};
template <> struct Blocks<TensorType::Q5_0> {
  static constexpr std::size_t bytes = 22, codes = 6;
  static constexpr int offset = 16, shift = 4;
  static constexpr bool nibbles = true, has_min = false, fifth_bits = true;
};
template <> struct Blocks<TensorType::Q8_0> {
  static constexpr std::size_t bytes = 34, codes = 2;
  static constexpr int offset = 128, shift = 7;
  static constexpr bool nibbles = false, has_min = false, fifth_bits = false;
};

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
      float acc[16] = {};
      for (std::size_t b = 0; b < blocks; ++b) {
        const std::byte* block = row + b * B::bytes;
        std::uint8_t u[32];
        for (int j = 0; j < 16 && B::nibbles; ++j) {
          u[j] = std::uint8_t(unsigned(block[B::codes + j]) & 0xF);
          u[j + 16] = std::uint8_t(unsigned(block[B::codes + j]) >> 4);
        }
        for (int j = 0; j < 32 && !B::nibbles; ++j) u[j] = std::uint8_t(unsigned(block[B::codes + j]) ^ 0x80);
        for (int j = 0; j < 32 && B::fifth_bits; ++j) u[j] |= std::uint8_t(((load_u32(block + 2) >> j) & 1) << 4);
        const float scale = half_to_float(load_u16(block)) * d[8 * b];
        const float min = B::has_min ? half_to_float(load_u16(block + 2)) : 0;
        for (std::size_t g = 0; g < 8; ++g) {
          std::int32_t sum = B::offset * neg_sums[8 * b + g];
          for (std::size_t j = 4 * g; j < 4 * g + 4; ++j) sum += std::int32_t(u[j]) * q[32 * b + j];
          float& lane = acc[(b % 2) * 8 + g];
          lane = std::fma(float(sum), scale, lane);
          if constexpr (B::has_min) lane = std::fma(min, scaled_sums[8 * b + g], lane);
        }
      }
      store_sum(y + m * ldy + n, acc, accumulate);
    }
  }
}

#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)

// ---- AVX2: register tiles, a block at a time; integer sums by AVX-VNNI's vpdpbusd where the CPU
// has it, else by vpmaddubsw + vpmaddwd -----------------------------------------------------------

// A block's 32 codes in element order: Q4's and Q5_0's unsigned, Q8_0's signed bytes as stored.
template <TensorType type> __m256i codes256(const std::byte* block) {
  using B = Blocks<type>;
  if constexpr (!B::nibbles) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + B::codes));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + B::codes));
    const __m128i low = _mm_set1_epi8(0xF);
    const __m256i nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
    if constexpr (!B::fifth_bits) return nibbles;
    // byte j gets the fifth bits' byte j / 8, then keeps its bit j % 8 as 0x10
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(int(load_u32(block + 2))),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x(std::int64_t(0x8040201008040201));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
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
                                                          std::size_t m0, std::size_t b, std::size_t ahead,
                                                          __m256 (&acc)[NR][MR][2]) {
  using B = Blocks<type>;
  __m256i codes[NR];
  __m256 d[NR], min[NR];
  for (int r = 0; r < NR; ++r) {
    const std::byte* block = rows[r] + b * B::bytes;
    _mm_prefetch(reinterpret_cast<const char*>(block + ahead), _MM_HINT_T0);  // ahead: prefetch_distance
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
      acc[r][i][parity] = _mm256_fmadd_ps(sums, _mm256_mul_ps(d[r], dx), acc[r][i][parity]);
      if constexpr (B::has_min)
        acc[r][i][parity] = _mm256_fmadd_ps(min[r], _mm256_loadu_ps(x.scaled_sums + 8 * at), acc[r][i][parity]);
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
  __m256 acc[NR][MR][2];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) acc[r][i][0] = acc[r][i][1] = _mm256_setzero_ps();
  const std::size_t ahead = prefetch_distance<NR>(stride);
  std::size_t b = 0;
  for (; b + 1 < blocks; b += 2) {
    block_step256<type, vnni, NR, MR, 0>(rows, x, m0, b, ahead, acc);
    block_step256<type, vnni, NR, MR, 1>(rows, x, m0, b + 1, ahead, acc);
  }
  if (b < blocks) block_step256<type, vnni, NR, MR, 0>(rows, x, m0, b, ahead, acc);
  store_tile256(y, ldy, m0, n0, acc, accumulate);
}

template <TensorType type, bool vnni>
void block_rows_avx2(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                     std::size_t last, bool accumulate) {
  const std::size_t stride = w.row_bytes(), blocks = w.cols / 32;
  auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
    block_tile_avx2<type, vnni, NR, MR>(y, ldy, x, m0, w.bytes.data() + n * stride, stride, blocks, n, accumulate);
  };
  run_integer_tiles_avx2(tile, x.rows, first, last);
}

#endif

#if defined(__AVX512F__)

// ---- AVX-512 with VNNI: register tiles of NR weight rows by MR activation rows -----------------
// A pair of blocks of each of NR weight rows is decoded once (codes, scales, minimums) and meets MR
// activation rows, whose blocks are loaded once for the NR rows: one-row decoding runs 4 x 1 tiles,
// prefill and batched decoding 2 x 4 or 4 x 4. Each output keeps its own accumulators and its own
// sequence of operations, so the tile a row falls in never changes its bits.

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
    __m512i nibbles;
    if constexpr (gfni) {
      constexpr long long low = 0x0102040800000000, high = 0x1020408000000000;
      nibbles = _mm512_gf2p8affine_epi64_epi8(packed, _mm512_set_epi64(high, high, low, low, high, high, low, low), 0);
    } else {
      const __m512i shifted = _mm512_srlv_epi64(packed, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
      nibbles = _mm512_and_si512(shifted, _mm512_set1_epi8(0xF));
    }
    if constexpr (!B::fifth_bits) return nibbles;
    // bit j of the 64-bit word a's fifth bits then b's is code j's
    const std::uint64_t fifth = load_u32(a + 2) | (pair ? std::uint64_t(load_u32(a + B::bytes + 2)) << 32 : 0);
    return _mm512_mask_add_epi8(nibbles, __mmask64(fifth), nibbles, _mm512_set1_epi8(0x10));
  } else {  // Q8_0's signed codes as they are (tile_step takes x as the unsigned operand)
    const __m256i ua = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + B::codes));
    const __m256i ub = pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + B::bytes + B::codes))
                            : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(ua), ub, 1);
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
                                                         std::size_t m0, std::size_t b, std::size_t ahead,
                                                         __m512 (&acc)[NR][MR]) {
  using B = Blocks<type>;
  // Q8_0's signed codes meet x + 128 (x.q_plus_128): the sums gain 128 times the weights' group
  // sums, taken back by starting from minus that, once a weight row (the other formats' unsigned
  // codes meet x and start from offset times x's negated group sums, once a row of x).
  constexpr bool signed_codes = type == TensorType::Q8_0;
  __m512i codes[NR], weight_bias[NR];
  __m512 d[NR], min[NR];
  for (int r = 0; r < NR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(rows[r] + b * B::bytes + ahead), _MM_HINT_T0);
    codes[r] = codes512<type, pair, gfni>(rows[r] + b * B::bytes);
    scales512<type, pair>(rows[r] + b * B::bytes, d[r], min[r]);
    if constexpr (signed_codes)
      weight_bias[r] = _mm512_sub_epi32(
          _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(0x80)), codes[r]));
  }
  for (int i = 0; i < MR; ++i) {
    const std::size_t at = (m0 + i) * x.blocks + b;
    const __m512 dx = _mm512_loadu_ps(x.d + 8 * at);
    const __m512i xq = _mm512_loadu_si512(signed_codes ? static_cast<const void*>(x.q_plus_128 + 32 * at)
                                                       : static_cast<const void*>(x.q + 32 * at));
    __m512i bias = _mm512_setzero_si512();
    if constexpr (!signed_codes && B::offset != 0)
      bias = _mm512_slli_epi32(_mm512_loadu_si512(x.neg_sums + 8 * at), B::shift);
    for (int r = 0; r < NR; ++r) {
      const __m512 sums = signed_codes ? _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(weight_bias[r], xq, codes[r]))
                                       : _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, codes[r], xq));
      acc[r][i] = _mm512_fmadd_ps(sums, _mm512_mul_ps(d[r], dx), acc[r][i]);
      if constexpr (B::has_min)
        acc[r][i] = _mm512_fmadd_ps(min[r], _mm512_loadu_ps(x.scaled_sums + 8 * at), acc[r][i]);
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
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  const std::size_t ahead = prefetch_distance<NR>(stride);  // bytes on (quant_matmul_tiles.h)
  std::size_t b = 0;
  for (; b + 1 < blocks; b += 2) tile_step<type, gfni, NR, MR, true>(rows, x, m0, b, ahead, acc);
  if (b < blocks) tile_step<type, gfni, NR, MR, false>(rows, x, m0, b, ahead, acc);
  store_tile512(y, ldy, m0, n0, acc, accumulate);
}

// The functions that take gfni as a parameter are compiled for GFNI in both versions: the one
// without calls no GFNI intrinsic and holds no loop over bytes a compiler could turn into one.
template <TensorType type, bool gfni>
void block_rows_vnni(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                     std::size_t last, bool accumulate) {
  const std::size_t stride = w.row_bytes(), blocks = w.cols / 32;
  auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
    block_tile_vnni<type, gfni, NR, MR>(y, ldy, x, m0, w.bytes.data() + n * stride, stride, blocks, n, accumulate);
  };
  run_integer_tiles_avx512(tile, x.rows, first, last);
}

#endif


// AVX-VNNI is CPUID leaf 7 subleaf 1, EAX bit 4, asked of CPUID itself: clang 14's
// __builtin_cpu_supports does not know the name "avxvnni".
[[maybe_unused]] bool cpu_has_avx_vnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
}

// One table: the block formats' kernels that form integer sums as `dot` says, the K-quants' alike,
// and the level's float kernels and activation quantizer.
quant::PackedKernelTable make_table(IntegerDot dot, const char* name) {
  quant::PackedKernelTable table;
  switch (dot) {
#if defined(__AVX512F__)
    case IntegerDot::avx512_vnni_gfni:
      table.q4_0 = block_rows_vnni<TensorType::Q4_0, true>, table.q4_1 = block_rows_vnni<TensorType::Q4_1, true>;
      table.q5_0 = block_rows_vnni<TensorType::Q5_0, true>, table.q8_0 = block_rows_vnni<TensorType::Q8_0, true>;
      break;
    case IntegerDot::avx512_vnni:
      table.q4_0 = block_rows_vnni<TensorType::Q4_0, false>, table.q4_1 = block_rows_vnni<TensorType::Q4_1, false>;
      table.q5_0 = block_rows_vnni<TensorType::Q5_0, false>, table.q8_0 = block_rows_vnni<TensorType::Q8_0, false>;
      break;
#endif
#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
    case IntegerDot::avx_vnni:
      table.q4_0 = block_rows_avx2<TensorType::Q4_0, true>, table.q4_1 = block_rows_avx2<TensorType::Q4_1, true>;
      table.q5_0 = block_rows_avx2<TensorType::Q5_0, true>, table.q8_0 = block_rows_avx2<TensorType::Q8_0, true>;
      break;
    case IntegerDot::avx2_maddubs:
      table.q4_0 = block_rows_avx2<TensorType::Q4_0, false>, table.q4_1 = block_rows_avx2<TensorType::Q4_1, false>;
      table.q5_0 = block_rows_avx2<TensorType::Q5_0, false>, table.q8_0 = block_rows_avx2<TensorType::Q8_0, false>;
      break;
#endif
    default:
      table.q4_0 = block_rows_portable<TensorType::Q4_0>, table.q4_1 = block_rows_portable<TensorType::Q4_1>;
      table.q5_0 = block_rows_portable<TensorType::Q5_0>, table.q8_0 = block_rows_portable<TensorType::Q8_0>;
      break;
  }
  set_k_quant_kernels(table, dot);
  set_float_kernels(table);
  table.quantize_row = activation_quantizer();
  table.integer_dot = name;
  return table;
}

std::vector<quant::PackedKernelTable> make_tables() {
  std::vector<quant::PackedKernelTable> tables;
#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
  __builtin_cpu_init();
#if defined(__AVX512F__)
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("gfni"))
    tables.push_back(make_table(IntegerDot::avx512_vnni_gfni, "avx512vnni gfni"));
  if (__builtin_cpu_supports("avx512vnni")) tables.push_back(make_table(IntegerDot::avx512_vnni, "avx512vnni"));
#endif
  if (cpu_has_avx_vnni()) tables.push_back(make_table(IntegerDot::avx_vnni, "avxvnni"));
  tables.push_back(make_table(IntegerDot::avx2_maddubs, "avx2 vpmaddubsw"));
#else
  tables.push_back(make_table(IntegerDot::portable, "portable"));
#endif
  return tables;
}

}  // namespace

std::span<const quant::PackedKernelTable> packed_tables() {
  static const std::vector<quant::PackedKernelTable> tables = make_tables();
  return tables;
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
