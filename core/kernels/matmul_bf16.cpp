// bf16_gemm: C (M, N) = op(A) op(B) (+ C) with the inputs rounded to bfloat16 and float32
// accumulation, the arithmetic of AVX512_BF16's VDPBF16PS bit for bit at every level: the
// instruction where the CPU has it, a chain of fused multiply-adds elsewhere (Note [bf16 products]).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "core/aligned.h"
#include "core/bf16.h"
#include "core/kernels/level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

// Note [bf16 products]
// VDPBF16PS adds two bf16 products into each float32 lane. Its arithmetic, as the Intel SDM's
// pseudocode has it and as a probe measured on a family 6 model 167 Xeon (6 million random lanes,
// every exponent range, and hand-made edge cases, all equal to the chain below):
//   acc = acc + a[2i+1] b[2i+1];  then  acc = acc + a[2i] b[2i]
// the pair's odd element first, each step rounded once to nearest even (a fused multiply-add: the
// product of two bf16 values is exact, its exponent unbounded), a subnormal bf16 input or incoming
// acc read as zero, every step's subnormal result flushed to zero; MXCSR is neither read nor
// written. bf16_gemm's result is that chain, per output element: acc starts at +0 (at C's value
// when accumulating), then runs over k in pairs, 2p+1 then 2p, K padded with a zero to even, one
// chain per element whatever the tile, the thread or the level. The other paths compute the same
// chain with fma under MXCSR's flush-to-zero and denormals-are-zero bits; SSE2, which has no fma,
// adds the exact product in double and rounds to float once more, which is the single rounding
// (the double rounding of a sum of two 24-bit numbers in 53 bits is innocuous: Figueroa 1995), as
// the probe also measured. A NaN gives a NaN everywhere; its payload may differ between paths.
//
// Why AMX's TDPBF16PS is not a path: its arithmetic is another chain, which no packing maps onto
// this one. Measured on the same Xeon (2.5 million elements, tiles of 1 to 16 pairs, random bits
// over every exponent range; every non-NaN result as the SDM's pseudocode has it): per
// instruction and output element, the even elements' products run a chain of their own from +0,
// the odd elements' another, the two are added, and that sum is added to C: three roundings where
// this chain has one per product. C = 1 plus 2^-24 twice gives 1 here and 1 + 2^-23 there. Even a
// tile of one pair with one element of it zero (1/32 of the tile's work, no faster than the FMA
// chain) rounds the product on its own before adding C: a product under 2^-126 beside a normal C
// is flushed there, not here, and one over float's range is Inf there where C may cancel it here.
// Its speed (one thread, SmolLM2's training shapes): 230-640 GFLOP/s with operands packed, against
// 50-125 for the FMA chain. Using it means a new contract, the same at every level.

// The register tile: MR rows by `vectors` vectors of C, KC-deep slices of K (even, so that pairs
// never straddle two slices), blocks of MC rows of op(A).
constexpr std::size_t MR = 6, KC = 256, MC = 96;

static std::size_t round_up_even(std::size_t n) { return (n + 1) / 2 * 2; }

// The bf16 bits of x, subnormals flushed to a zero of x's sign: what the instruction reads.
static std::uint16_t bf16_operand(float x) {
  std::uint16_t bits = to_bf16_bits(x);
  return (bits & 0x7F80) == 0 ? std::uint16_t(bits & 0x8000) : bits;
}

// Sets MXCSR's flush-to-zero and denormals-are-zero bits on this thread while it lives.
class FlushSubnormals {
 public:
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | flush_to_zero | denormals_are_zero); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  static constexpr unsigned flush_to_zero = 0x8000, denormals_are_zero = 0x0040;
  unsigned saved_;
};

// One step of the chain, acc + x y rounded once (x y is exact).
template <class V>
static V chain_step(const V& acc, const V& x, const V& y) {
#ifdef __FMA__
  return fma(x, y, acc);
#else  // SSE2: no fma; four lanes as two pairs of doubles
  __m128 a = acc, p = x, q = y;
  __m128d low = _mm_add_pd(_mm_cvtps_pd(a), _mm_mul_pd(_mm_cvtps_pd(p), _mm_cvtps_pd(q)));
  __m128d high = _mm_add_pd(_mm_cvtps_pd(_mm_movehl_ps(a, a)),
                            _mm_mul_pd(_mm_cvtps_pd(_mm_movehl_ps(p, p)), _mm_cvtps_pd(_mm_movehl_ps(q, q))));
  return V(_mm_movelh_ps(_mm_cvtpd_ps(low), _mm_cvtpd_ps(high)));
#endif
}

