// bf16_gemm: C (M, N) = op(A) op(B) (+ C) with the inputs rounded to bfloat16 and float32
// accumulation, the arithmetic of AMX's TDPBF16PS bit for bit at every level: AMX tiles where the
// CPU has them, VDPBF16PS or fused multiply-adds elsewhere (Note [bf16 products]).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/aligned.h"
#include "core/kernels/level.h"
#include "core/kernels/matmul_bf16.h"
#include "core/kernels/register_transpose.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

// Note [bf16 products]
// The contract, per output element c of sum_k a_k b_k, a_k and b_k rounded to bf16 (nearest even)
// and a subnormal one read as a zero of its sign: K is cut into blocks of 32 elements counted
// from k = 0, the last one padded with zeros. Per block,
//   E = a chain over the block's even elements (k = 0, 2, ..., 30 of the block, in that order),
//   O = a chain over its odd elements (k = 1, 3, ..., 31), each from +0,
// a chain's step acc + a b rounded once to nearest even (the product of two bf16 values is exact,
// so this is a fused multiply-add); then S = E + O and c = c + S. Every result, steps and sums,
// is flushed to a zero of its sign when it rounds (exponent unbounded) below 2^-126, and an
// incoming c below it is read as zero. c starts at +0, or at C's value when accumulating; a NaN
// gives a NaN, its payload unspecified.
//
// It is AMX's TDPBF16PS on one tile of 16 pairs, whose speed is the reason for this contract:
// 230-640 GFLOP/s at SmolLM2's training shapes on one core of a family 6 model 167 Xeon, against
// 50-125 for a chain of fused multiply-adds. Measured there: 4.9 million elements (tiles of 1 to
// 16 pairs padded with zeros to 16, operands of every exponent, random bit patterns with
// subnormals, infinities and NaNs, C = +0, -0 or random), every bit as this model says. The
// padding is part of it: a shorter tile ends its chains early, where a pad's +0 product turns a
// chain's -0 into +0. Every path gives the same bits, so results never depend on the machine:
//   - AMX (matmul_bf16_amx.cpp): one TDPBF16PS per block and 16 x 16 tile of C, C kept in the tile
//     registers over K. Used only if a self-check of hard cases agrees bit for bit at first use
//     (amx_agrees_with_chain), and unless TAPEGRAD_AMX=0.
//   - VDPBF16PS (AVX512_BF16 without AMX): per lane it adds a pair's slot 1 product, then its slot
//     0 product, each step rounded and flushed as above whatever MXCSR says. Packing the block's
//     even elements e_0, e_1, ... as pairs (slot 1 <- e_2i, slot 0 <- e_2i+1) for one accumulator
//     and its odd elements likewise for another computes E and O at the instruction's full rate;
//     S and c + S are two vector adds under MXCSR's flush-to-zero and denormals-are-zero bits.
//   - fused multiply-adds (every level, emulated16): E and O as two chains under those MXCSR bits,
//     which flush a result that is tiny after rounding, as the contract says. SSE2, which has no
//     fma, adds the exact product in double and rounds to float once more: the double rounding of
//     a sum of two 24-bit numbers in 53 bits is innocuous (Figueroa 1995), and the conversion to
//     float flushes on the rounded value.

// Blocks of the contract: 32 elements of k.
constexpr std::size_t block = 32;

static std::size_t round_up_to_block(std::size_t n) { return (n + block - 1) / block * block; }

// The register tile: MR rows by `vectors` vectors of C, with an E and an O accumulator each (the
// widths keep both sets and the operands in registers), KC-deep slices of K (whole blocks), blocks
// of MC rows of op(A).
constexpr std::size_t KC = 256, MC = 96;
static_assert(KC % block == 0, "a slice of K holds whole blocks");

// The portable path: panels of floats (the rounded values), k in order.
struct ChainPath {
  using Element = float;
  using V = Batch<float>;
  static constexpr std::size_t vectors = 2, MR = V::size == 16 ? 6 : V::size == 8 ? 3 : 2, NR = vectors * V::size;
  static std::size_t index(std::size_t k, std::size_t j, std::size_t width) { return k * width + j; }
  static Element element(std::uint16_t bits) { return from_bf16_bits(bits); }

