// gemm: cblas (row-major, transpose flags, beta = 1 to accumulate gradients) or this level's own
// packed, register-blocked kernel (packed_gemm), whichever measured faster for the CPU and shape;
// register-blocked row loops for one or two rows. Large products are split across
// OpenMP threads by output rows or columns; each output element is computed by one thread in a
// fixed order, so results do not depend on the thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/aligned.h"
#include "core/blas_core.h"
#include "core/kernels/level.h"
#include "core/kernels/register_transpose.h"


namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

static void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float* A,
                      int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
static void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha, const double* A,
                      int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// A few rows of C (decoding one token): OpenBLAS would pack the whole of B on every call, which
// measured as a third of the decoding time, so these go through register-blocked row loops.
template <class T>
static void small_gemm(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, T alpha,
                       const T* A, std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  for (std::size_t i = 0; i < M; ++i) {
    T* c = C + i * ldc;
    if (beta != T(0) && beta != T(1))
      for (std::size_t n = 0; n < N; ++n) c[n] *= beta;
    const T* a = transpose_a ? A + i : A + i * lda;
    std::size_t a_stride = transpose_a ? lda : 1;
    if (!transpose_b) {
      detail::row_times_matrix<Batch<T>>(c, a, a_stride, B, ldb, K, N, alpha, beta != T(0));
      continue;
    }
    // Every output one way: W rows of B at a time when K is a multiple of W, else each by dot.
    if (!transpose_a && detail::dots_with_rows<Batch<T>>(c, a, B, ldb, K, N, alpha, beta != T(0)) == N) continue;
    for (std::size_t n = 0; n < N; ++n) {  // c[n] = a . row n of B
      T sum = transpose_a ? T(0) : detail::dot<Batch<T>>(a, B + n * ldb, K);
      if (transpose_a)
        for (std::size_t k = 0; k < K; ++k) sum += a[k * a_stride] * B[n * ldb + k];
      c[n] = alpha * sum + (beta != T(0) ? c[n] : T(0));
    }
  }
}

// panel[k * NR + j] = B[(j0 + j) * ldb + p0 + k] for k < kc, j < cols: op(B) = B^T's panel, in blocks
// transposed in registers (transpose_floats) where whole.
template <class T>
static void pack_transposed(T* panel, std::size_t NR, const T* B, std::size_t ldb, std::size_t j0, std::size_t p0,
                            std::size_t kc, std::size_t cols) {
  constexpr std::size_t n = std::is_same_v<T, float> ? transpose_block : 0;
  std::size_t j = 0;
  if constexpr (n > 0)
    for (; j + n <= cols; j += n) {
      const T* rows = B + (j0 + j) * ldb + p0;
      std::size_t k = 0;
      for (; k + n <= kc; k += n) transpose_floats(rows + k, ldb, panel + k * NR + j, NR);
      for (; k < kc; ++k)
        for (std::size_t r = 0; r < n; ++r) panel[k * NR + j + r] = rows[r * ldb + k];
    }
  for (; j < cols; ++j) {
    const T* row = B + (j0 + j) * ldb + p0;
    for (std::size_t k = 0; k < kc; ++k) panel[k * NR + j] = row[k];
  }
}

