// bf16_gemm's AMX path (Note [bf16 products], core/kernels/matmul_bf16.cpp): TDPBF16PS on tiles
// of packed operands, one instruction per 32-element block of K, C held in the tile registers over
// K. Compiled for real at the AVX-512 level only, with AMX enabled on its functions alone.
#include "core/kernels/matmul_bf16.h"

#if TAPEGRAD_BF16_AMX
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "core/aligned.h"
#include "core/kernels/register_transpose.h"
#endif

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

#if TAPEGRAD_BF16_AMX

namespace {

// A tile: 16 rows of 64 bytes. op(A)'s tile: 16 rows by one block of 32 k; op(B)'s: 16 pairs of k
// (a block) by 16 columns, each pair in one 32-bit word, the even k in the low half; C's: 16 by
// 16 floats. The kernel runs 2 x 2 tiles of C, 32 rows by 32 columns.
constexpr std::size_t tile_rows = 16, block = 32, tile_elements = tile_rows * block, span = 2 * tile_rows;
// Columns of op(B) packed at a time: K x 256 bf16 stays in L2 while every row block passes.
constexpr std::size_t column_block = 256;
// Blocks of k in a slab: 256 columns x 2,048 k of bf16 (1 MiB) stay in L2 (the head's dx = g W
// has K = 49,152).
constexpr std::size_t slab_blocks = 64;

bool cpu_has_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (!amx_bf16 || !amx_tile || !__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;  // OSXSAVE
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  return ((xcr0_low >> 17) & 3) == 3;  // the OS saves XTILECFG and XTILEDATA
}

// Linux hands the tile registers' 8 KiB of state to a process that asks (a thread that executes
// an AMX instruction without it dies of SIGILL). The permission is the whole process's.
bool request_tile_state() {
  constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
  return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
}

// LDTILECFG's 64-byte operand (palette 1).
struct TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Tiles 0-3: C (rows i, columns j: tile 2i + j); 4, 5: op(A)'s two row tiles; 6, 7: op(B)'s two
// column tiles. All 16 rows of 64 bytes. A static object: GCC 12's _tile_loadconfig tells the
// compiler it reads 8 bytes, so the stores to a local one could be dropped.
[[gnu::target("amx-tile")]] void configure_tiles() {
  alignas(64) static const TileConfig config = [] {
    TileConfig tiles;
    for (int t = 0; t < 8; ++t) tiles.bytes_per_row[t] = 64, tiles.rows[t] = tile_rows;
    return tiles;
  }();
  _tile_loadconfig(&config);
}

[[gnu::target("amx-tile")]] void release_tiles() { _tile_release(); }

// c (32, 32 floats, rows ldc apart) = (c when accumulating, else +0) + the contract over `blocks`
// blocks of the packed op(A) row tiles a0, a1 and op(B) column tiles b0, b1 (each tile_elements
// per block).
[[gnu::target("amx-tile,amx-bf16")]] void run_tiles(float* c, std::size_t ldc, bool accumulate, const std::uint16_t* a0,
                                                     const std::uint16_t* a1, const std::uint16_t* b0,
                                                     const std::uint16_t* b1, std::size_t blocks) {
  const std::size_t stride = ldc * sizeof(float), half = tile_rows;
  if (accumulate) {
    _tile_loadd(0, c, stride);
    _tile_loadd(1, c + half, stride);
    _tile_loadd(2, c + half * ldc, stride);
    _tile_loadd(3, c + half * ldc + half, stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (std::size_t kb = 0; kb < blocks; ++kb) {
    const std::size_t offset = kb * tile_elements;
    _tile_loadd(4, a0 + offset, 64);
    _tile_loadd(5, a1 + offset, 64);
    _tile_loadd(6, b0 + offset, 64);
    _tile_loadd(7, b1 + offset, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, stride);
  _tile_stored(1, c + half, stride);
  _tile_stored(2, c + half * ldc, stride);
  _tile_stored(3, c + half * ldc + half, stride);
}

// Writes the bf16 operands of count (0..32) floats from x, zeros past them, to out[0..32).
void store_operands(std::uint16_t* out, const float* x, std::size_t count) {
  const std::size_t low = std::min<std::size_t>(count, 16), high = count - low;
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(operand_lanes(x, low)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm512_cvtepi32_epi16(operand_lanes(x + low, high)));
}

// Stores the 16 x 16 32-bit words of `words` transposed: word i of out's row j (16 words a row)
// is word j of words[i].
void store_transposed(std::uint16_t* out, const __m512i words[16]) {
  __m512i rows[16];
  std::copy_n(words, 16, rows);
  transpose_16x16(rows);
  for (std::size_t j = 0; j < 16; ++j) _mm512_storeu_si512(reinterpret_cast<__m512i*>(out) + j, rows[j]);
}

// op(A) (M, K) into row tiles: tile (r / 16, k / 32) at (r / 16 * blocks + k / 32) tile_elements,
// element (r % 16) * 32 + k % 32; rows up to a multiple of 32 and K up to whole blocks are zeros.
void pack_rows(std::uint16_t* packed, const float* A, bool transpose_a, std::size_t lda, std::size_t M,
               std::size_t K, std::size_t blocks) {
  const std::size_t rows = (M + span - 1) / span * span;
  // every tile row of a row of A is written below (zeros past K included): only padding rows need zeros
  if (rows != M) std::fill(packed, packed + rows * blocks * block, std::uint16_t(0));
  auto tile = [&](std::size_t r, std::size_t kb) { return packed + (r / tile_rows * blocks + kb) * tile_elements; };
  if (!transpose_a) {  // a row's block of k is a tile row
    for (std::size_t r = 0; r < M; ++r)
      for (std::size_t kb = 0; kb < blocks; ++kb)
        store_operands(tile(r, kb) + r % tile_rows * block, A + r * lda + kb * block, std::min(block, K - kb * block));
    return;
  }
  // A (K, M): per block of k and 16 rows, each pair of A's rows k, k + 1 makes one word per row
  // (read along A's rows), and the 16 x 16 words are transposed into the tile
  for (std::size_t kb = 0; kb < blocks; ++kb) {
    const std::size_t depth = std::min(block, K - kb * block);
    for (std::size_t r0 = 0; r0 < M; r0 += tile_rows) {
      const std::size_t count = std::min(tile_rows, M - r0);
      __m512i words[tile_rows];
      for (std::size_t p = 0; p < tile_rows; ++p) {
        const std::size_t k = kb * block + 2 * p;
        const __m512i even = 2 * p < depth ? operand_lanes(A + k * lda + r0, count) : _mm512_setzero_si512();
        const __m512i odd = 2 * p + 1 < depth ? operand_lanes(A + (k + 1) * lda + r0, count) : _mm512_setzero_si512();
        words[p] = _mm512_or_si512(even, _mm512_slli_epi32(odd, 16));
      }
      store_transposed(tile(r0, kb), words);
    }
  }
}

// op(B) (K, columns j0 .. j0 + cols) into column tiles: tile (j / 16, k / 32) at
// (j / 16 * blocks + k / 32) tile_elements, row k % 32 / 2 of 16 words, word j % 16 holding k's
// pair (the even k in the low half); columns up to a multiple of 32 and K up to whole blocks are
// zeros.
void pack_columns(std::uint16_t* packed, const float* B, bool transpose_b, std::size_t ldb, std::size_t K,
                  std::size_t j0, std::size_t cols, std::size_t blocks) {
  const std::size_t width = (cols + span - 1) / span * span;
  // the words below cover whole blocks of k and columns up to width when neither is ragged
  if (width != cols || K % block != 0) std::fill(packed, packed + width * blocks * block, std::uint16_t(0));
  auto tile = [&](std::size_t j, std::size_t kb) { return packed + (j / tile_rows * blocks + kb) * tile_elements; };
  if (!transpose_b) {  // B (K, N): two rows of B, 16 columns, make one tile row of pairs
    // B's rows are read in short runs (cols floats) far apart: each run is asked for 8 rows ahead
    constexpr std::size_t ahead = 8;
    for (std::size_t k = 0; k < K; k += 2)
      for (std::size_t j = 0; j < cols; j += tile_rows) {
        const std::size_t count = std::min(tile_rows, cols - j);
        if (k + ahead + 1 < K) {
          _mm_prefetch(reinterpret_cast<const char*>(B + (k + ahead) * ldb + j0 + j), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(B + (k + ahead + 1) * ldb + j0 + j), _MM_HINT_T0);
        }
        const __m512i even = operand_lanes(B + k * ldb + j0 + j, count);
        const __m512i odd = k + 1 < K ? operand_lanes(B + (k + 1) * ldb + j0 + j, count) : _mm512_setzero_si512();
        _mm512_storeu_si512(tile(j, k / block) + k % block / 2 * block, _mm512_or_si512(even, _mm512_slli_epi32(odd, 16)));
      }
    return;
  }
  // B (N, K): a column's block of k is 16 pairs in a row of B; 16 columns' words transposed into the tile
  for (std::size_t j = 0; j < cols; j += tile_rows) {
    const std::size_t count = std::min(tile_rows, cols - j);
    for (std::size_t kb = 0; kb < blocks; ++kb) {
      const std::size_t depth = std::min(block, K - kb * block), low = std::min(depth, tile_rows);
      __m512i words[tile_rows];
      for (std::size_t n = 0; n < tile_rows; ++n) {
        if (n >= count) {
          words[n] = _mm512_setzero_si512();
          continue;
        }
        const float* x = B + (j0 + j + n) * ldb + kb * block;
        words[n] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(operand_lanes(x, low))),
                                      _mm512_cvtepi32_epi16(operand_lanes(x + low, depth - low)), 1);
      }
      store_transposed(tile(j, kb), words);
    }
  }
}

}  // namespace

bool amx_tiles_usable() {
  static const bool usable = cpu_has_amx_bf16() && request_tile_state();
  return usable;
}

std::size_t amx_packed_columns_size(std::size_t K, std::size_t N) {
  return (N + span - 1) / span * span * ((K + block - 1) / block * block);
}

void amx_pack_columns(std::uint16_t* packed, const float* B, bool transpose_b, std::size_t ldb, std::size_t K,
                      std::size_t N) {
  pack_columns(packed, B, transpose_b, ldb, K, 0, N, (K + block - 1) / block);
}

// op(A) packed once per call, op(B) per block of columns (unless packed_b holds it); each 32 x 32
// block of C runs over a slab of K in the tile registers, from C or from +0; a partial block runs
// on a copy of C's corner.
void amx_bf16_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
                      std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C, std::size_t ldc,
                      const std::uint16_t* packed_b, std::size_t packed_j0) {
  const std::size_t blocks = (K + block - 1) / block, rows = (M + span - 1) / span * span;
  thread_local AlignedVector<std::uint16_t> a_pack, b_pack;
  grow_to(a_pack, rows * blocks * block);
  if (!packed_b) grow_to(b_pack, column_block * blocks * block);
  pack_rows(a_pack.data(), A, transpose_a, lda, M, K, blocks);
  alignas(64) float edge[span * span];
  configure_tiles();
  for (std::size_t j0 = 0; j0 < N; j0 += column_block) {
    const std::size_t cols = std::min(column_block, N - j0);
    // the column tiles of C's columns j0 .. j0 + cols (the packed layout puts column j's tiles at j / 16)
    const std::uint16_t* b_tiles = packed_b ? packed_b + (packed_j0 + j0) / tile_rows * blocks * tile_elements : b_pack.data();
    if (!packed_b) pack_columns(b_pack.data(), B, transpose_b, ldb, K, j0, cols, blocks);
    // K in slabs whose column tiles stay in L2 while every row block passes; C carries the sum
    // from one slab to the next exactly (a float stored and loaded), so slabs change no bit
    for (std::size_t kb0 = 0; kb0 < blocks; kb0 += slab_blocks) {
      const std::size_t slab = std::min(slab_blocks, blocks - kb0);
      const bool continues = accumulate || kb0 > 0;
      for (std::size_t i0 = 0; i0 < M; i0 += span) {
        const std::size_t block_rows = std::min(span, M - i0);
        const std::uint16_t* a0 = a_pack.data() + (i0 / tile_rows * blocks + kb0) * tile_elements;
        for (std::size_t jj = 0; jj < cols; jj += span) {
          const std::size_t block_cols = std::min(span, cols - jj);
          float* c = C + i0 * ldc + j0 + jj;
          const std::uint16_t* b0 = b_tiles + (jj / tile_rows * blocks + kb0) * tile_elements;
          const std::uint16_t* a1 = a0 + blocks * tile_elements;
          const std::uint16_t* b1 = b0 + blocks * tile_elements;
          if (block_rows == span && block_cols == span) {
            run_tiles(c, ldc, continues, a0, a1, b0, b1, slab);
            continue;
          }
          if (continues)
            for (std::size_t r = 0; r < block_rows; ++r) std::copy_n(c + r * ldc, block_cols, edge + r * span);
          run_tiles(edge, span, continues, a0, a1, b0, b1, slab);
          for (std::size_t r = 0; r < block_rows; ++r) std::copy_n(edge + r * span, block_cols, c + r * ldc);
        }
      }
    }
  }
  release_tiles();
}

#endif  // TAPEGRAD_BF16_AMX

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