// The portable path: panels of floats (the rounded values) with each pair of k swapped, so that
// the tile's plain k loop runs the chain's order.
struct ChainPath {
  using Element = float;
  using V = Batch<float>;
  static constexpr std::size_t vectors = V::size == 16 ? 4 : 2, NR = vectors * V::size;
  static std::size_t index(std::size_t k, std::size_t j, std::size_t width) { return (k ^ 1) * width + j; }
  static Element element(std::uint16_t bits) { return from_bf16_bits(bits); }

  // c (MR, NR) = (accumulate ? c : 0) + the chain over `rows` (even) k of the panels a (rows, MR)
  // and b (rows, NR).
  [[gnu::noinline]] static void tile(float* c, std::size_t ldc, const float* a, const float* b, std::size_t rows,
                                     bool accumulate) {
    constexpr std::size_t W = V::size;
    V acc[MR][vectors];
    for (std::size_t r = 0; r < MR; ++r)
      for (std::size_t v = 0; v < vectors; ++v) acc[r][v] = accumulate ? V::load_unaligned(c + r * ldc + v * W) : V(0.0f);
    for (std::size_t k = 0; k < rows; ++k) {
      V col[vectors];
      for (std::size_t v = 0; v < vectors; ++v) col[v] = V::load_aligned(b + k * NR + v * W);
      for (std::size_t r = 0; r < MR; ++r) {
        V x(a[k * MR + r]);
        for (std::size_t v = 0; v < vectors; ++v) acc[r][v] = chain_step(acc[r][v], x, col[v]);
      }
    }
    for (std::size_t r = 0; r < MR; ++r)
      for (std::size_t v = 0; v < vectors; ++v) acc[r][v].store_unaligned(c + r * ldc + v * W);
  }
};

#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
// The instruction's path (AVX-512 level, CPUs with AVX512_BF16 only): panels of bf16 bits, each
// pair of k in one 32-bit word, the layout VDPBF16PS reads.
struct InstructionPath {
  using Element = std::uint16_t;
  static constexpr std::size_t vectors = 4, NR = vectors * 16;
  static std::size_t index(std::size_t k, std::size_t j, std::size_t width) {
    return ((k >> 1) * width + j) * 2 + (k & 1);
  }
  static Element element(std::uint16_t bits) { return bits; }

  [[gnu::target("avx512bf16"), gnu::noinline]] static void tile(float* c, std::size_t ldc, const std::uint16_t* a,
                                                                 const std::uint16_t* b, std::size_t rows,
                                                                 bool accumulate) {
    __m512 acc[MR][vectors];
    for (std::size_t r = 0; r < MR; ++r)
      for (std::size_t v = 0; v < vectors; ++v)
        acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + v * 16) : _mm512_setzero_ps();
    for (std::size_t p = 0; p < rows / 2; ++p) {
      __m512i col[vectors];
      for (std::size_t v = 0; v < vectors; ++v) col[v] = _mm512_load_si512(b + (p * NR + v * 16) * 2);
      for (std::size_t r = 0; r < MR; ++r) {
        std::int32_t pair;
        std::memcpy(&pair, a + (p * MR + r) * 2, sizeof pair);
        __m512i x = _mm512_set1_epi32(pair);
        for (std::size_t v = 0; v < vectors; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)x, (__m512bh)col[v]);
      }
    }
    for (std::size_t r = 0; r < MR; ++r)
      for (std::size_t v = 0; v < vectors; ++v) _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
  }
};

static bool cpu_has_bf16_dot_products() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}