  // c (MR, NR) = the contract over `rows` (whole blocks) k of the panels a (rows, MR) and b (rows,
  // NR), from C's values when accumulating, else from +0.
  [[gnu::noinline]] static void tile(float* c, std::size_t ldc, const float* a, const float* b, std::size_t rows,
                                     bool accumulate) {
    constexpr std::size_t W = V::size;
    for (std::size_t k0 = 0; k0 < rows; k0 += block) {
      V even[MR][vectors], odd[MR][vectors];
      for (std::size_t r = 0; r < MR; ++r)
        for (std::size_t v = 0; v < vectors; ++v) even[r][v] = odd[r][v] = V(0.0f);
      for (std::size_t k = k0; k < k0 + block; k += 2) {
        V col_even[vectors], col_odd[vectors];
        for (std::size_t v = 0; v < vectors; ++v) {
          col_even[v] = V::load_aligned(b + k * NR + v * W);
          col_odd[v] = V::load_aligned(b + (k + 1) * NR + v * W);
        }
        for (std::size_t r = 0; r < MR; ++r) {
          V x_even(a[k * MR + r]), x_odd(a[(k + 1) * MR + r]);
          for (std::size_t v = 0; v < vectors; ++v) {
            even[r][v] = chain_step(even[r][v], x_even, col_even[v]);
            odd[r][v] = chain_step(odd[r][v], x_odd, col_odd[v]);
          }
        }
      }
      const bool from_c = accumulate || k0 > 0;
      for (std::size_t r = 0; r < MR; ++r)
        for (std::size_t v = 0; v < vectors; ++v) {
          V sum = even[r][v] + odd[r][v], start = from_c ? V::load_unaligned(c + r * ldc + v * W) : V(0.0f);
          (start + sum).store_unaligned(c + r * ldc + v * W);
        }
    }
  }
};

#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
// The instruction's path (AVX-512 level, CPUs with AVX512_BF16 only): panels of bf16 bits, two k
// in each 32-bit word, per block 16 words: word 2s + p holds the elements 4s + p (slot 1, the
// instruction's first) and 4s + 2 + p (slot 0) of the block, so that word 2s runs E's chain and
// word 2s + 1 O's.
struct InstructionPath {
  using Element = std::uint16_t;
  static constexpr std::size_t vectors = 2, MR = 6, NR = vectors * 16;
  static std::size_t index(std::size_t k, std::size_t j, std::size_t width) {
    const std::size_t kk = k % block, word = k / block * (block / 2) + kk / 4 * 2 + kk % 2, slot = 1 - kk / 2 % 2;
    return (word * width + j) * 2 + slot;
  }
  static Element element(std::uint16_t bits) { return bits; }

