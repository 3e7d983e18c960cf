// This level's packed kernel for BF16 weights (core/quant/packed_kernels.h): bf16_gemm's contract
// (Note [bf16 products]) on units whose words pair two columns of sixteen outputs as VDPBF16PS
// reads them (core/quant/row_groups.h), meeting x's rounded pairs broadcast, in tiles of groups by
// rows of x. Two ways to run the chains, the same bits: VDPBF16PS (AVX-512 level, CPUs with
// AVX512_BF16), one instruction a word; or a fused multiply-add a column (every level), under
// MXCSR's flush bits. And the rounding of x's rows into those pairs.
#include <bit>
#include <cstring>

#include "core/kernels/matmul_bf16.h"
#include "core/kernels/quant_matmul_tiles.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

using quant::ActivationRows;
using quant::PackedMatrix;

constexpr std::size_t unit_bytes = 1024, unit_words = 16;  // a unit: 16 words of 16 rows
constexpr std::uint32_t high_half = 0xFFFF0000u;

using Floats = Batch<float>;
constexpr std::size_t batches = group_rows / Floats::size;

// A word of a group's 16 outputs (64 bytes at p) as slot 1's and slot 0's floats: its high half,
// and its low half shifted up.
inline void widen_word(const std::byte* p, Floats (&hi)[batches], Floats (&lo)[batches]) {
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
  const __m512i words = _mm512_load_si512(p);
  hi[0] = _mm512_castsi512_ps(_mm512_and_si512(words, _mm512_set1_epi32(int(high_half))));
  lo[0] = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
#elif defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
  for (std::size_t i = 0; i < batches; ++i) {
    const __m256i words = _mm256_load_si256(reinterpret_cast<const __m256i*>(p) + i);
    hi[i] = _mm256_castsi256_ps(_mm256_and_si256(words, _mm256_set1_epi32(int(high_half))));
    lo[i] = _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
  }
#elif !defined(TAPEGRAD_EMULATED_BATCH)
  for (std::size_t i = 0; i < batches; ++i) {
    const __m128i words = _mm_load_si128(reinterpret_cast<const __m128i*>(p) + i);
    hi[i] = _mm_castsi128_ps(_mm_and_si128(words, _mm_set1_epi32(int(high_half))));
    lo[i] = _mm_castsi128_ps(_mm_slli_epi32(words, 16));
  }
#else
  alignas(64) float h[group_rows], l[group_rows];
  for (std::size_t r = 0; r < group_rows; ++r) {
    const std::uint32_t word = load_u32(p + 4 * r);
    h[r] = std::bit_cast<float>(word & high_half), l[r] = std::bit_cast<float>(word << 16);
  }
  for (std::size_t i = 0; i < batches; ++i)
    hi[i] = Floats::load_aligned(h + i * Floats::size), lo[i] = Floats::load_aligned(l + i * Floats::size);
#endif
}

// Outputs of groups g .. g + NG - 1 for x's rows m0 .. m0 + MR - 1 (chain_pairs' operands at xs,
// ldx words apart), the chains by fused multiply-adds: word 2s + p's slot 1 then slot 0 step
// chain p (E for p = 0, O for 1; two arrays, not one indexed by p, so that they stay in registers).
// `ahead` as float_tile's (quant_matmul_float.cpp).
template <int NG, int MR>
void chain_tile(float* y, std::size_t ldy, const std::uint32_t* xs, std::size_t ldx, const PackedMatrix& w,
                std::size_t g, std::size_t m0, std::size_t first, std::size_t last, std::size_t ahead,
                bool accumulate) {
  const std::byte* groups[NG];
  for (int j = 0; j < NG; ++j) groups[j] = w.group(g + j);
  TileSums<Floats, NG, MR, batches> sums;
  auto& acc = sums.lanes;
  const std::size_t unit_count = w.units();
  for (std::size_t u = 0; u < unit_count; ++u) {
    Floats even[NG][MR][batches], odd[NG][MR][batches];
    for (int j = 0; j < NG; ++j)
      for (int i = 0; i < MR; ++i)
        for (std::size_t b = 0; b < batches; ++b) even[j][i][b] = odd[j][i][b] = Floats(0.0f);
    // one chain's step by word `word` (its slot 1's product, then slot 0's)
    auto step = [&](Floats (&chain)[NG][MR][batches], std::size_t word) {
      Floats hi[NG][batches], lo[NG][batches];
      for (int j = 0; j < NG; ++j) {
        const std::byte* at = groups[j] + u * unit_bytes + word * 64;
        if (ahead) _mm_prefetch(reinterpret_cast<const char*>(at + ahead), _MM_HINT_T1);
        widen_word(at, hi[j], lo[j]);
      }
      for (int i = 0; i < MR; ++i) {
        const std::uint32_t* operands = xs + i * ldx + 2 * (u * unit_words + word);  // chain_pairs' layout
        const Floats x1(std::bit_cast<float>(operands[0])), x0(std::bit_cast<float>(operands[1]));
        for (int j = 0; j < NG; ++j)
          for (std::size_t b = 0; b < batches; ++b)
            chain[j][i][b] = chain_step(chain_step(chain[j][i][b], x1, hi[j][b]), x0, lo[j][b]);
      }
    };
    for (std::size_t word = 0; word < unit_words; word += 2) step(even, word), step(odd, word + 1);
    for (int j = 0; j < NG; ++j)
      for (int i = 0; i < MR; ++i)
        for (std::size_t b = 0; b < batches; ++b) acc[j][i][b] = acc[j][i][b] + (even[j][i][b] + odd[j][i][b]);
  }
  sums.store(y, ldy, g, m0, first, last, accumulate);
}

