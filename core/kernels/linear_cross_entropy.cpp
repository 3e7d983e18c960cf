// The vocabulary projection fused with its cross-entropy: logits = x op(w) (+ b) made a chunk of
// rows at a time, turned into their gradient in place (softmax minus the one-hot target, as
// Liger-Kernel's fused linear cross-entropy does), and multiplied back into dx, dw and db, so
// that the (rows, vocab) logits and their gradient are never held whole. Its products are float32
// or, under bf16 mixed precision, bf16_gemm's, as the matmul ops' (core/precision.h); under bf16
// the weight is rounded and packed once for all the chunks' products, not once a chunk
// (SharedBf16Operand).
#include <cmath>
#include <optional>
#include <type_traits>

#include "core/kernels/level.h"
#include "core/kernels/matmul_bf16.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

// One row of logits (V): its loss term lse - x[t]; with scale non-zero the row becomes
// scale * (softmax - onehot(t)), the same sums and exponentials as cross_entropy_forward and
// cross_entropy_backward (rows.cpp), so that the fused loss and gradient have their bits.
template <class T>
static double loss_and_gradient_row(T* row, std::size_t vocab, std::int32_t target, T scale) {
  using B = Batch<T>;
  constexpr std::size_t W = B::size;
  const T m = detail::max_of<B>(row, vocab);
  const T lse = m + std::log(detail::sum_exp_shifted<B>(row, vocab, m));
  const double term = double(lse) - double(row[target]);
  if (scale != T(0)) {
    for (std::size_t j = 0; j < vocab; j += W) {
      const std::size_t count = std::min(W, vocab - j);
      B d = fma(B(scale), exp(detail::load_lanes<B>(row + j, count) - B(lse)), B(T(0)));
      detail::store_lanes(d, row + j, count);
    }
    row[target] -= scale;
  }
  return term;
}

template <class T>
T linear_cross_entropy(T* dx, T* dw, T* db, const T* x, const T* w, const T* bias, const std::int32_t* targets,
                       std::size_t n, std::size_t dim, std::size_t vocab, bool transpose_w, std::size_t chunk_rows,
                       T* scratch, bool overwrite, bool bf16_products) {
  // C = op(A) op(B) (+ C with accumulate), as kernels::precision_gemm at this level.
  auto product = [&](bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const T* A,
                     std::size_t lda, const T* B, std::size_t ldb, bool accumulate, T* C, std::size_t ldc) {
    if constexpr (std::is_same_v<T, float>)
      if (bf16_products) return bf16_gemm<float>(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
    gemm<T>(transpose_a, transpose_b, M, N, K, T(1), A, lda, B, ldb, accumulate ? T(1) : T(0), C, ldc);
  };
  const std::size_t ldw = transpose_w ? dim : vocab;
  // Under bf16, op(w) for the logits and op(w)^T for dx, each rounded and packed once here.
  std::optional<SharedBf16Operand> logits_weight, dx_weight;
  if constexpr (std::is_same_v<T, float>)
    if (bf16_products) {
      logits_weight.emplace(transpose_w, dim, vocab, w, ldw);
      if (dx) dx_weight.emplace(!transpose_w, vocab, dim, w, ldw);
    }
  // C = A op(w) (+ C): through `shared` where it was made, else product().
  auto weight_product = [&](const std::optional<SharedBf16Operand>& shared, bool transpose_b, std::size_t M,
                            std::size_t N, std::size_t K, const T* A, std::size_t lda, bool accumulate, T* C,
                            std::size_t ldc) {
    if constexpr (std::is_same_v<T, float>)
      if (shared) return shared->product(false, M, A, lda, accumulate, C, ldc);
    product(false, transpose_b, M, N, K, A, lda, w, ldw, accumulate, C, ldc);
  };
  const bool gradients = dx || dw || db;
  const T scale = gradients ? T(1) / T(n) : T(0);  // d mean / d term
  std::vector<double> terms(chunk_rows);
  if (db && overwrite) std::fill_n(db, vocab, T(0));
  double total = 0;
  for (std::size_t r0 = 0; r0 < n; r0 += chunk_rows) {
    const std::size_t rows = std::min(chunk_rows, n - r0);
    const T* xc = x + r0 * dim;
    T* logits = scratch;  // (rows, V), then their gradient
    // logits = x_c op(w): w (V, D) transposed, or w (D, V)
    weight_product(logits_weight, transpose_w, rows, vocab, dim, xc, dim, false, logits, vocab);
    if (bias) add_bias_forward<T>(logits, logits, bias, rows, vocab);
    detail::parallel_for(rows, vocab * 8, [&](std::size_t r) {
      terms[r] = loss_and_gradient_row(logits + r * vocab, vocab, targets[r0 + r], scale);
    });
    for (std::size_t r = 0; r < rows; ++r) total += terms[r];  // in row order: the same for any threads
    if (!gradients) continue;
    // dlogits = g: dx_c = g op(w)^T; dw += x_c^T g (w (D, V)) or g^T x_c (w (V, D)); db += column sums of g.
    const bool add_x = !overwrite, add_w = !overwrite || r0 > 0;
    if (dx) weight_product(dx_weight, !transpose_w, rows, dim, vocab, logits, vocab, add_x, dx + r0 * dim, dim);
    if (dw && transpose_w) product(true, false, vocab, dim, rows, logits, vocab, xc, dim, add_w, dw, dim);
    if (dw && !transpose_w) product(true, false, dim, vocab, rows, xc, dim, logits, vocab, add_w, dw, vocab);
    if (db) detail::column_sums(db, rows, vocab, 1, [&](std::size_t r, std::size_t j) { return logits[r * vocab + j]; });
  }
  return T(total / double(n));
}
TAPEGRAD_INSTANTIATE_KERNEL(linear_cross_entropy)

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
