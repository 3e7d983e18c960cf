// gemm: cblas (row-major, transpose flags, beta = 1 to accumulate gradients) for real products,
// register-blocked row loops for one or two rows. BLAS runs single-threaded; large products are
// split across OpenMP threads by output rows or columns, so each output element is one unsplit
// BLAS reduction and results do not depend on the thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "core/kernel_level.h"

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
static void small_gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, T alpha,
                       const T* A, std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  for (std::size_t i = 0; i < M; ++i) {
    T* c = C + i * ldc;
    if (beta != T(0) && beta != T(1))
      for (std::size_t n = 0; n < N; ++n) c[n] *= beta;
    const T* a = trans_a ? A + i : A + i * lda;
    std::size_t a_stride = trans_a ? lda : 1;
    if (!trans_b) {
      detail::row_times_matrix<Batch<T>>(c, a, a_stride, B, ldb, K, N, alpha, beta != T(0));
      continue;
    }
    std::size_t n0 = 0;
    if (!trans_a) n0 = detail::dots_with_rows<Batch<T>>(c, a, B, ldb, K, N, alpha, beta != T(0));
    for (std::size_t n = n0; n < N; ++n) {  // c[n] = a . row n of B
      T sum = trans_a ? T(0) : detail::dot<Batch<T>>(a, B + n * ldb, K);
      if (trans_a)
        for (std::size_t k = 0; k < K; ++k) sum += a[k * a_stride] * B[n * ldb + k];
      c[n] = alpha * sum + (beta != T(0) ? c[n] : T(0));
    }
  }
}

template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
          std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  if (M == 0 || N == 0) return;
  constexpr std::size_t small_rows = 2;
  if (M <= small_rows) return small_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  auto ta = trans_a ? CblasTrans : CblasNoTrans;
  auto tb = trans_b ? CblasTrans : CblasNoTrans;
  auto call = [&](std::size_t m0, std::size_t m, std::size_t n0, std::size_t n) {
    // Row m0 of op(A) starts at A + m0 * lda (or column m0 when transposed); likewise for B.
    const T* a = A + (trans_a ? m0 : m0 * lda);
    const T* b = B + (trans_b ? n0 * ldb : n0);
    blas_gemm(ta, tb, int(m), int(n), int(K), alpha, a, int(lda), b, int(ldb), beta, C + m0 * ldc + n0, int(ldc));
  };
  int threads = num_threads();
  constexpr std::size_t min_parallel_flops = 1 << 21;
  if (threads <= 1 || M * N * K < min_parallel_flops || omp_in_parallel()) {
    call(0, M, 0, N);
    return;
  }
  // Split the longer output side into chunks that are multiples of 16 (whole SIMD tiles).
  bool split_rows = M >= N;
  std::size_t extent = split_rows ? M : N;
  std::size_t chunk = ((extent + threads - 1) / threads + 15) / 16 * 16;
  std::size_t parts = (extent + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::ptrdiff_t p = 0; p < static_cast<std::ptrdiff_t>(parts); ++p) {
    std::size_t begin = p * chunk, count = std::min(chunk, extent - begin);
    if (split_rows) call(begin, count, 0, N);
    else call(0, M, begin, count);
  }
}

template <class T>
void row_stable_matmul(T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N, bool accumulate) {
  detail::row_stable_product<Batch<T>>(y, N, x, K, w, N, M, N, K, accumulate);
}

template void row_stable_matmul<float>(float*, const float*, const float*, std::size_t, std::size_t, std::size_t, bool);
template void row_stable_matmul<double>(double*, const double*, const double*, std::size_t, std::size_t, std::size_t,
                                        bool);
template void gemm<float>(bool, bool, std::size_t, std::size_t, std::size_t, float, const float*, std::size_t,
                          const float*, std::size_t, float, float*, std::size_t);
template void gemm<double>(bool, bool, std::size_t, std::size_t, std::size_t, double, const double*, std::size_t,
                           const double*, std::size_t, double, double*, std::size_t);

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