// packed_product's register tile and blocking, per vector size in bytes: MR rows by `vectors`
// vectors of C held in registers, KC-deep slices of k (one KC x NR panel of B is reused by every
// tile of a block), and blocks of MC rows (their KC-long slices stay in L2). Each entry is a
// choice that `bench_kernels --threads 1 --only matmul` on a machine of that width settles.
template <std::size_t Bytes> struct PackedTiling;
template <> struct PackedTiling<16> {  // SSE2, 16 registers: AVX2's tile, not measured on its own
  static constexpr std::size_t MR = 6, vectors = 2, KC = 256, MC = 96, NC = 256, l1_ahead = 0, L2_floats = 0;
};
template <> struct PackedTiling<32> {  // AVX2, 16 registers: 12 accumulators, a 16 KB panel (Zen 3)
  static constexpr std::size_t MR = 6, vectors = 2, KC = 256, MC = 96, NC = 256, l1_ahead = 0, L2_floats = 0;
};
// AVX-512, 32 registers: 24 accumulators (6 x 4 beat 14 x 2, 12 x 2 and 8 x 3 on an Emerald Rapids
// core), and slices 1024 deep: a 1024 x 64 panel streams from L2 as fast as a 128-deep one stays in
// L1, and the tiles pass over C once for K up to 1024 instead of once per 128, where C outgrows
// L2 and comes back from L3 at each slice (docs/benchmarks.md, "Measurements behind choices in
// the code"). The panel's rows are asked into L1 (tile_block's l1_ahead) 8 rows ahead: SmolLM2's
// float32 fine-tuning step 1.02-1.03x as fast at 1 and 2 threads of a Xeon of family 6 model 167.
// L2_floats: op(B)'s packed slice kept within 1.5 MB (packed_gemm's parts), measured on that
// Xeon's 2 MB L2 (a Zen 4's is 1 MB: not measured there).
template <> struct PackedTiling<64> {
  static constexpr std::size_t MR = 6, vectors = 4, KC = 1024, MC = 96, NC = 512, l1_ahead = 8, L2_floats = 3 << 17;
};

// The MR x NR tile, as a function of its own: inlined into packed_product, GCC 12 at AVX-512 spilled
// the 24 accumulators of the hot copy to the stack (29 of 32 registers live), and the products ran
// at a third of the FMA peak.
template <class V, std::size_t MR, std::size_t vectors>
[[gnu::noinline]] static void microkernel(typename V::value_type* c, std::size_t ldc, const typename V::value_type* a,
                                          std::size_t row_step, std::size_t col_step, const typename V::value_type* b,
                                          std::size_t ldb, std::size_t K, typename V::value_type alpha, bool accumulate) {
  constexpr std::size_t l1_ahead = PackedTiling<sizeof(V)>::l1_ahead;
  detail::tile_block<V, MR, vectors, l1_ahead>(c, ldc, a, row_step, col_step, b, ldb, K, alpha, accumulate);
}

// to[0:n] = from[0:n], n < V::size: one masked load and store at AVX-512 (where a masked store is a
// single instruction), n scalar copies elsewhere.
template <class V, std::size_t n>
static void copy_panel_row(const typename V::value_type* from, typename V::value_type* to) {
  if constexpr (sizeof(V) == 64 && n < V::size)
    detail::store_partial(detail::load_partial<V>(from, n), to, n);
  else
    for (std::size_t r = 0; r < n; ++r) to[r] = from[r];
}