#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
// chain_tile's outputs by VDPBF16PS: one instruction steps a chain by a word's two products, slot
// 1's then slot 0's, rounded and flushed as the contract says whatever MXCSR holds.
template <int NG, int MR>
[[gnu::target("avx512bf16")]] void instruction_tile(float* y, std::size_t ldy, const std::uint32_t* xs,
                                                    std::size_t ldx, const PackedMatrix& w, std::size_t g,
                                                    std::size_t m0, std::size_t first, std::size_t last,
                                                    std::size_t ahead, bool accumulate) {
  const std::byte* groups[NG];
  for (int j = 0; j < NG; ++j) groups[j] = w.group(g + j);
  __m512 acc[NG][MR];
  for (int j = 0; j < NG; ++j)
    for (int i = 0; i < MR; ++i) acc[j][i] = _mm512_setzero_ps();
  const std::size_t unit_count = w.units();
  for (std::size_t u = 0; u < unit_count; ++u) {
    __m512 even[NG][MR], odd[NG][MR];
    for (int j = 0; j < NG; ++j)
      for (int i = 0; i < MR; ++i) even[j][i] = odd[j][i] = _mm512_setzero_ps();
    for (std::size_t word = 0; word < unit_words; word += 2) {
      __m512i w_even[NG], w_odd[NG];
      for (int j = 0; j < NG; ++j) {
        const std::byte* at = groups[j] + u * unit_bytes + word * 64;
        if (ahead)
          for (std::size_t line = 0; line < 128; line += 64)
            _mm_prefetch(reinterpret_cast<const char*>(at + ahead + line), _MM_HINT_T1);
        w_even[j] = _mm512_load_si512(at), w_odd[j] = _mm512_load_si512(at + 64);
      }
      for (int i = 0; i < MR; ++i) {
        const std::uint32_t* pairs = xs + i * ldx + u * unit_words + word;
        const __m512bh x_even = (__m512bh)_mm512_set1_epi32(int(pairs[0]));
        const __m512bh x_odd = (__m512bh)_mm512_set1_epi32(int(pairs[1]));
        for (int j = 0; j < NG; ++j) {
          even[j][i] = _mm512_dpbf16_ps(even[j][i], (__m512bh)w_even[j], x_even);
          odd[j][i] = _mm512_dpbf16_ps(odd[j][i], (__m512bh)w_odd[j], x_odd);
        }
      }
    }
    for (int j = 0; j < NG; ++j)
      for (int i = 0; i < MR; ++i) acc[j][i] = _mm512_add_ps(acc[j][i], _mm512_add_ps(even[j][i], odd[j][i]));
  }
  alignas(64) float out[group_rows];
  for (int j = 0; j < NG; ++j)
    for (int i = 0; i < MR; ++i) {
      _mm512_store_ps(out, acc[j][i]);
      store_group(y + (m0 + i) * ldy + (g + j) * group_rows, out, g + j, first, last, accumulate);
    }
}
#endif

