// The public kernels: each calls the copy compiled for the SIMD level in use (core/kernel_table.h).
// The matmul compositions and the RoPE table have no SIMD code of their own and live here.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/kernel_table.h"
#include "core/parallel.h"

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

template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
          std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  active_table<T>().gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void packed_gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
                 std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  active_table<T>().packed_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void matmul_forward(T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N) {
  gemm<T>(false, false, M, N, K, T(1), x, K, w, N, T(0), y, N);
}

template <class T>
void matmul_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                     std::size_t N, bool dx_fresh) {
  if (dx) gemm<T>(false, true, M, K, N, T(1), dy, N, w, N, dx_fresh ? T(0) : T(1), dx, K);
  if (dw) gemm<T>(true, false, K, N, M, T(1), x, K, dy, N, T(1), dw, N);
}

template <class T>
void row_stable_matmul(T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N, bool accumulate) {
  active_table<T>().row_stable_matmul(y, x, w, M, K, N, accumulate);
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
  gemm<T>(false, false, M, N, K, T(1), x, K, w, N, T(1), y, N);
}

template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t M, std::size_t K, std::size_t N) {
  detail::parallel_for(M, N, [&](std::size_t i) { std::copy_n(b, N, y + i * N); });
  gemm<T>(false, false, M, N, K, T(1), x, K, w, N, T(1), y, N);
}

template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                     std::size_t N, bool dx_fresh) {
  if (db) add_bias_backward<T>(nullptr, db, dy, M, N);
  matmul_backward(dx, dw, dy, x, w, M, K, N, dx_fresh);
}

template <class T>
void add_matmul_backward(T* dr, T* dx, T* dw, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                         std::size_t N, bool dr_fresh, bool dx_fresh) {
  if (dr && dr_fresh) copy_rows(dr, dy, M, N);
  else if (dr) accumulate(dr, dy, M * N);
  matmul_backward(dx, dw, dy, x, w, M, K, N, dx_fresh);
}

template <class T> void add_forward(T* y, const T* a, const T* b, std::size_t n) {
  active_table<T>().add_forward(y, a, b, n);
}
template <class T> void accumulate(T* dst, const T* src, std::size_t n) { active_table<T>().accumulate(dst, src, n); }
template <class T> void mul_forward(T* y, const T* a, const T* b, std::size_t n) {
  active_table<T>().mul_forward(y, a, b, n);
}
template <class T> void mul_backward(T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n) {
  active_table<T>().mul_backward(da, db, dy, a, b, n);
}
template <class T> void scale_forward(T* y, const T* x, T s, std::size_t n) { active_table<T>().scale_forward(y, x, s, n); }
template <class T> void scale_backward(T* dx, const T* dy, T s, std::size_t n) {
  active_table<T>().scale_backward(dx, dy, s, n);
}
template <class T> void add_bias_forward(T* y, const T* x, const T* bias, std::size_t rows, std::size_t cols) {
  active_table<T>().add_bias_forward(y, x, bias, rows, cols);
}
template <class T> void add_bias_backward(T* dx, T* dbias, const T* dy, std::size_t rows, std::size_t cols) {
  active_table<T>().add_bias_backward(dx, dbias, dy, rows, cols);
}

template <class T>
void embedding_forward(T* y, const T* table, const std::int32_t* ids, std::size_t n, std::size_t dim) {
  active_table<T>().embedding_forward(y, table, ids, n, dim);
}
template <class T>
void embedding_backward(T* dtable, const T* dy, const std::int32_t* ids, std::size_t n, std::size_t dim) {
  active_table<T>().embedding_backward(dtable, dy, ids, n, dim);
}

