// The products: matmul (torch.matmul, with transpose flags and broadcast batches) and add_matmul
// (torch.addmm: a residual or a bias plus x w in one gemm), at the thread's matmul precision
// (core/precision.h). Each: validate, forward (kernel), record the backward, return.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/kernels.h"
#include "core/op_recording.h"
#include "core/ops.h"
#include "core/precision.h"

namespace tapegrad {

Var matmul(const Var& a, const Var& b, bool transpose_a, bool transpose_b) {
  const Shape &sa = a.shape(), &sb = b.shape();
  auto mismatch = [&](const char* why) {
    return std::invalid_argument(fmt::format("matmul: {}; a is {}{}, b is {}{}", why, to_string(sa),
                                             transpose_a ? " (transposed)" : "", to_string(sb),
                                             transpose_b ? " (transposed)" : ""));
  };
  if (sa.size() >= 2 && sb.size() >= 3 && !(sa.size() == 3 && sb.size() == 3 && sa[0] == sb[0])) {
    // torch.matmul's broadcast over leading axes, composed: expand both to the broadcast batch
    // (expand's backward sums the gradient back), flatten it, one batched matmul, unflatten.
    Shape lead_a(sa.begin(), sa.end() - 2), lead_b(sb.begin(), sb.end() - 2);
    Shape lead;
    try {
      lead = broadcast_shapes("matmul", lead_a, lead_b);
    } catch (const std::invalid_argument&) {
      throw mismatch("the leading (batch) axes do not broadcast");
    }
    std::size_t batch = numel(lead);
    auto full = [&](const Var& x, const Shape& s) {
      Shape target = lead;
      target.insert(target.end(), s.end() - 2, s.end());
      return reshape(expand(x, target), {batch, s[s.size() - 2], s.back()});
    };
    Var y = matmul(full(a, sa), full(b, sb), transpose_a, transpose_b);
    Shape out_shape = lead;
    out_shape.push_back(y.shape()[1]);
    out_shape.push_back(y.shape()[2]);
    return reshape(y, out_shape);
  }
  std::size_t batch, M, K, N;
  Shape out_shape;
  bool batched = sa.size() == 3 && sb.size() == 3;
  if (batched) {
    batch = sa[0];
    M = transpose_a ? sa[2] : sa[1];
    K = transpose_a ? sa[1] : sa[2];
    N = transpose_b ? sb[1] : sb[2];
    if ((transpose_b ? sb[2] : sb[1]) != K) throw mismatch("inner sizes differ");
    out_shape = {batch, M, N};
  } else {
    if (sb.size() != 2 || sa.empty() || (transpose_a && sa.size() != 2))
      throw mismatch("expected a (.., K) or a 2-D transposed a with a 2-D b, or two 3-D batches");
    batch = 1;
    K = transpose_a ? sa[0] : sa.back();
    M = transpose_a ? sa[1] : a.value().size() / std::max<std::size_t>(K, 1);
    N = transpose_b ? sb[0] : sb[1];
    if ((transpose_b ? sb[1] : sb[0]) != K) throw mismatch("inner sizes differ");
    out_shape = transpose_a ? Shape{M, N} : sa;
    if (!transpose_a) out_shape.back() = N;
  }
  std::size_t lda = transpose_a ? M : K, ldb = transpose_b ? K : N;
  std::size_t stride_a = batched ? M * K : 0, stride_b = batched ? K * N : 0, stride_c = M * N;

  Op op("matmul", {a, b});
  Tensor y = Tensor::uninitialized(out_shape);
  for (std::size_t i = 0; i < batch; ++i)
    kernels::precision_gemm<float>(transpose_a, transpose_b, M, N, K, a.value().data() + i * stride_a, lda,
                                   b.value().data() + i * stride_b, ldb, false, y.data() + i * stride_c, N);
  // C = op(A) op(B): d op(A) = dC op(B)^T, d op(B) = op(A)^T dC; transposing back gives the
  // four flag combinations below. Under bf16, the same products of the rounded operands (dC
  // included): the gradient of the float32 product at the rounded inputs, straight through the
  // rounding, whose own derivative is zero almost everywhere.
  return op.finish(std::move(y), [a, b, transpose_a, transpose_b, batch, M, N, K, lda, ldb, stride_a, stride_b,
                                  stride_c, precision = matmul_precision()](const Tensor& dy, const Tensor&) {
      PrecisionScope scope(precision);
      // A first gradient is written rather than zero-filled and added to.
      const GradTarget ga = grad_target(a, {b}), gb = grad_target(b, {a});
      float *da = ga.data, *db = gb.data;
      const bool add_a = !ga.overwrite, add_b = !gb.overwrite;
      for (std::size_t i = 0; i < batch; ++i) {
        const float* A = a.value().data() + i * stride_a;
        const float* B = b.value().data() + i * stride_b;
        const float* dC = dy.data() + i * stride_c;
        if (da && !transpose_a)
          kernels::precision_gemm<float>(false, !transpose_b, M, K, N, dC, N, B, ldb, add_a, da + i * stride_a, K);
        if (da && transpose_a)
          kernels::precision_gemm<float>(transpose_b, true, K, M, N, B, ldb, dC, N, add_a, da + i * stride_a, M);
        if (db && !transpose_b)
          kernels::precision_gemm<float>(!transpose_a, false, K, N, M, A, lda, dC, N, add_b, db + i * stride_b, N);
        if (db && transpose_b)
          kernels::precision_gemm<float>(true, transpose_a, N, K, M, dC, N, A, lda, add_b, db + i * stride_b, K);
      }
  });
}

Var add_matmul(const Var& r, const Var& x, const Var& w, const Tensor* known_y) {
  const Shape &sx = x.shape(), &sw = w.shape();
  if (sw.size() != 2 || sx.empty() || sx.back() != sw[0])
    throw std::invalid_argument(fmt::format("add_matmul: expected x (.., K) and w (K, N); x is {}, w is {}",
                                            to_string(sx), to_string(sw)));
  const std::size_t K = sw[0], N = sw[1], M = x.value().size() / std::max<std::size_t>(K, 1);
  Shape out_shape = sx;
  out_shape.back() = N;
  const bool bias = r.shape() == Shape{N} && out_shape != Shape{N};
  if (!bias && r.shape() != out_shape)
    throw std::invalid_argument(fmt::format("add_matmul: r must have the shape of x w, {}, or be a bias ({}); got {}",
                                            to_string(out_shape), N, to_string(r.shape())));
  Op op("add_matmul", {r, x, w});
  Tensor y;
  if (known_y) {
    expect_shape("add_matmul", "known_y", known_y->shape(), out_shape);
    y = *known_y;
  } else {
    y = Tensor::uninitialized(out_shape);
    if (bias) kernels::linear_forward(y.data(), x.value().data(), w.value().data(), r.value().data(), M, K, N);
    else kernels::add_matmul_forward(y.data(), r.value().data(), x.value().data(), w.value().data(), M, K, N);
  }
  // dr += dy (summed over rows for a bias); dx += dy w^T; dw += x^T dy, at the forward's precision
  // (as matmul's). An activation's first gradient (dx, and a residual's dr) is written rather than
  // added.
  return op.finish(std::move(y), [r, x, w, M, K, N, bias, precision = matmul_precision()](const Tensor& dy,
                                                                                          const Tensor&) {
    PrecisionScope scope(precision);
    const GradTarget dx = grad_target(x, {r, w});
    float* dw = grad_ptr(w);
    if (bias) {
      kernels::linear_backward(dx.data, dw, grad_ptr(r), dy.data(), x.value().data(), w.value().data(), M, K, N,
                               dx.overwrite);
      return;
    }
    const GradTarget dr = grad_target(r, {x, w});
    kernels::add_matmul_backward(dr.data, dx.data, dw, dy.data(), x.value().data(), w.value().data(), M, K, N,
                                 dr.overwrite, dx.overwrite);
  });
}

}  // namespace tapegrad