// The BLIS loop order. For each KC-deep slice of K, op(B)'s slice is packed into panels of NR
// columns (KC x NR, contiguous, zero-padded past N: this absorbs B's transpose and N's tail); then,
// per block of MC rows, the MR x NR microkernel (tile_block) multiplies MR rows of op(A) by one
// panel with its accumulators in registers: a B panel stays in L1 while the rows of the block come
// from L2. Rows of A are read in place; A^T and the partial last MR rows are packed first. Every
// element of C gets one FMA chain per slice, in k order, then alpha, then the add: the same
// arithmetic in every tile, edges included.
template <class T>
static void packed_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, T alpha,
                           const T* A, std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  using V = Batch<T>;
  using Tiling = PackedTiling<sizeof(V)>;
  constexpr std::size_t W = V::size, vectors = Tiling::vectors;
  constexpr std::size_t MR = Tiling::MR, NR = vectors * W, MC = Tiling::MC;
  constexpr std::size_t KC = Tiling::KC;
  if ((beta != T(0) && beta != T(1)) || (beta == T(0) && K == 0))
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
  const std::size_t panels = (N + NR - 1) / NR;
  thread_local AlignedVector<T> b_pack, a_pack;  // on cache lines: the tile loads whole vectors
  grow_to(b_pack, panels * std::min(KC, K) * NR);
  grow_to(a_pack, (MC + MR) * std::min(KC, K));
  alignas(64) T edge[MR * NR];
  for (std::size_t p0 = 0; p0 < K; p0 += KC) {
    const std::size_t kc = std::min(KC, K - p0);
    const bool accumulate = p0 > 0 || beta != T(0);
    for (std::size_t jp = 0; jp < panels; ++jp) {
      T* panel = b_pack.data() + jp * kc * NR;
      const std::size_t j0 = jp * NR, cols = std::min(NR, N - j0);
      if (cols < NR)
        for (std::size_t k = 0; k < kc; ++k) std::fill(panel + k * NR + cols, panel + (k + 1) * NR, T(0));
      if (transpose_b) {  // op(B)(k, j) = B[j * ldb + k]: read B's rows, write the panel's columns
        pack_transposed(panel, NR, B, ldb, j0, p0, kc, cols);
      } else if (cols == NR) {  // a fixed trip count: vector copies, not a memmove per row
        for (std::size_t k = 0; k < kc; ++k)
          for (std::size_t j = 0; j < NR; ++j) panel[k * NR + j] = B[(p0 + k) * ldb + j0 + j];
      } else {
        for (std::size_t k = 0; k < kc; ++k) std::copy_n(B + (p0 + k) * ldb + j0, cols, panel + k * NR);
      }
    }
    for (std::size_t i0 = 0; i0 < M; i0 += MC) {
      const std::size_t i1 = std::min(M, i0 + MC), whole_end = i0 + (i1 - i0) / MR * MR;
      // Panels of 6 rows (kc x 6): all of them when op(A) = A^T, whose rows are columns in memory;
      // only the partial last one otherwise. A^T's whole panels row by row of A: each of its rows
      // read once for the block, 6 floats a panel.
      if (transpose_a)
        for (std::size_t k = 0; k < kc; ++k) {
          const T* row = A + (p0 + k) * lda;
          for (std::size_t r0 = i0; r0 < whole_end; r0 += MR)
            copy_panel_row<V, MR>(row + r0, a_pack.data() + (r0 - i0) * kc + k * MR);
        }
      for (std::size_t r0 = whole_end; r0 < i1; r0 += MR) {
        T* panel = a_pack.data() + (r0 - i0) * kc;
        const std::size_t rows = i1 - r0;
        for (std::size_t k = 0; k < kc; ++k)
          for (std::size_t r = 0; r < MR; ++r)
            panel[k * MR + r] = r >= rows ? T(0) : transpose_a ? A[(p0 + k) * lda + r0 + r] : A[(r0 + r) * lda + p0 + k];
      }
      for (std::size_t jp = 0; jp < panels; ++jp) {
        const T* b_panel = b_pack.data() + jp * kc * NR;
        const std::size_t j0 = jp * NR, cols = std::min(NR, N - j0);
        auto tile = [&](std::size_t r0, std::size_t rows, const T* a, std::size_t row_step, std::size_t col_step) {
          T* c = C + r0 * ldc + j0;
          // C's lines are fetched while the FMAs run: a tile's first touch of C (its rows not in
          // cache since the last slice) otherwise stalls its stores. On products with 1024-wide
          // operands, packed_gemm went from 0.83-0.89 of OpenBLAS's speed to 0.94-0.99 (AVX2).
          // Every line of the tile's rows: a 16-lane tile's row is four cache lines.
          constexpr std::size_t line = 64 / sizeof(T);
          for (std::size_t r = 0; r < rows; ++r) {
            for (std::size_t j = 0; j < cols; j += line) __builtin_prefetch(c + r * ldc + j, 1);
            __builtin_prefetch(c + r * ldc + cols - 1, 1);
          }
          if (rows == MR && cols == NR)
            return microkernel<V, MR, vectors>(c, ldc, a, row_step, col_step, b_panel, NR, kc, alpha, accumulate);
          microkernel<V, MR, vectors>(edge, NR, a, row_step, col_step, b_panel, NR, kc, alpha, false);
          for (std::size_t r = 0; r < rows; ++r)
            for (std::size_t j = 0; j < cols; ++j)
              c[r * ldc + j] = accumulate ? edge[r * NR + j] + c[r * ldc + j] : edge[r * NR + j];
        };
        for (std::size_t r0 = i0; r0 < whole_end; r0 += MR) {
          if (transpose_a) tile(r0, MR, a_pack.data() + (r0 - i0) * kc, 1, MR);
          else tile(r0, MR, A + r0 * lda + p0, lda, 1);
        }
        if (whole_end < i1) tile(whole_end, i1 - whole_end, a_pack.data() + (whole_end - i0) * kc, 1, MR);
      }
    }
  }
}

