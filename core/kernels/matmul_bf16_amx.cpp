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

// c (32, 32 floats, rows 128 bytes apart) += the contract over `blocks` blocks of the packed
// op(A) row tiles a0, a1 and op(B) column tiles b0, b1 (each tile_elements per block).
[[gnu::target("amx-tile,amx-bf16")]] void run_tiles(float* c, const std::uint16_t* a0, const std::uint16_t* a1,
                                                     const std::uint16_t* b0, const std::uint16_t* b1,
                                                     std::size_t blocks) {
  constexpr std::size_t stride = span * sizeof(float), half = tile_rows;
  _tile_loadd(0, c, stride);
  _tile_loadd(1, c + half, stride);
  _tile_loadd(2, c + half * span, stride);
  _tile_loadd(3, c + half * span + half, stride);
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
  _tile_stored(2, c + half * span, stride);
  _tile_stored(3, c + half * span + half, stride);
}

// op(A) (M, K) into row tiles: tile (r / 16, k / 32) at (r / 16 * blocks + k / 32) tile_elements,
// element (r % 16) * 32 + k % 32; rows up to a multiple of 32 and K up to whole blocks are zeros.
void pack_rows(std::uint16_t* packed, const float* A, bool transpose_a, std::size_t lda, std::size_t M,
               std::size_t K, std::size_t blocks) {
  const std::size_t rows = (M + span - 1) / span * span;
  std::fill(packed, packed + rows * blocks * block, std::uint16_t(0));
  auto at = [&](std::size_t r, std::size_t k) -> std::uint16_t& {
    return packed[(r / tile_rows * blocks + k / block) * tile_elements + r % tile_rows * block + k % block];
  };
  if (transpose_a) {  // A (K, M): read along rows of A
    for (std::size_t k = 0; k < K; ++k)
      for (std::size_t r = 0; r < M; ++r) at(r, k) = bf16_operand(A[k * lda + r]);
  } else {
    for (std::size_t r = 0; r < M; ++r)
      for (std::size_t k = 0; k < K; ++k) at(r, k) = bf16_operand(A[r * lda + k]);
  }
}

// op(B) (K, columns j0 .. j0 + cols) into column tiles: tile (j / 16, k / 32) at
// (j / 16 * blocks + k / 32) tile_elements, element (k % 32 / 2) * 32 + (j % 16) * 2 + k % 2;
// columns up to a multiple of 32 and K up to whole blocks are zeros.
void pack_columns(std::uint16_t* packed, const float* B, bool transpose_b, std::size_t ldb, std::size_t K,
                  std::size_t j0, std::size_t cols, std::size_t blocks) {
  const std::size_t width = (cols + span - 1) / span * span;
  std::fill(packed, packed + width * blocks * block, std::uint16_t(0));
  auto at = [&](std::size_t k, std::size_t j) -> std::uint16_t& {
    return packed[(j / tile_rows * blocks + k / block) * tile_elements + k % block / 2 * block + j % tile_rows * 2 +
                  k % 2];
  };
  if (transpose_b) {  // B (N, K): read along rows of B
    for (std::size_t j = 0; j < cols; ++j)
      for (std::size_t k = 0; k < K; ++k) at(k, j) = bf16_operand(B[(j0 + j) * ldb + k]);
  } else {
    for (std::size_t k = 0; k < K; ++k)
      for (std::size_t j = 0; j < cols; ++j) at(k, j) = bf16_operand(B[k * ldb + j0 + j]);
  }
}

}  // namespace

bool amx_tiles_usable() {
  static const bool usable = cpu_has_amx_bf16() && request_tile_state();
  return usable;
}

// op(A) packed once per call, op(B) per block of columns; each 32 x 32 block of C is staged in a
// buffer (zeros when not accumulating: the tiles start at +0), run over the whole of K, written
// back.
void amx_bf16_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
                      std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C, std::size_t ldc) {
  const std::size_t blocks = (K + block - 1) / block, rows = (M + span - 1) / span * span;
  thread_local AlignedVector<std::uint16_t> a_pack, b_pack;
  a_pack.resize(rows * blocks * block);
  b_pack.resize(column_block * blocks * block);
  pack_rows(a_pack.data(), A, transpose_a, lda, M, K, blocks);
  alignas(64) float stage[span * span];
  configure_tiles();
  for (std::size_t j0 = 0; j0 < N; j0 += column_block) {
    const std::size_t cols = std::min(column_block, N - j0);
    pack_columns(b_pack.data(), B, transpose_b, ldb, K, j0, cols, blocks);
    for (std::size_t i0 = 0; i0 < M; i0 += span) {
      const std::size_t block_rows = std::min(span, M - i0);
      const std::uint16_t* a0 = a_pack.data() + i0 / tile_rows * blocks * tile_elements;
      for (std::size_t jj = 0; jj < cols; jj += span) {
        const std::size_t block_cols = std::min(span, cols - jj);
        float* c = C + i0 * ldc + j0 + jj;
        std::fill_n(stage, span * span, 0.0f);
        if (accumulate)
          for (std::size_t r = 0; r < block_rows; ++r) std::copy_n(c + r * ldc, block_cols, stage + r * span);
        const std::uint16_t* b0 = b_pack.data() + jj / tile_rows * blocks * tile_elements;
        run_tiles(stage, a0, a0 + blocks * tile_elements, b0, b0 + blocks * tile_elements, blocks);
        for (std::size_t r = 0; r < block_rows; ++r) std::copy_n(stage + r * span, block_cols, c + r * ldc);
      }
    }
  }
  release_tiles();
}

#endif  // TAPEGRAD_BF16_AMX

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