  // Words of 16 columns: bf16_operand of slot1's floats in their high halves, of slot0's in their
  // low halves. VCVTNE2PS2BF16 rounds as bf16_operand does (to nearest even, a NaN made quiet, a
  // subnormal result flushed to a zero of its sign) but reads a subnormal float as zero, where a
  // float within half an ulp of 2^-126 rounds up to it: those are made 2^-126 first.
  [[gnu::target("avx512bf16")]] static __m512i words(__m512 slot1, __m512 slot0) {
    auto rounds_to_normal = [](__m512 x) {
      const __m512i bits = _mm512_castps_si512(x);
      const __m512i from_edge = _mm512_sub_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)),
                                                 _mm512_set1_epi32(0x007F8000));
      const __mmask16 edge = _mm512_cmplt_epu32_mask(from_edge, _mm512_set1_epi32(0x8000));
      // (bits & sign) | 2^-126's bits
      const __m512i sign = _mm512_set1_epi32(std::int32_t(0x80000000u)), smallest_normal = _mm512_set1_epi32(0x00800000);
      return _mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32(bits, edge, sign, smallest_normal, 0xEA));
    };
    // halves: words 0..15 slot0's, 16..31 slot1's; word 2i <- i and 2i + 1 <- 16 + i interleaves them
    const __m512i halves = __m512i(_mm512_cvtne2ps_pbh(rounds_to_normal(slot1), rounds_to_normal(slot0)));
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                                6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(interleave, halves);
  }

  // Where 16 columns from j (n of them) go among panels `width` wide: per panel they reach, the
  // lanes in it and the offset (in elements, from the first panel's word 0) that lane 0's word 0
  // would have in it (before the panel's start when the panel starts past column j).
  struct Spans {
    std::size_t count = 0;
    std::ptrdiff_t offset[4];
    __mmask16 lanes[4];
  };
  static Spans spans(std::size_t width, std::size_t rows, std::size_t j, std::size_t n) {
    Spans spans;  // a panel is at least 6 columns wide: 16 columns reach at most 4 panels
    for (std::size_t q = j / width; q * width < j + n; ++q, ++spans.count) {
      const std::size_t first = std::max(q * width, j) - j, end = std::min((q + 1) * width, j + n) - j;
      const std::ptrdiff_t column = std::ptrdiff_t(j) - std::ptrdiff_t(q * width);  // lane 0's column in panel q
      spans.offset[spans.count] = std::ptrdiff_t(q * rows * width) + column * 2;
      spans.lanes[spans.count] = __mmask16(((1u << end) - 1) & ~((1u << first) - 1));
    }
    return spans;
  }

  // pack_panels' panels, side by side from `panels` (panel q at q * rows * width), 16 columns at a
  // time, all panels in one pass; each word joins two k of a column, k = 4s + p in slot 1 and
  // 4s + 2 + p in slot 0 making word 2s + p. When the source's rows run across the panels
  // (X(k, j) = X[k * ld + j]), 4 rows are read at a time, each along all the columns (one stream a
  // row); when they run along k (X(k, j) = X[j * ld + k]), 16 columns' rows are read 16 k at a
  // time and transposed into one vector per k, the next 16 columns' rows fetched meanwhile (a row
  // is a short stream, which the hardware's prefetchers pick up late).
  [[gnu::target("avx512bf16")]] static void pack(std::uint16_t* panels, std::size_t width, const float* X, bool trans,
                                                  std::size_t ld, std::size_t k0, std::size_t kc, std::size_t j0,
                                                  std::size_t cols) {
    const std::size_t rows = round_up_to_block(kc), count = (cols + width - 1) / width;
    if (rows != kc || cols % width != 0)  // the stores below cover the block's k and columns only
      std::fill(panels, panels + count * rows * width, std::uint16_t(0));
    auto store = [&](const Spans& to, std::size_t word, __m512i words) {
      for (std::size_t q = 0; q < to.count; ++q)
        _mm512_mask_storeu_epi32(panels + to.offset[q] + std::ptrdiff_t(word * width * 2), to.lanes[q], words);
    };
    auto load = [](const float* x, std::size_t n) {
      return _mm512_maskz_loadu_ps(n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1), x);
    };
    if (!trans) {
      thread_local std::vector<Spans> chunks;
      chunks.clear();
      for (std::size_t j = 0; j < cols; j += 16)
        chunks.push_back(spans(width, rows, j, std::min<std::size_t>(16, cols - j)));
      for (std::size_t k = 0; k < kc; k += 4)
        for (std::size_t j = 0; j < cols; j += 16) {
          const std::size_t n = std::min<std::size_t>(16, cols - j);
          __m512 row[4];
          for (std::size_t i = 0; i < 4; ++i)
            row[i] = k + i < kc ? load(X + (k0 + k + i) * ld + j0 + j, n) : _mm512_setzero_ps();
          for (std::size_t p = 0; p < 2; ++p) store(chunks[j / 16], k / 2 + p, words(row[p], row[2 + p]));
        }
      return;
    }
    for (std::size_t j = 0; j < cols; j += 16) {
      const std::size_t n = std::min<std::size_t>(16, cols - j);
      const Spans to = spans(width, rows, j, n);
      for (std::size_t kb = 0; kb < kc; kb += 16) {
        const std::size_t depth = std::min<std::size_t>(16, kc - kb);
        __m512i lanes[16];  // lanes[k]: the 16 columns' floats at k0 + kb + k
        for (std::size_t c = 0; c < 16; ++c) {
          if (j + 16 + c < cols)
            _mm_prefetch(reinterpret_cast<const char*>(X + (j0 + j + 16 + c) * ld + k0 + kb), _MM_HINT_T0);
          lanes[c] = c < n ? _mm512_castps_si512(load(X + (j0 + j + c) * ld + k0 + kb, depth)) : _mm512_setzero_si512();
        }
        transpose_16x16(lanes);
        for (std::size_t s = 0; s < 4; ++s)
          for (std::size_t p = 0; p < 2; ++p)
            store(to, kb / 2 + 2 * s + p,
                  words(_mm512_castsi512_ps(lanes[4 * s + p]), _mm512_castsi512_ps(lanes[4 * s + 2 + p])));
      }
    }
  }

  [[gnu::target("avx512bf16"), gnu::noinline]] static void tile(float* c, std::size_t ldc, const std::uint16_t* a,
                                                                 const std::uint16_t* b, std::size_t rows,
                                                                 bool accumulate) {
    // C's rows, written after each block (and read after the first), are often far from the cache.
    for (std::size_t r = 0; r < MR; ++r)
      for (std::size_t v = 0; v < vectors; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + v * 16), _MM_HINT_T0);
    for (std::size_t k0 = 0; k0 < rows; k0 += block) {
      __m512 even[MR][vectors], odd[MR][vectors];
      for (std::size_t r = 0; r < MR; ++r)
        for (std::size_t v = 0; v < vectors; ++v) even[r][v] = odd[r][v] = _mm512_setzero_ps();
      for (std::size_t word = k0 / 2; word < (k0 + block) / 2; word += 2) {
        __m512i col_even[vectors], col_odd[vectors];
        for (std::size_t v = 0; v < vectors; ++v) {
          col_even[v] = _mm512_load_si512(b + (word * NR + v * 16) * 2);
          col_odd[v] = _mm512_load_si512(b + ((word + 1) * NR + v * 16) * 2);
        }
        for (std::size_t r = 0; r < MR; ++r) {
          std::int32_t pair_even, pair_odd;
          std::memcpy(&pair_even, a + (word * MR + r) * 2, sizeof pair_even);
          std::memcpy(&pair_odd, a + ((word + 1) * MR + r) * 2, sizeof pair_odd);
          __m512bh x_even = (__m512bh)_mm512_set1_epi32(pair_even), x_odd = (__m512bh)_mm512_set1_epi32(pair_odd);
          for (std::size_t v = 0; v < vectors; ++v) {
            even[r][v] = _mm512_dpbf16_ps(even[r][v], x_even, (__m512bh)col_even[v]);
            odd[r][v] = _mm512_dpbf16_ps(odd[r][v], x_odd, (__m512bh)col_odd[v]);
          }
        }
      }
      const bool from_c = accumulate || k0 > 0;
      for (std::size_t r = 0; r < MR; ++r)
        for (std::size_t v = 0; v < vectors; ++v) {
          __m512 sum = _mm512_add_ps(even[r][v], odd[r][v]);
          __m512 start = from_c ? _mm512_loadu_ps(c + r * ldc + v * 16) : _mm512_setzero_ps();
          _mm512_storeu_ps(c + r * ldc + v * 16, _mm512_add_ps(start, sum));
        }
    }
  }
};
bool cpu_has_bf16_dot_products() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}