// Where row `first` of op(A) starts (column `first` of A when transposed), and column `first` of
// op(B).
template <class T>
static const T* row_block(const T* A, bool trans, std::size_t first, std::size_t ld) {
  return A + (trans ? first : first * ld);
}
template <class T>
static const T* column_block(const T* B, bool trans, std::size_t first, std::size_t ld) {
  return B + (trans ? first * ld : first);
}

// Which kernel gemm runs: the packed kernel for every shape when OpenBLAS's kernels do not match
// this level (core/blas_core.h: narrower than the level, or older than the CPU), and for every
// float product at AVX-512 (one thread of an Intel Xeon of family 6 model 167: SmolLM2's
// fine-tuning step 1.01-1.02x and the seed model's configs c and d 1.05-1.08x as fast as with
// OpenBLAS's SkylakeX kernels beside 128-deep slices; a Zen 4's SmolLM2 products 1.00-1.10x
// OpenBLAS's Cooperlake kernels). Otherwise where it measured faster than OpenBLAS on an AVX2
// core (bench_kernels' packed_gemm and cblas_sgemm rows, A not transposed): outputs of at most 128
// columns, and fresh outputs (beta 0, which OpenBLAS first zeroes in a pass of its own) with K <=
// 256: 0.98-1.40x OpenBLAS's speed at the training shapes, against 0.93-0.96x at K = 1024 and
// 0.87-1.01x for X^T dY. A function of the CPU, the shape and beta only, so results never depend
// on timing.
template <class T>
static bool packed_is_faster(bool transpose_a, std::size_t N, std::size_t K, T beta) {
  static const bool blas_serves_level = blas_serves(SimdLevel::TAPEGRAD_SIMD_LEVEL);
  if (!blas_serves_level) return true;
  if (std::is_same_v<T, float> && sizeof(Batch<T>) == 64) return true;
  return !transpose_a && (N <= 128 || (beta == T(0) && K <= 256));
}

// How many of op(B)'s n columns one packed_product call takes, so that its packed slice (KC x
// those columns) stays in L2 while every block of rows passes; the arithmetic of an element is the
// same whatever the parts. Wider than 8 NC columns (the vocabulary's 49,152): NC at a time.
// Otherwise, where the tiling gives L2_floats, near-equal parts of whole panels within them: at
// AVX-512 SmolLM2's gate, up and down weights (576 x 1536, 3.5 MB packed) had come back from L3
// for every block of rows, and in parts x W^T and dy W ran 1.01-1.10x as fast at 128-1,024 rows,
// the fine-tuning step 1.02x at one thread (docs/benchmarks.md, "Measurements behind choices in
// the code"). Not when op(A) = A^T, whose packing each part would repeat (down's dW 0.95x).
template <class T>
static std::size_t part_columns(bool transpose_a, std::size_t n, std::size_t K) {
  using Tiling = PackedTiling<sizeof(Batch<T>)>;
  constexpr std::size_t NR = Tiling::vectors * Batch<T>::size;
  if (n > 8 * Tiling::NC) return Tiling::NC;
  const std::size_t panels = (n + NR - 1) / NR, panel_floats = NR * std::min(K, Tiling::KC);
  if (transpose_a || Tiling::L2_floats == 0 || panels * panel_floats <= Tiling::L2_floats) return n;
  const std::size_t fit = std::max<std::size_t>(1, Tiling::L2_floats / panel_floats), parts = (panels + fit - 1) / fit;
  return (panels + parts - 1) / parts * NR;
}