template <class T>
void rms_norm_forward(T* y, T* rstd, const T* x, const T* w, std::size_t rows, std::size_t dim, T eps) {
  active_table<T>().rms_norm_forward(y, rstd, x, w, rows, dim, eps);
}
template <class T>
void rms_norm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, std::size_t rows,
                       std::size_t dim) {
  active_table<T>().rms_norm_backward(dx, dw, dy, x, w, rstd, rows, dim);
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
template <class T>
void rope_forward(T* y, const T* x, const RopeTable<T>& table, std::size_t batch, std::size_t seq_len,
                  std::size_t n_heads, std::size_t head_dim, std::size_t offset) {
  active_table<T>().rope_forward(y, x, table, batch, seq_len, n_heads, head_dim, offset);
}
template <class T>
void rope_backward(T* dx, const T* dy, const RopeTable<T>& table, std::size_t batch, std::size_t seq_len,
                   std::size_t n_heads, std::size_t head_dim, std::size_t offset, bool overwrite) {
  active_table<T>().rope_backward(dx, dy, table, batch, seq_len, n_heads, head_dim, offset, overwrite);
}

template <class T> void silu_forward(T* y, const T* a, std::size_t n) { active_table<T>().silu_forward(y, a, n); }
template <class T> void silu_backward(T* da, const T* dy, const T* a, std::size_t n) {
  active_table<T>().silu_backward(da, dy, a, n);
}
template <class T> void swiglu_forward(T* y, const T* a, const T* b, std::size_t n) {
  active_table<T>().swiglu_forward(y, a, b, n);
}
template <class T>
void swiglu_backward(T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n, bool overwrite) {
  active_table<T>().swiglu_backward(da, db, dy, a, b, n, overwrite);
}

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionShape& s) {
  if (s.q_offset + s.q_len > s.kv_len) throw std::invalid_argument("attention: q_offset + q_len exceeds kv_len");
  active_table<T>().attention_forward(out, lse, q, k, v, s);
}
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, const AttentionShape& s, bool overwrite) {
  if (s.q_offset + s.q_len > s.kv_len) throw std::invalid_argument("attention: q_offset + q_len exceeds kv_len");
  active_table<T>().attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s, overwrite);
}
template <class T>
void cached_attention_forward(T* out, const T* q, const T* keys, const T* values, const AttentionShape& s, T* scratch) {
  if (s.batch != 1 || s.q_offset + s.q_len > s.kv_len)
    throw std::invalid_argument(fmt::format("cached_attention: one sequence with q_offset + q_len <= kv_len; got batch "
                                            "{}, q_offset {}, q_len {}, kv_len {}",
                                            s.batch, s.q_offset, s.q_len, s.kv_len));
  active_table<T>().cached_attention_forward(out, q, keys, values, s, scratch);
}

template <class T>
T cross_entropy_forward(T* lse, const T* logits, const std::int32_t* targets, std::size_t n, std::size_t vocab) {
  return active_table<T>().cross_entropy_forward(lse, logits, targets, n, vocab);
}
template <class T>
void cross_entropy_backward(T* dlogits, T dloss, const T* logits, const T* lse, const std::int32_t* targets,
                            std::size_t n, std::size_t vocab) {
  active_table<T>().cross_entropy_backward(dlogits, dloss, logits, lse, targets, n, vocab);
}

template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, std::size_t rows, std::size_t dim,
                        T eps) {
  active_table<T>().layer_norm_forward(y, mean, rstd, x, w, b, rows, dim, eps);
}
template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                         std::size_t rows, std::size_t dim) {
  active_table<T>().layer_norm_backward(dx, dw, db, dy, x, w, mean, rstd, rows, dim);
}

template <class T> void gelu_tanh_forward(T* y, T* s, const T* x, std::size_t n) {
  active_table<T>().gelu_tanh_forward(y, s, x, n);
}
template <class T>
void gelu_tanh_backward(T* dx, const T* dy, const T* x, const T* s, std::size_t n, bool overwrite) {
  active_table<T>().gelu_tanh_backward(dx, dy, x, s, n, overwrite);
}