// Whether the instruction's tile outruns the FMA chain's on this CPU. It does twice the arithmetic
// per instruction, but on the Xeon this was written on (family 6 model 167, virtualized) it
// retired one VDPBF16PS every 4 cycles against one 16-lane FMA per cycle, so the chain was twice
// as fast. The two give the same bits, so the choice is timed, once: each tile on one panel
// (K = 256, about 2 us), the best of 15 runs each, alternated.
static bool instruction_outruns_chain() {
  constexpr std::size_t rows = 256;
  static_assert(ChainPath::NR == InstructionPath::NR, "both tiles cover the same columns at AVX-512");
  AlignedVector<std::uint16_t> a_bits(rows * MR, 0x3F80), b_bits(rows * InstructionPath::NR, 0x3F80);
  AlignedVector<float> a_floats(rows * MR, 1.0f), b_floats(rows * ChainPath::NR, 1.0f);
  alignas(64) float c[MR * InstructionPath::NR];
  auto seconds = [](auto tile) {
    auto start = std::chrono::steady_clock::now();
    tile();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double instruction = 1e9, chain = 1e9;
  for (int run = 0; run < 15; ++run) {
    instruction = std::min(instruction, seconds([&] {
      InstructionPath::tile(c, InstructionPath::NR, a_bits.data(), b_bits.data(), rows, false);
    }));
    chain = std::min(chain, seconds([&] { ChainPath::tile(c, ChainPath::NR, a_floats.data(), b_floats.data(), rows, false); }));
  }
  return instruction < chain;
}
#endif

// Writes the operand bits of X(k0 + k, j0 + j), X(k, j) = trans ? X[j * ld + k] : X[k * ld + j],
// for k < kc and j < cols into a panel of `width` columns and round_up_even(kc) rows in Path's
// layout, zeros everywhere else.
template <class Path>
static void pack_panel(typename Path::Element* panel, std::size_t width, const float* X, bool trans, std::size_t ld,
                       std::size_t k0, std::size_t kc, std::size_t j0, std::size_t cols) {
  using Element = typename Path::Element;
  std::fill(panel, panel + round_up_even(kc) * width, Element(0));
  if (trans) {  // the source's rows run along k: per 16 k, each column's rounded (a loop that
    // vectorizes), then written a panel row at a time (the panel, 64 KiB at AVX-512, is written
    // along its rows, not down its columns)
    constexpr std::size_t depth = 16, widest = 64;
    static_assert(Path::NR <= widest && MR <= widest, "a panel is at most `widest` columns wide");
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

// The BLIS loop order of packed_gemm (core/kernels/matmul.cpp): per KC slice, op(B) packed into
// panels of NR columns; per block of MC rows, op(A) packed into panels of MR rows; the tile runs
// one panel of each. Partial tiles run on a copy of C's corner, so that every element gets the
// same chain.
template <class Path>
static void bf16_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
                         std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C,
                         std::size_t ldc) {
  using Element = typename Path::Element;
  constexpr std::size_t NR = Path::NR;
  if (K == 0) {
    if (!accumulate)
      for (std::size_t i = 0; i < M; ++i) std::fill_n(C + i * ldc, N, 0.0f);
    return;
  }
  const std::size_t panels = (N + NR - 1) / NR;
  thread_local AlignedVector<Element> b_pack, a_pack;
  b_pack.resize(panels * KC * NR);
  a_pack.resize((MC + MR) * KC);
  alignas(64) float edge[MR * NR];
  for (std::size_t p0 = 0; p0 < K; p0 += KC) {
    const std::size_t kc = std::min(KC, K - p0), rows = round_up_even(kc);
    const bool continues = p0 > 0 || accumulate;
    for (std::size_t jp = 0; jp < panels; ++jp)
      pack_panel<Path>(b_pack.data() + jp * rows * NR, NR, B, transpose_b, ldb, p0, kc, jp * NR,
                       std::min(NR, N - jp * NR));
    for (std::size_t i0 = 0; i0 < M; i0 += MC) {
      const std::size_t i1 = std::min(M, i0 + MC);
      for (std::size_t r0 = i0; r0 < i1; r0 += MR)  // op(A)^T(k, r) = op(A)(r, k)
        pack_panel<Path>(a_pack.data() + (r0 - i0) * rows, MR, A, !transpose_a, lda, p0, kc, r0, std::min(MR, i1 - r0));
      for (std::size_t jp = 0; jp < panels; ++jp) {
        const Element* b_panel = b_pack.data() + jp * rows * NR;
        const std::size_t j0 = jp * NR, cols = std::min(NR, N - j0);
        for (std::size_t r0 = i0; r0 < i1; r0 += MR) {
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

// bf16_product over the kernel threads, each on its block of C.
template <class Path>
static void split_bf16_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K,
                               const float* A, std::size_t lda, const float* B, std::size_t ldb, bool accumulate,
                               float* C, std::size_t ldc) {
  if (M == 0 || N == 0) return;
  detail::split_product(M, N, K, [&](std::size_t m0, std::size_t m, std::size_t n0, std::size_t n) {
    FlushSubnormals flush;  // MXCSR is per thread; the instruction ignores it
    bf16_product<Path>(transpose_a, transpose_b, m, n, K, A + (transpose_a ? m0 : m0 * lda), lda,
                       B + (transpose_b ? n0 * ldb : n0), ldb, accumulate, C + m0 * ldc + n0, ldc);
  });
}

template <class T>
void bf16_gemm_path(bool instruction, bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K,
                    const float* A, std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C,
                    std::size_t ldc) {
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
  static const bool has_instruction = cpu_has_bf16_dot_products();
  if (instruction && has_instruction)
    return split_bf16_product<InstructionPath>(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
#endif
  (void)instruction;
  split_bf16_product<ChainPath>(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}
TAPEGRAD_INSTANTIATE_KERNEL(bf16_gemm_path)

template <class T>
void bf16_gemm(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
               std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C, std::size_t ldc) {
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
  static const bool instruction = cpu_has_bf16_dot_products() && instruction_outruns_chain();
#else
  constexpr bool instruction = false;
#endif
  bf16_gemm_path<T>(instruction, transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}
TAPEGRAD_INSTANTIATE_KERNEL(bf16_gemm)

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
