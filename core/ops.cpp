// Differentiable ops: validate, forward (kernel), record the backward, return.
#include "core/ops.h"

#include "core/op.h"
#include "core/precision.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

namespace tapegrad {

namespace {

std::size_t last_dim(const Var& x, const char* op) {
  if (x.shape().empty()) throw std::invalid_argument(fmt::format("{}: expected at least one axis, got a scalar", op));
  return x.shape().back();
}

void check_ids(const char* op, std::span<const std::int32_t> ids, std::size_t vocab) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || std::size_t(ids[i]) >= vocab)
      throw std::out_of_range(fmt::format("{}: id {} at index {} is outside the vocabulary of size {}", op, ids[i],
                                          i, vocab));
}

}  // namespace

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

Var add_bias(const Var& x, const Var& bias) {
  std::size_t cols = last_dim(x, "add_bias");
  expect_shape("add_bias", "bias", bias.shape(), Shape{cols});
  std::size_t rows = x.value().size() / std::max<std::size_t>(cols, 1);
  Op op("add_bias", {x, bias});
  Tensor y = Tensor::uninitialized(x.shape());
  kernels::add_bias_forward(y.data(), x.value().data(), bias.value().data(), rows, cols);
  // dx += dy; dbias += sum over rows of dy
  return op.finish(std::move(y), [x, bias, rows, cols](const Tensor& dy, const Tensor&) {
    kernels::add_bias_backward(grad_ptr(x), grad_ptr(bias), dy.data(), rows, cols);
  });
}

Var scale(const Var& x, float s) {
  Op op("scale", {x});
  Tensor y = Tensor::uninitialized(x.shape());
  kernels::scale_forward(y.data(), x.value().data(), s, y.size());
  // dx += s dy
  return op.finish(std::move(y), [x, s](const Tensor& dy, const Tensor&) {
    kernels::scale_backward(grad_ptr(x), dy.data(), s, dy.size());
  });
}

Var embedding(const Var& table, std::span<const std::int32_t> ids) {
  if (table.shape().size() != 2)
    throw std::invalid_argument(fmt::format("embedding: expected a (V, D) table, got {}", to_string(table.shape())));
  std::size_t vocab = table.shape()[0], dim = table.shape()[1];
  check_ids("embedding", ids, vocab);
  Op op("embedding", {table});
  Tensor y = Tensor::uninitialized({ids.size(), dim});
  kernels::embedding_forward(y.data(), table.value().data(), ids.data(), ids.size(), dim);
  std::vector<std::int32_t> saved;
  if (op.recording()) saved.assign(ids.begin(), ids.end());
  std::size_t bytes = saved.size() * sizeof(std::int32_t);
  // dtable[ids[i]] += dy[i]
  return op.finish(std::move(y), [table, ids = std::move(saved), dim](const Tensor& dy, const Tensor&) {
    if (float* dt = grad_ptr(table)) kernels::embedding_backward(dt, dy.data(), ids.data(), ids.size(), dim);
  }, bytes);
}

Var rms_norm(const Var& x, const Var& weight, float eps) {
  std::size_t dim = last_dim(x, "rms_norm");
  expect_shape("rms_norm", "weight", weight.shape(), Shape{dim});
  std::size_t rows = x.value().size() / std::max<std::size_t>(dim, 1);
  Op op("rms_norm", {x, weight});
  Tensor y = Tensor::uninitialized(x.shape());
  Tensor rstd = Tensor::uninitialized({rows});
  kernels::rms_norm_forward(y.data(), rstd.data(), x.value().data(), weight.value().data(), rows, dim, eps);
  std::size_t bytes = rstd.bytes();
  // the derivative is in kernels::rms_norm_backward
  return op.finish(std::move(y), [x, weight, rstd = std::move(rstd), rows, dim](const Tensor& dy, const Tensor&) {
    kernels::rms_norm_backward(grad_ptr(x), grad_ptr(weight), dy.data(), x.value().data(), weight.value().data(),
                               rstd.data(), rows, dim);
  }, bytes);
}

Var rope(const Var& x, std::shared_ptr<const kernels::RopeTable<float>> table, std::size_t n_heads,
         std::size_t offset) {
  const Shape& s = x.shape();
  if (s.size() != 3 || n_heads == 0 || s[2] % n_heads != 0 || (s[2] / n_heads) % 2 != 0)
    throw std::invalid_argument(fmt::format("rope: expected x (B, T, H*Dh) with {} heads of even size, got {}",
                                            n_heads, to_string(s)));
  std::size_t batch = s[0], seq_len = s[1], head_dim = s[2] / n_heads;
  if (!table || table->half != head_dim / 2 || offset + seq_len > table->max_len)
    throw std::invalid_argument(fmt::format("rope: positions {}..{} with head size {} do not fit a table of {} "
                                            "positions and head size {}",
                                            offset, offset + seq_len, head_dim, table ? table->max_len : 0,
                                            table ? table->half * 2 : 0));
  Op op("rope", {x});
  Tensor y = Tensor::uninitialized(s);
  kernels::rope_forward(y.data(), x.value().data(), *table, batch, seq_len, n_heads, head_dim, offset);
  // the rotation is orthogonal: dx += R(-angle) dy (written with overwrite)
  return op.finish(std::move(y), [x, table, batch, seq_len, n_heads, head_dim, offset](const Tensor& dy,
                                                                                        const Tensor&) {
    if (const GradTarget dx = grad_target(x); dx.data)
      kernels::rope_backward(dx.data, dy.data(), *table, batch, seq_len, n_heads, head_dim, offset, dx.overwrite);
  });
}