// Whether the instruction's tile outruns the FMA chain's on this CPU. It does twice the arithmetic
// per instruction, but on the Xeon this was written on (family 6 model 167, virtualized) it
// retired one VDPBF16PS every 4 cycles against one 16-lane FMA per cycle, so the chain was twice
// as fast; a Zen 4 (AMD family 25 model 17) retires one of each per cycle, so there the
// instruction is. The two give the same bits, so the choice is timed, once: each tile on one
// panel (K = 256, about 2 us), the best of 15 runs each, alternated.
bool instruction_outruns_chain() {
  constexpr std::size_t rows = 256, MR = InstructionPath::MR, NR = InstructionPath::NR;
  static_assert(ChainPath::NR == NR && ChainPath::MR == MR, "both tiles cover the same block of C at AVX-512");
  AlignedVector<std::uint16_t> a_bits(rows * MR, 0x3F80), b_bits(rows * NR, 0x3F80);
  AlignedVector<float> a_floats(rows * MR, 1.0f), b_floats(rows * NR, 1.0f);
  alignas(64) float c[MR * NR];
  auto seconds = [](auto tile) {
    auto start = std::chrono::steady_clock::now();
    tile();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double instruction = 1e9, chain = 1e9;
  for (int run = 0; run < 15; ++run) {
    instruction = std::min(instruction, seconds([&] {
      InstructionPath::tile(c, NR, a_bits.data(), b_bits.data(), rows, false);
    }));
    chain = std::min(chain, seconds([&] { ChainPath::tile(c, NR, a_floats.data(), b_floats.data(), rows, false); }));
  }
  return instruction < chain;
}
#endif

// Writes the operand bits of X(k0 + k, j0 + j), X(k, j) = trans ? X[j * ld + k] : X[k * ld + j],
// for k < kc and j < cols into a panel of `width` columns and round_up_to_block(kc) rows in Path's
// layout, zeros everywhere else.
template <class Path>
static void pack_panel(typename Path::Element* panel, std::size_t width, const float* X, bool trans, std::size_t ld,
                       std::size_t k0, std::size_t kc, std::size_t j0, std::size_t cols) {
  using Element = typename Path::Element;
  if constexpr (requires { &Path::pack; }) return Path::pack(panel, width, X, trans, ld, k0, kc, j0, cols);
  std::fill(panel, panel + round_up_to_block(kc) * width, Element(0));
  if (trans) {  // the source's rows run along k: per 16 k, each column's rounded (a loop that
    // vectorizes), then written a panel row at a time (the panel, 32 KiB at AVX-512, is written
    // along its rows, not down its columns)
    constexpr std::size_t depth = 16, widest = 64;
    static_assert(Path::NR <= widest && Path::MR <= widest, "a panel is at most `widest` columns wide");
    alignas(64) Element operands[widest][depth];
    for (std::size_t kb = 0; kb < kc; kb += depth) {
      const std::size_t ks = std::min(depth, kc - kb);
      for (std::size_t j = 0; j < cols; ++j) {
        const float* row = X + (j0 + j) * ld + k0 + kb;
        for (std::size_t k = 0; k < ks; ++k) operands[j][k] = Path::element(bf16_operand(row[k]));
      }
      for (std::size_t k = 0; k < ks; ++k)
        for (std::size_t j = 0; j < cols; ++j) panel[Path::index(kb + k, j, width)] = operands[j][k];
    }
    return;
  }
  for (std::size_t k = 0; k < kc; ++k) {
    const float* row = X + (k0 + k) * ld + j0;
    for (std::size_t j = 0; j < cols; ++j) panel[Path::index(k, j, width)] = Path::element(bf16_operand(row[j]));
  }
}

// pack_panel over the panels of `cols` columns from j0, `width` each, side by side from `panels`
// (panel q at q * round_up_to_block(kc) * width): in one pass where the path can.
template <class Path>
static void pack_panels(typename Path::Element* panels, std::size_t width, const float* X, bool trans, std::size_t ld,
                        std::size_t k0, std::size_t kc, std::size_t j0, std::size_t cols) {
  if constexpr (requires { &Path::pack; }) return Path::pack(panels, width, X, trans, ld, k0, kc, j0, cols);
  const std::size_t rows = round_up_to_block(kc);
  for (std::size_t j = 0; j < cols; j += width)
    pack_panel<Path>(panels + j / width * rows * width, width, X, trans, ld, k0, kc, j0 + j, std::min(width, cols - j));
}

// C = 0 when not accumulating: what a product over K = 0 gives (no block, nothing read or flushed).
static void zero_unless_accumulating(std::size_t M, std::size_t N, bool accumulate, float* C, std::size_t ldc) {
  if (!accumulate)
    for (std::size_t i = 0; i < M; ++i) std::fill_n(C + i * ldc, N, 0.0f);
}

// op(B) (K, N) packed whole, as bf16_product packs it a KC slice at a time: slice p0 / KC at
// p0 * panels * NR elements, its panel jp at jp * rows * NR past that (rows: the slice's k
// rounded up to whole blocks).
template <class Path>
static std::size_t packed_b_size(std::size_t K, std::size_t N) {
  return (K / KC * KC + round_up_to_block(K % KC)) * ((N + Path::NR - 1) / Path::NR) * Path::NR;
}

template <class Path>
static void pack_b(typename Path::Element* packed, const float* B, bool transpose_b, std::size_t ldb, std::size_t K,
                   std::size_t N) {
  const std::size_t panels = (N + Path::NR - 1) / Path::NR;
  detail::parallel_for(panels, K * Path::NR, [&](std::size_t jp) {
    for (std::size_t p0 = 0; p0 < K; p0 += KC) {
      const std::size_t kc = std::min(KC, K - p0), rows = round_up_to_block(kc);
      pack_panel<Path>(packed + p0 * panels * Path::NR + jp * rows * Path::NR, Path::NR, B, transpose_b, ldb, p0, kc,
                       jp * Path::NR, std::min(Path::NR, N - jp * Path::NR));
    }
  });
}

// op(B) packed by pack_b over all its columns, C's column 0 being op(B)'s column j0 (a multiple
// of NR); null to pack op(B) here.
template <class Element>
struct PackedB {
  const Element* panels = nullptr;
  std::size_t all_panels = 0, j0 = 0;
};

// Brings a block of op(A) into L2 a few lines at a time, while the block before it runs: packing
// reads op(A) once, from memory that is usually far (a layer's activations, saved since its
// forward), and the hardware's prefetchers do not look ahead across its short rows. Measured on
// SmolLM2's bf16 fine-tuning step (Zen 4, one thread), packing op(A) took about half as long.
class BlockFetch {
 public:
  BlockFetch() = default;
  /// op(A)'s rows i0.. (m of them), columns p0.. (kc of them), over `steps` calls of step().
  BlockFetch(const float* A, bool transpose_a, std::size_t lda, std::size_t i0, std::size_t m, std::size_t p0,
             std::size_t kc, std::size_t steps)
      : first_(transpose_a ? A + p0 * lda + i0 : A + i0 * lda + p0),
        ld_(lda),
        rows_(transpose_a ? kc : m),
        row_lines_((transpose_a ? m : kc) * sizeof(float) / line + 1) {
    per_step_ = (rows_ * row_lines_ + steps - 1) / std::max<std::size_t>(steps, 1);
  }
  void step() {
    for (std::size_t n = 0; n < per_step_ && row_ < rows_; ++n) {
      _mm_prefetch(reinterpret_cast<const char*>(first_ + row_ * ld_) + line_ * line, _MM_HINT_T1);
      if (++line_ == row_lines_) line_ = 0, ++row_;
    }
  }

 private:
  static constexpr std::size_t line = 64;
  const float* first_ = nullptr;
  std::size_t ld_ = 0, rows_ = 0, row_lines_ = 0, per_step_ = 0;
  std::size_t row_ = 0, line_ = 0;  // the next line to fetch
};

// The BLIS loop order of packed_gemm (core/kernels/matmul.cpp): per KC slice, op(B) packed into
// panels of NR columns (unless `packed` holds them); per block of MC rows, op(A) packed into
// panels of MR rows (the next block fetched meanwhile); the tile runs one panel of each. Partial
// tiles run on a copy of C's corner, so that every element gets the same arithmetic.
template <class Path>
static void bf16_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
                         std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C, std::size_t ldc,
                         PackedB<typename Path::Element> packed = {}) {
  using Element = typename Path::Element;
  constexpr std::size_t MR = Path::MR, NR = Path::NR;
  static_assert(MC % MR == 0, "a block of rows holds whole panels");
  if (K == 0) return zero_unless_accumulating(M, N, accumulate, C, ldc);
  FlushSubnormals flush;  // MXCSR is per thread; VDPBF16PS ignores it, its sums do not
  const std::size_t panels = (N + NR - 1) / NR;
  thread_local AlignedVector<Element> b_pack, a_pack;
  if (!packed.panels) grow_to(b_pack, panels * KC * NR);
  grow_to(a_pack, MC * KC);
  alignas(64) float edge[MR * NR];
  for (std::size_t p0 = 0; p0 < K; p0 += KC) {
    const std::size_t kc = std::min(KC, K - p0), rows = round_up_to_block(kc);
    const bool continues = p0 > 0 || accumulate;
    const Element* b_slice = packed.panels ? packed.panels + p0 * packed.all_panels * NR + packed.j0 / NR * rows * NR
                                           : b_pack.data();
    if (!packed.panels) pack_panels<Path>(b_pack.data(), NR, B, transpose_b, ldb, p0, kc, 0, N);
    for (std::size_t i0 = 0; i0 < M; i0 += MC) {
      const std::size_t i1 = std::min(M, i0 + MC), tiles = panels * ((i1 - i0 + MR - 1) / MR);
      pack_panels<Path>(a_pack.data(), MR, A, !transpose_a, lda, p0, kc, i0, i1 - i0);  // op(A)^T(k, r) = op(A)(r, k)
      BlockFetch next;  // the block packed next: below this one, else the first of the next slice
      if (i1 < M)
        next = BlockFetch(A, transpose_a, lda, i1, std::min(M, i1 + MC) - i1, p0, kc, tiles);
      else if (p0 + KC < K)
        next = BlockFetch(A, transpose_a, lda, 0, std::min(M, MC), p0 + KC, std::min(KC, K - p0 - KC), tiles);
      for (std::size_t jp = 0; jp < panels; ++jp) {
        const Element* b_panel = b_slice + jp * rows * NR;
        const std::size_t j0 = jp * NR, cols = std::min(NR, N - j0);
        for (std::size_t r0 = i0; r0 < i1; r0 += MR) {
          next.step();
          const Element* a_panel = a_pack.data() + (r0 - i0) * rows;
          float* c = C + r0 * ldc + j0;
          const std::size_t tile_rows = std::min(MR, i1 - r0);
          if (tile_rows == MR && cols == NR) {
            Path::tile(c, ldc, a_panel, b_panel, rows, continues);
            continue;
          }
          if (continues)
            for (std::size_t r = 0; r < tile_rows; ++r) std::copy_n(c + r * ldc, cols, edge + r * NR);
          Path::tile(edge, NR, a_panel, b_panel, rows, continues);
          for (std::size_t r = 0; r < tile_rows; ++r) std::copy_n(edge + r * NR, cols, c + r * ldc);
        }
      }
    }
  }
}