// The kernel, in tiles whose E and O fill the level's registers: at AVX-512 3 groups by 4 rows of
// x (the fastest of 1 x 8, 2 x 4, 2 x 6, 4 x 3 and 3 x 4 for VDPBF16PS at 4 to 64 rows on a Zen 4),
// at AVX2 (two batches a group) 1 by 2, at SSE2 1 by 1; one row of x one group (10.2 -> 8.2 ms for
// SmolLM2's 269 MB on a Zen 4 core, against 4 groups). The chains at AVX-512 from 8 rows: 1 group
// by 12 rows, whose widening of a word (an AND and a shift, on the FMAs' ports) serves 24 FMAs
// instead of 8, with 29 registers live where 3 x 4 spilled, and whose group stays in L1 for the
// rows after the first 12 (16 rows times a (1,536, 576) matrix from memory, one thread of a Xeon
// of family 6 model 167: 296-299 us against 333-337; 8, 24, 64 and 512 rows 1.02-1.18x as fast, 4
// rows 0.84x).
template <bool instruction>
void bf16_rows(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
               std::size_t last, bool accumulate) {
  FlushSubnormals flush;  // the sums' flushes (and the chains' on the FMA path)
  auto tile = [&]<int NG, int MR>(std::size_t g, std::size_t m0) {
    // every tile of rows asks for the next tile of groups: spread over them, the requests keep
    // the weights streaming (S = 16 on a Zen 4: 158 -> 193 GFLOP/s against the first tile alone)
    const std::size_t ahead = x.rows >= rows_to_prefetch && g + 2 * NG <= w.groups() ? NG * w.group_bytes() : 0;
    const std::uint32_t* xs = x.bf16_pairs + m0 * x.bf16_words;
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
    if constexpr (instruction)
      return instruction_tile<NG, MR>(y, ldy, xs, x.bf16_words, w, g, m0, first, last, ahead, accumulate);
#endif
    chain_tile<NG, MR>(y, ldy, xs, x.bf16_words, w, g, m0, first, last, ahead, accumulate);
  };
  if (x.rows == 1) return run_groups<1, 1>(tile, x.rows, first, last);  // one run of bytes (quant_matmul_float.cpp)
  if constexpr (batches == 1 && !instruction)  // the chains from 8 rows (above)
    if (x.rows >= 8) return run_groups<1, 12>(tile, x.rows, first, last);
  if constexpr (batches == 1) run_groups<3, 4>(tile, x.rows, first, last);
  else run_groups<1, batches == 2 ? 2 : 1>(tile, x.rows, first, last);
}

// The operand columns of a block's words: slot 1's column of word w, 4 (w / 2) + w % 2; slot 0's
// is that + 2.
constexpr std::size_t slot1_column(std::size_t w) { return w / 2 * 4 + w % 2; }

#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
// A row of x as VDPBF16PS's pairs: each value rounded (bf16_operand), word w of block b holding
// slot 1's column of block b in its high half and slot 0's in its low half.
void instruction_pairs(const float* x, std::size_t cols, std::uint32_t* words) {
  // slot 1's columns of the 16 words, and slot 0's, among the block's 32
  const __m512i high = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
  const __m512i low = _mm512_add_epi32(high, _mm512_set1_epi32(2));
  for (std::size_t k = 0; k < cols; k += 32, words += 16) {
    const std::size_t count = std::min<std::size_t>(32, cols - k);
    const __m512i first = operand_lanes(x + k, std::min<std::size_t>(16, count));
    const __m512i second = count > 16 ? operand_lanes(x + k + 16, count - 16) : _mm512_setzero_si512();
    const __m512i pairs = _mm512_or_si512(_mm512_slli_epi32(_mm512_permutex2var_epi32(first, high, second), 16),
                                          _mm512_permutex2var_epi32(first, low, second));
    _mm512_storeu_si512(words, pairs);
  }
}
#endif

// A row of x for the FMA chains: the same operands as floats' bits, word w of block b as two
// words, slot 1's operand then slot 0's.
void chain_pairs(const float* x, std::size_t cols, std::uint32_t* words) {
  const std::size_t blocks = (cols + 31) / 32;
  for (std::size_t b = 0; b < blocks; ++b)
    for (std::size_t w = 0; w < unit_words; ++w) {
      const std::size_t k = 32 * b + slot1_column(w);
      words[32 * b + 2 * w] = k < cols ? std::uint32_t(bf16_operand(x[k])) << 16 : 0;
      words[32 * b + 2 * w + 1] = k + 2 < cols ? std::uint32_t(bf16_operand(x[k + 2])) << 16 : 0;
    }
}

}  // namespace

void set_bf16_kernels(quant::PackedKernelTable& table, bool instruction) {
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
  if (instruction) {
    table.bf16 = bf16_rows<true>, table.bf16_dot = "vdpbf16ps";
    table.pair_row = instruction_pairs, table.bf16_block_words = 16;
    return;
  }
#endif
  (void)instruction;
  table.bf16 = bf16_rows<false>, table.bf16_dot = "fma";
  table.pair_row = chain_pairs, table.bf16_block_words = 32;
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