template <class T>
void packed_gemm(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
                 std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  if (M == 0 || N == 0) return;
  detail::split_product(M, N, K, [&](std::size_t m0, std::size_t m, std::size_t n0, std::size_t n) {
    const std::size_t step = part_columns<T>(transpose_a, n, K);
    for (std::size_t j = n0; j < n0 + n; j += step)
      packed_product(transpose_a, transpose_b, m, std::min(step, n0 + n - j), K, alpha,
                     row_block(A, transpose_a, m0, lda), lda, column_block(B, transpose_b, j, ldb), ldb, beta,
                     C + m0 * ldc + j, ldc);
  });
}
TAPEGRAD_INSTANTIATE_KERNEL(packed_gemm)

template <class T>
void gemm(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
          std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  if (M == 0 || N == 0) return;
  constexpr std::size_t small_rows = 2;
  if (M <= small_rows) return small_gemm(transpose_a, transpose_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (packed_is_faster<T>(transpose_a, N, K, beta))
    return packed_gemm(transpose_a, transpose_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  auto ta = transpose_a ? CblasTrans : CblasNoTrans;
  auto tb = transpose_b ? CblasTrans : CblasNoTrans;
  detail::split_product(M, N, K, [&](std::size_t m0, std::size_t m, std::size_t n0, std::size_t n) {
    blas_gemm(ta, tb, int(m), int(n), int(K), alpha, row_block(A, transpose_a, m0, lda), int(lda),
              column_block(B, transpose_b, n0, ldb), int(ldb), beta, C + m0 * ldc + n0, int(ldc));
  });
}
TAPEGRAD_INSTANTIATE_KERNEL(gemm)

// Runs part(n0, n) on the outputs n0..n0+n-1 of a row-stable product, whose time is reading its
// weights once when M is a few rows (decoding): whole, or over the kernel threads in near-equal
// chunks of 64 outputs (whole vectors at every width). Every output is computed as in one call,
// so the bits do not depend on the thread count. From 2^16 weights (256 KB of float32): the seed
// model's products of at most 16K weights take less time than a parallel region's start.
template <class Part>
static void split_outputs(std::size_t M, std::size_t N, std::size_t K, Part part) {
  const int threads = num_threads();
  constexpr std::size_t unit = 64, min_parallel_weights = 1 << 16, min_parallel_flops = 1 << 21;
  if (threads <= 1 || omp_in_parallel() || N < 2 * unit || (N * K < min_parallel_weights && M * N * K < min_parallel_flops))
    return part(0, N);
  const std::size_t chunk = ((N + threads - 1) / threads + unit - 1) / unit * unit, parts = (N + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::ptrdiff_t p = 0; p < static_cast<std::ptrdiff_t>(parts); ++p) {
    const std::size_t first = std::size_t(p) * chunk;
    part(first, std::min(chunk, N - first));
  }
}

template <class T>
void row_stable_matmul(T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N, bool accumulate) {
  split_outputs(M, N, K, [&](std::size_t n0, std::size_t n) {
    thread_local std::vector<T> scratch;  // each thread's partial sums, kept across decoding steps
    detail::row_stable_product<Batch<T>>(y + n0, N, x, K, w + n0, N, M, n, K, accumulate, &scratch);
  });
}
TAPEGRAD_INSTANTIATE_KERNEL(row_stable_matmul)

template <class T>
void row_stable_matmul_transposed(T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N) {
  // Blocks of 64 rows of w (144 KB at K = 576) stay in L2 while the M rows of x pass: w is read
  // from memory once per call, not once per row. Each output is what gemm computes for one row
  // (small_gemm: groups of W rows of w from the call's first, and 64 is a multiple of every W).
  constexpr std::size_t block = 64;
  split_outputs(M, N, K, [&](std::size_t n0, std::size_t n) {
    for (std::size_t b = n0; b < n0 + n; b += block)
      for (std::size_t i = 0; i < M; ++i)
        small_gemm(false, true, 1, std::min(block, n0 + n - b), K, T(1), x + i * K, K, w + b * K, K, T(0),
                   y + i * N + b, N);
  });
}
TAPEGRAD_INSTANTIATE_KERNEL(row_stable_matmul_transposed)

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