// bf16_product packing op(B) itself.
template <class Path>
static void packing_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K,
                            const float* A, std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C,
                            std::size_t ldc) {
  bf16_product<Path>(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}

// A product (packing_product's signature) over the kernel threads, each on its block of C.
template <class Product>
static void split_bf16_product(Product product, bool transpose_a, bool transpose_b, std::size_t M, std::size_t N,
                               std::size_t K, const float* A, std::size_t lda, const float* B, std::size_t ldb,
                               bool accumulate, float* C, std::size_t ldc) {
  if (M == 0 || N == 0) return;
  detail::split_product(M, N, K, [&](std::size_t m0, std::size_t m, std::size_t n0, std::size_t n) {
    product(transpose_a, transpose_b, m, n, K, A + (transpose_a ? m0 : m0 * lda), lda, B + (transpose_b ? n0 * ldb : n0),
            ldb, accumulate, C + m0 * ldc + n0, ldc);
  });
}

#if TAPEGRAD_BF16_AMX
// The AMX path over K = 0 as the others.
static void amx_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
                        std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C, std::size_t ldc) {
  if (K == 0) return zero_unless_accumulating(M, N, accumulate, C, ldc);
  amx_bf16_product(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}

// Whether AMX gives this contract's bits on this CPU: a product of hard cases through the tiles
// and through the chain, equal bit for bit (NaN as NaN). Operands of three kinds mixed: exponents
// near 1 (the order of the roundings shows), random bit patterns (subnormals, infinities, NaNs,
// zeros of both signs) and extremes (products that overflow or underflow); C likewise; and
// chains that end at 2^-126 or just under it (flushed or not), K past two blocks.
static bool amx_agrees_with_chain() {
  constexpr std::size_t M = 19, N = 35, K = 77;
  std::uint64_t state = 0x9E3779B97F4A7C15u;
  auto random_bits = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return std::uint16_t(state >> 20);
  };
  auto operand = [&](std::size_t n) {
    std::uint16_t bits = random_bits();
    const std::uint16_t exponent = n % 3 == 0 ? 120 + random_bits() % 16 : random_bits() % 2 ? random_bits() % 4 : 250 + random_bits() % 6;
    if (n % 3 != 1) bits = std::uint16_t((bits & 0x807F) | exponent << 7);
    return from_bf16_bits(bits);
  };
  std::vector<float> A(M * K), B(K * N), C(M * N);
  for (std::size_t n = 0; n < A.size(); ++n) A[n] = operand(n);
  for (std::size_t n = 0; n < B.size(); ++n) B[n] = operand(n + random_bits());
  for (std::size_t n = 0; n < C.size(); ++n) C[n] = operand(n) * 1.375f;
  // B is transposed: column j is B[j * K ...]. Row 0 times column 0: 2^-126 (k = 0), then
  // -2^-150 (k = 2) on the same chain, tiny after rounding: flushed; times column 1: -2^-152
  // instead (k = 4), which rounds back to 2^-126: kept. Row 1 times column 2: C = 1 plus 2^-24 on
  // each chain, 1 + 2^-23.
  for (std::size_t k = 0; k < K; ++k) A[k] = A[K + k] = B[k] = B[K + k] = B[2 * K + k] = 0.0f;
  A[0] = std::ldexp(1.0f, -63), A[2] = -std::ldexp(1.0f, -75), A[4] = -std::ldexp(1.0f, -76);
  B[0] = B[K] = std::ldexp(1.0f, -63), B[2] = std::ldexp(1.0f, -75), B[K + 4] = std::ldexp(1.0f, -76);
  A[K] = A[K + 1] = B[2 * K] = B[2 * K + 1] = std::ldexp(1.0f, -12);
  C[0] = C[1] = 0.0f, C[N + 2] = 1.0f;
  for (bool accumulate : {false, true}) {
    std::vector<float> tiles = C, chain = C;
    amx_product(false, true, M, N, K, A.data(), K, B.data(), K, accumulate, tiles.data(), N);
    bf16_product<ChainPath>(false, true, M, N, K, A.data(), K, B.data(), K, accumulate, chain.data(), N);
    for (std::size_t n = 0; n < C.size(); ++n)
      if (std::memcmp(&tiles[n], &chain[n], sizeof(float)) != 0 && !(std::isnan(tiles[n]) && std::isnan(chain[n])))
        return false;
  }
  return true;
}