Var silu(const Var& x) {
  Op op("silu", {x});
  Tensor y = Tensor::uninitialized(x.shape());
  kernels::silu_forward(y.data(), x.value().data(), x.value().size());
  // dx += dy * sigmoid(x) (1 + x (1 - sigmoid(x)))
  return op.finish(std::move(y), [x](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x)) kernels::silu_backward(dx, dy.data(), x.value().data(), dy.size());
  });
}

Var swiglu(const Var& a, const Var& b) {
  expect_shape("swiglu", "b", b.shape(), a.shape());
  Op op("swiglu", {a, b});
  Tensor y = Tensor::uninitialized(a.shape());
  kernels::swiglu_forward(y.data(), a.value().data(), b.value().data(), a.value().size());
  // da += dy * b * silu'(a); db += dy * silu(a) (written when both say overwrite)
  return op.finish(std::move(y), [a, b](const Tensor& dy, const Tensor&) {
    const GradTarget da = grad_target(a, {b}), db = grad_target(b, {a});
    kernels::swiglu_backward(da.data, db.data, dy.data(), a.value().data(), b.value().data(), dy.size(),
                             overwrite_all({da, db}, dy.size()));
  });
}

Var attention(const Var& q, const Var& k, const Var& v, AttentionHeads heads) {
  const Shape& s = q.shape();
  const std::size_t n_heads = heads.n_heads, n_kv_heads = heads.n_kv_heads;
  if (s.size() != 3 || n_heads == 0 || s[2] % n_heads != 0)
    throw std::invalid_argument(
        fmt::format("attention: expected q (B, T, H*Dh) with {} heads, got {}", n_heads, to_string(s)));
  if (n_kv_heads == 0 || n_heads % n_kv_heads != 0)
    throw std::invalid_argument(
        fmt::format("attention: n_kv_heads {} must divide n_heads {}", n_kv_heads, n_heads));
  const std::size_t head_dim = s[2] / n_heads;
  const Shape kv_shape{s[0], s[1], n_kv_heads * head_dim};
  expect_shape("attention", "k", k.shape(), kv_shape);
  expect_shape("attention", "v", v.shape(), kv_shape);
  kernels::AttentionShape shape{s[0], s[1], s[1], n_heads, head_dim, 0, n_kv_heads};
  Op op("attention", {q, k, v});
  Tensor y = Tensor::uninitialized(s);
  Tensor lse = Tensor::uninitialized({s[0], n_heads, s[1]});  // (B, H, T): all backward needs besides y
  kernels::attention_forward(y.data(), lse.data(), q.value().data(), k.value().data(), v.value().data(), shape);
  std::size_t bytes = lse.bytes();
  // the derivative is in kernels::attention_backward
  // Fresh gradients of q, k and v (separate projections, their first gradient) are written, not added.
  return op.finish(std::move(y), [q, k, v, lse = std::move(lse), shape](const Tensor& dy, const Tensor& y) {
    const GradTarget dq = grad_target(q, {k, v}), dk = grad_target(k, {q, v}), dv = grad_target(v, {q, k});
    // overwrite_all with each target's own size: k and v are narrower than q with fewer KV heads.
    const bool overwrite = (!dq.data || dq.overwrite) && (!dk.data || dk.overwrite) && (!dv.data || dv.overwrite);
    if (!overwrite)  // an overwrite target's buffer holds no values yet: zero it to add into
      for (const auto& [g, size] : {std::pair{dq, y.size()}, {dk, k.value().size()}, {dv, v.value().size()}})
        if (g.overwrite) std::fill_n(g.data, size, 0.0f);
    kernels::attention_backward(dq.data, dk.data, dv.data, dy.data(), y.data(), lse.data(), q.value().data(),
                                k.value().data(), v.value().data(), shape, overwrite);
  }, bytes);
}

Var cross_entropy(const Var& logits, std::span<const std::int32_t> targets) {
  std::size_t vocab = last_dim(logits, "cross_entropy");
  std::size_t rows = logits.value().size() / std::max<std::size_t>(vocab, 1);
  if (targets.size() != rows)
    throw std::invalid_argument(fmt::format("cross_entropy: logits {} have {} rows but {} targets were given",
                                            to_string(logits.shape()), rows, targets.size()));
  if (rows == 0) throw std::invalid_argument("cross_entropy: no rows");
  check_ids("cross_entropy", targets, vocab);
  Op op("cross_entropy", {logits});
  Tensor lse = Tensor::uninitialized({rows});  // (rows)
  Tensor y = Tensor::scalar(kernels::cross_entropy_forward(lse.data(), logits.value().data(), targets.data(), rows, vocab));
  std::vector<std::int32_t> saved;
  if (op.recording()) saved.assign(targets.begin(), targets.end());
  std::size_t bytes = lse.bytes() + saved.size() * sizeof(std::int32_t);
  // dlogits += dy (softmax(logits) - onehot(target)) / rows
  return op.finish(std::move(y), [logits, lse = std::move(lse), targets = std::move(saved), rows,
                                  vocab](const Tensor& dy, const Tensor&) {
    if (float* dl = grad_ptr(logits))
      kernels::cross_entropy_backward(dl, dy[0], logits.value().data(), lse.data(), targets.data(), rows, vocab);
  }, bytes);
}

}  // namespace tapegrad
