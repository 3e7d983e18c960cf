// The public kernels: each calls the copy compiled for the SIMD level in use
// (core/kernels/kernel_table.h). The matmul compositions and the RoPE table have no SIMD code of
// their own and live here.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/kernels/kernel_table.h"
#include "core/parallel.h"
#include "core/precision.h"

namespace tapegrad::kernels {

#ifndef TAPEGRAD_HAVE_EMULATED16
#error "CMakeLists.txt says whether this build has the emulated16 test level"
#endif

template <class T> const KernelTable<T>& active_table() {
  switch (simd_level()) {
    case SimdLevel::avx512: return avx512::table<T>();
    case SimdLevel::avx2: return avx2::table<T>();
#if TAPEGRAD_HAVE_EMULATED16
    case SimdLevel::emulated16: return emulated16::table<T>();
#else
    case SimdLevel::emulated16: break;  // set_simd_level refuses it in this build
#endif
    case SimdLevel::sse2: break;
  }
  return sse2::table<T>();
}
template const KernelTable<float>& active_table<float>();
template const KernelTable<double>& active_table<double>();

// The public kernels of core/kernel_list.h: each calls the level in use.
#define TAPEGRAD_KERNEL(Return, name, parameters, arguments) \
  template <class T> Return name parameters { return active_table<T>().name arguments; }
#include "core/kernel_list.h"

template <class T>
void precision_gemm(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const T* A,
                    std::size_t lda, const T* B, std::size_t ldb, bool accumulate, T* C, std::size_t ldc) {
  if constexpr (std::is_same_v<T, float>)
    if (matmul_precision() == Precision::bf16)
      return bf16_gemm<float>(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
  gemm<T>(transpose_a, transpose_b, M, N, K, T(1), A, lda, B, ldb, accumulate ? T(1) : T(0), C, ldc);
}

template <class T>
void matmul_forward(T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N) {
  precision_gemm<T>(false, false, M, N, K, x, K, w, N, false, y, N);
}

template <class T>
void matmul_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                     std::size_t N, bool overwrite_dx) {
  if (dx) precision_gemm<T>(false, true, M, K, N, dy, N, w, N, !overwrite_dx, dx, K);
  if (dw) precision_gemm<T>(true, false, K, N, M, x, K, dy, N, true, dw, N);
}

// dst (M, N) = src (M, N), row by row on the kernel threads, each its share in the order gemm
// splits rows, so that a thread's rows are in its own cache when its part of a product reads them.
template <class T>
static void copy_rows(T* dst, const T* src, std::size_t M, std::size_t N) {
  detail::parallel_for(M, N, [&](std::size_t i) { std::copy_n(src + i * N, N, dst + i * N); });
}

// The rows of y start as r's (or the bias) and gemm adds x w to them (beta = 1).
template <class T>
void add_matmul_forward(T* y, const T* r, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N) {
  if (y != r) copy_rows(y, r, M, N);
  precision_gemm<T>(false, false, M, N, K, x, K, w, N, true, y, N);
}

template <class T>
void add_matmul_backward(T* dr, T* dx, T* dw, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                         std::size_t N, bool overwrite_dr, bool overwrite_dx) {
  if (dr && overwrite_dr) copy_rows(dr, dy, M, N);
  else if (dr) accumulate(dr, dy, M * N);
  matmul_backward(dx, dw, dy, x, w, M, K, N, overwrite_dx);
}

template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t M, std::size_t K, std::size_t N) {
  detail::parallel_for(M, N, [&](std::size_t i) { std::copy_n(b, N, y + i * N); });
  precision_gemm<T>(false, false, M, N, K, x, K, w, N, true, y, N);
}

template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                     std::size_t N, bool overwrite_dx) {
  if (db) add_bias_backward<T>(nullptr, db, dy, M, N);
  matmul_backward(dx, dw, dy, x, w, M, K, N, overwrite_dx);
}

template <class T> RopeTable<T> make_rope_table(std::size_t max_len, std::size_t head_dim, double theta) {
  RopeTable<T> table;
  table.max_len = max_len;
  table.half = head_dim / 2;
  table.cos.resize(max_len * table.half);
  table.sin.resize(max_len * table.half);
  for (std::size_t m = 0; m < max_len; ++m)
    for (std::size_t i = 0; i < table.half; ++i) {
      double angle = double(m) * std::pow(theta, -2.0 * double(i) / double(head_dim));
      table.cos[m * table.half + i] = T(std::cos(angle));
      table.sin[m * table.half + i] = T(std::sin(angle));
    }
  return table;
}

#define TAPEGRAD_KERNEL(Return, name, parameters, arguments) TAPEGRAD_INSTANTIATE_KERNEL(name)
#include "core/kernel_list.h"
TAPEGRAD_INSTANTIATE_KERNEL(precision_gemm)
TAPEGRAD_INSTANTIATE_KERNEL(matmul_forward)
TAPEGRAD_INSTANTIATE_KERNEL(matmul_backward)
TAPEGRAD_INSTANTIATE_KERNEL(add_matmul_forward)
TAPEGRAD_INSTANTIATE_KERNEL(add_matmul_backward)
TAPEGRAD_INSTANTIATE_KERNEL(linear_forward)
TAPEGRAD_INSTANTIATE_KERNEL(linear_backward)
TAPEGRAD_INSTANTIATE_KERNEL(make_rope_table)

}  // namespace tapegrad::kernels