// Whether bf16_gemm runs on AMX here: the CPU has it, the process got the tile state, the
// self-check agrees, and TAPEGRAD_AMX is not 0. Decided once.
static bool amx_chosen() {
  static const bool chosen = [] {
    const char* setting = std::getenv("TAPEGRAD_AMX");
    if (setting && std::strcmp(setting, "0") == 0) return false;
    return amx_tiles_usable() && amx_agrees_with_chain();
  }();
  return chosen;
}
#endif

template <class T>
void bf16_gemm_via(Bf16Path path, bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K,
                    const float* A, std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C,
                    std::size_t ldc) {
#if TAPEGRAD_BF16_AMX
  if (path == Bf16Path::amx_tiles && amx_tiles_usable())
    return split_bf16_product(amx_product, transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
#endif
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
  static const bool has_instruction = cpu_has_bf16_dot_products();
  if (path != Bf16Path::fma_chain && has_instruction)
    return split_bf16_product(packing_product<InstructionPath>, transpose_a, transpose_b, M, N, K, A, lda, B, ldb,
                              accumulate, C, ldc);
#endif
  (void)path;
  split_bf16_product(packing_product<ChainPath>, transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}
TAPEGRAD_INSTANTIATE_KERNEL(bf16_gemm_via)

// The path bf16_gemm takes on this CPU at this level, decided once.
static Bf16Path fastest_path() {
#if TAPEGRAD_BF16_AMX
  static const bool amx = amx_chosen();
#else
  constexpr bool amx = false;
#endif
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
  static const Bf16Path fastest = amx ? Bf16Path::amx_tiles
                                  : cpu_has_bf16_dot_products() && instruction_outruns_chain()
                                      ? Bf16Path::dot_product_instruction
                                      : Bf16Path::fma_chain;
  return fastest;
#else
  (void)amx;
  return Bf16Path::fma_chain;
#endif
}

template <class T>
void bf16_gemm(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
               std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C, std::size_t ldc) {
  TAPEGRAD_SIMD_LEVEL::bf16_gemm_via<T>(fastest_path(), transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate,
                                        C, ldc);
}
TAPEGRAD_INSTANTIATE_KERNEL(bf16_gemm)

SharedBf16Operand::SharedBf16Operand(bool transpose_b, std::size_t K, std::size_t N, const float* B, std::size_t ldb)
    : transpose_b_(transpose_b), K_(K), N_(N), B_(B), ldb_(ldb) {
  if (K == 0) return;
#if TAPEGRAD_BF16_AMX
  if (fastest_path() == Bf16Path::amx_tiles) {
    const std::size_t words = amx_packed_columns_size(K, N);  // every one written by the packing
    storage_ = cached_storage((words + 1) / 2);
    packed_ = reinterpret_cast<std::uint16_t*>(storage_.get());
    amx_pack_columns(packed_, B, transpose_b, ldb, K, N);
  }
#endif
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
  if (fastest_path() == Bf16Path::dot_product_instruction) {
    storage_ = cached_storage((packed_b_size<InstructionPath>(K, N) + 1) / 2);
    packed_ = reinterpret_cast<std::uint16_t*>(storage_.get());
    pack_b<InstructionPath>(packed_, B, transpose_b, ldb, K, N);
  }
#endif
}

void SharedBf16Operand::product(bool transpose_a, std::size_t M, const float* A, std::size_t lda, bool accumulate,
                                float* C, std::size_t ldc) const {
  if (!packed_) return bf16_gemm<float>(transpose_a, transpose_b_, M, N_, K_, A, lda, B_, ldb_, accumulate, C, ldc);
  if (M == 0 || N_ == 0) return;
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
  const std::size_t all_panels = (N_ + InstructionPath::NR - 1) / InstructionPath::NR;
  detail::split_product(M, N_, K_, [&](std::size_t m0, std::size_t m, std::size_t n0, std::size_t n) {
    const float* a = A + (transpose_a ? m0 : m0 * lda);
    float* c = C + m0 * ldc + n0;
#if TAPEGRAD_BF16_AMX
    if (fastest_path() == Bf16Path::amx_tiles)
      return amx_bf16_product(transpose_a, transpose_b_, m, n, K_, a, lda, nullptr, ldb_, accumulate, c, ldc, packed_,
                              n0);
#endif
    bf16_product<InstructionPath>(transpose_a, transpose_b_, m, n, K_, a, lda, nullptr, ldb_, accumulate, c, ldc,
                                  {packed_, all_panels, n0});
  });
#endif
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