#define TAPEGRAD_INSTANTIATE(T)                                                                                  \
  template void gemm<T>(bool, bool, std::size_t, std::size_t, std::size_t, T, const T*, std::size_t, const T*,  \
                        std::size_t, T, T*, std::size_t);                                                        \
  template void packed_gemm<T>(bool, bool, std::size_t, std::size_t, std::size_t, T, const T*, std::size_t,         \
                               const T*, std::size_t, T, T*, std::size_t);                                       \
  template void matmul_forward<T>(T*, const T*, const T*, std::size_t, std::size_t, std::size_t);               \
  template void matmul_backward<T>(T*, T*, const T*, const T*, const T*, std::size_t, std::size_t, std::size_t,  \
                                   bool);                                                                        \
  template void add_matmul_forward<T>(T*, const T*, const T*, const T*, std::size_t, std::size_t, std::size_t);  \
  template void row_stable_matmul<T>(T*, const T*, const T*, std::size_t, std::size_t, std::size_t, bool);       \
  template void linear_forward<T>(T*, const T*, const T*, const T*, std::size_t, std::size_t, std::size_t);      \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, std::size_t, std::size_t,           \
                                   std::size_t, bool);                                                           \
  template void add_matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, std::size_t, std::size_t,       \
                                       std::size_t, bool, bool);                                                 \
  template void add_forward<T>(T*, const T*, const T*, std::size_t);                                            \
  template void accumulate<T>(T*, const T*, std::size_t);                                                       \
  template void mul_forward<T>(T*, const T*, const T*, std::size_t);                                            \
  template void mul_backward<T>(T*, T*, const T*, const T*, const T*, std::size_t);                             \
  template void scale_forward<T>(T*, const T*, T, std::size_t);                                                 \
  template void scale_backward<T>(T*, const T*, T, std::size_t);                                                \
  template void add_bias_forward<T>(T*, const T*, const T*, std::size_t, std::size_t);                          \
  template void add_bias_backward<T>(T*, T*, const T*, std::size_t, std::size_t);                               \
  template void embedding_forward<T>(T*, const T*, const std::int32_t*, std::size_t, std::size_t);              \
  template void embedding_backward<T>(T*, const T*, const std::int32_t*, std::size_t, std::size_t);             \
  template void rms_norm_forward<T>(T*, T*, const T*, const T*, std::size_t, std::size_t, T);                   \
  template void rms_norm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, std::size_t, std::size_t); \
  template RopeTable<T> make_rope_table<T>(std::size_t, std::size_t, double);                                    \
  template void layer_norm_forward<T>(T*, T*, T*, const T*, const T*, const T*, std::size_t, std::size_t, T);    \
  template void layer_norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, std::size_t, \
                                       std::size_t);                                                             \
  template void gelu_tanh_forward<T>(T*, T*, const T*, std::size_t);                                            \
  template void gelu_tanh_backward<T>(T*, const T*, const T*, const T*, std::size_t, bool);                      \
  template void rope_forward<T>(T*, const T*, const RopeTable<T>&, std::size_t, std::size_t, std::size_t,        \
                                std::size_t, std::size_t);                                                       \
  template void rope_backward<T>(T*, const T*, const RopeTable<T>&, std::size_t, std::size_t, std::size_t,       \
                                 std::size_t, std::size_t, bool);                                                \
  template void silu_forward<T>(T*, const T*, std::size_t);                                                     \
  template void silu_backward<T>(T*, const T*, const T*, std::size_t);                                          \
  template void swiglu_forward<T>(T*, const T*, const T*, std::size_t);                                         \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, std::size_t, bool);                    \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, const AttentionShape&);              \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,   \
                                      const AttentionShape&, bool);                                              \
  template void cached_attention_forward<T>(T*, const T*, const T*, const T*, const AttentionShape&, T*);        \
  template T cross_entropy_forward<T>(T*, const T*, const std::int32_t*, std::size_t, std::size_t);             \
  template void cross_entropy_backward<T>(T*, T, const T*, const T*, const std::int32_t*, std::size_t, std::size_t);
TAPEGRAD_INSTANTIATE(float)
TAPEGRAD_INSTANTIATE(double)
#undef TAPEGRAD_INSTANTIATE

}  // namespace tapegrad::kernels
