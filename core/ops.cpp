// Differentiable ops: validate, forward (kernel), record the backward, return.
#include "core/ops.h"

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

namespace tapegrad {

namespace {

// The tape to record on: the current one if any input needs a gradient, else null. Inputs made
// on a tape that was cleared since cannot take part in a new graph.
Tape* recording_tape(const char* op, std::initializer_list<const Var*> inputs) {
  Tape* tape = Tape::current();
  if (!tape) return nullptr;
  bool any = false;
  for (const Var* v : inputs) {
    const Node& n = v->node();
    if (n.tape && !tape_value_is_live(n))
      throw std::logic_error(fmt::format("{}: an input of shape {} was computed on a tape that has since been "
                                         "cleared or spent; recompute it on the current tape",
                                         op, to_string(n.value.shape())));
    any = any || n.requires_grad;
  }
  return any ? tape : nullptr;
}

Tensor* grad_if_needed(Node& n) {
  if (!n.requires_grad) return nullptr;
  if (n.grad.empty()) n.grad = Tensor(n.value.shape());
  return &n.grad;
}

float* grad_ptr(Node& n) {
  Tensor* g = grad_if_needed(n);
  return g ? g->data() : nullptr;
}

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
  std::size_t batch, M, K, N;
  Shape out_shape;
  bool batched = sa.size() == 3 && sb.size() == 3;
  if (batched) {
    if (sa[0] != sb[0]) throw mismatch("batch sizes differ");
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

  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized(out_shape);
  for (std::size_t i = 0; i < batch; ++i)
    kernels::gemm<float>(transpose_a, transpose_b, M, N, K, 1.0f, a.value().data() + i * stride_a, lda,
                         b.value().data() + i * stride_b, ldb, 0.0f, out->value.data() + i * stride_c, N);

  if (Tape* tape = recording_tape("matmul", {&a, &b})) {
    // C = op(A) op(B): d op(A) = dC op(B)^T, d op(B) = op(A)^T dC; transposing back gives the
    // four flag combinations below.
    tape->record(out, [an = a.node_ptr(), bn = b.node_ptr(), transpose_a, transpose_b, batch, M, N, K, lda, ldb,
                       stride_a, stride_b, stride_c](Node& o) {
      float* da = grad_ptr(*an);
      float* db = grad_ptr(*bn);
      for (std::size_t i = 0; i < batch; ++i) {
        const float* A = an->value.data() + i * stride_a;
        const float* B = bn->value.data() + i * stride_b;
        const float* dC = o.grad.data() + i * stride_c;
        if (da && !transpose_a) kernels::gemm<float>(false, !transpose_b, M, K, N, 1, dC, N, B, ldb, 1, da + i * stride_a, K);
        if (da && transpose_a) kernels::gemm<float>(transpose_b, true, K, M, N, 1, B, ldb, dC, N, 1, da + i * stride_a, M);
        if (db && !transpose_b) kernels::gemm<float>(!transpose_a, false, K, N, M, 1, A, lda, dC, N, 1, db + i * stride_b, N);
        if (db && transpose_b) kernels::gemm<float>(true, transpose_a, N, K, M, 1, dC, N, A, lda, 1, db + i * stride_b, K);
      }
    }, 0);
  }
  return Var(out);
}

Var add_matmul(const Var& r, const Var& x, const Var& w, const Tensor* known_y) {
  const Shape &sx = x.shape(), &sw = w.shape();
  if (sw.size() != 2 || sx.empty() || sx.back() != sw[0])
    throw std::invalid_argument(fmt::format("add_matmul: expected x (.., K) and w (K, N); x is {}, w is {}",
                                            to_string(sx), to_string(sw)));
  const std::size_t K = sw[0], N = sw[1], M = x.value().size() / std::max<std::size_t>(K, 1);
  Shape out_shape = sx;
  out_shape.back() = N;
  expect_shape("add_matmul", "r", r.shape(), out_shape);
  auto out = std::make_shared<Node>();
  if (known_y) {
    expect_shape("add_matmul", "known_y", known_y->shape(), out_shape);
    out->value = *known_y;
  } else {
    out->value = Tensor::uninitialized(out_shape);
    kernels::add_matmul_forward(out->value.data(), r.value().data(), x.value().data(), w.value().data(), M, K, N);
  }
  if (Tape* tape = recording_tape("add_matmul", {&r, &x, &w})) {
    tape->record(out, [rn = r.node_ptr(), xn = x.node_ptr(), wn = w.node_ptr(), M, K, N](Node& o) {
      kernels::add_matmul_backward(grad_ptr(*rn), grad_ptr(*xn), grad_ptr(*wn), o.grad.data(), xn->value.data(),
                                   wn->value.data(), M, K, N);
    }, 0);
  }
  return Var(out);
}

Var add(const Var& a, const Var& b) {
  expect_shape("add", "b", b.shape(), a.shape());
  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized(a.shape());
  kernels::add_forward(out->value.data(), a.value().data(), b.value().data(), out->value.size());
  if (Tape* tape = recording_tape("add", {&a, &b})) {
    tape->record(out, [an = a.node_ptr(), bn = b.node_ptr()](Node& o) {
      if (float* da = grad_ptr(*an)) kernels::accumulate(da, o.grad.data(), o.grad.size());
      if (float* db = grad_ptr(*bn)) kernels::accumulate(db, o.grad.data(), o.grad.size());
    }, 0);
  }
  return Var(out);
}

Var add_bias(const Var& x, const Var& bias) {
  std::size_t cols = last_dim(x, "add_bias");
  expect_shape("add_bias", "bias", bias.shape(), Shape{cols});
  std::size_t rows = x.value().size() / std::max<std::size_t>(cols, 1);
  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized(x.shape());
  kernels::add_bias_forward(out->value.data(), x.value().data(), bias.value().data(), rows, cols);
  if (Tape* tape = recording_tape("add_bias", {&x, &bias})) {
    tape->record(out, [xn = x.node_ptr(), bn = bias.node_ptr(), rows, cols](Node& o) {
      kernels::add_bias_backward(grad_ptr(*xn), grad_ptr(*bn), o.grad.data(), rows, cols);
    }, 0);
  }
  return Var(out);
}

Var mul(const Var& a, const Var& b) {
  expect_shape("mul", "b", b.shape(), a.shape());
  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized(a.shape());
  kernels::mul_forward(out->value.data(), a.value().data(), b.value().data(), out->value.size());
  if (Tape* tape = recording_tape("mul", {&a, &b})) {
    tape->record(out, [an = a.node_ptr(), bn = b.node_ptr()](Node& o) {
      kernels::mul_backward(grad_ptr(*an), grad_ptr(*bn), o.grad.data(), an->value.data(), bn->value.data(),
                            o.grad.size());
    }, 0);
  }
  return Var(out);
}

Var scale(const Var& x, float s) {
  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized(x.shape());
  kernels::scale_forward(out->value.data(), x.value().data(), s, out->value.size());
  if (Tape* tape = recording_tape("scale", {&x})) {
    tape->record(out, [xn = x.node_ptr(), s](Node& o) {
      kernels::scale_backward(grad_ptr(*xn), o.grad.data(), s, o.grad.size());
    }, 0);
  }
  return Var(out);
}

Var reshape(const Var& x, Shape shape) {
  auto out = std::make_shared<Node>();
  out->value = x.value().reshaped(std::move(shape));
  if (Tape* tape = recording_tape("reshape", {&x})) {
    tape->record(out, [xn = x.node_ptr()](Node& o) {
      if (float* dx = grad_ptr(*xn)) kernels::accumulate(dx, o.grad.data(), o.grad.size());
    }, 0);
  }
  return Var(out);
}

Var embedding(const Var& table, std::span<const std::int32_t> ids) {
  if (table.shape().size() != 2)
    throw std::invalid_argument(fmt::format("embedding: expected a (V, D) table, got {}", to_string(table.shape())));
  std::size_t vocab = table.shape()[0], dim = table.shape()[1];
  check_ids("embedding", ids, vocab);
  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized({ids.size(), dim});
  kernels::embedding_forward(out->value.data(), table.value().data(), ids.data(), ids.size(), dim);
  if (Tape* tape = recording_tape("embedding", {&table})) {
    std::vector<std::int32_t> saved(ids.begin(), ids.end());
    std::size_t bytes = saved.size() * sizeof(std::int32_t);
    tape->record(out, [tn = table.node_ptr(), ids = std::move(saved), dim](Node& o) {
      if (float* dt = grad_ptr(*tn)) kernels::embedding_backward(dt, o.grad.data(), ids.data(), ids.size(), dim);
    }, bytes);
  }
  return Var(out);
}

Var rms_norm(const Var& x, const Var& weight, float eps) {
  std::size_t dim = last_dim(x, "rms_norm");
  expect_shape("rms_norm", "weight", weight.shape(), Shape{dim});
  std::size_t rows = x.value().size() / std::max<std::size_t>(dim, 1);
  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized(x.shape());
  Tape* tape = recording_tape("rms_norm", {&x, &weight});
  Tensor rstd = Tensor::uninitialized({rows});
  kernels::rms_norm_forward(out->value.data(), rstd.data(), x.value().data(), weight.value().data(), rows, dim, eps);
  if (tape) {
    std::size_t bytes = rstd.bytes();
    tape->record(out, [xn = x.node_ptr(), wn = weight.node_ptr(), rstd = std::move(rstd), rows, dim](Node& o) {
      kernels::rms_norm_backward(grad_ptr(*xn), grad_ptr(*wn), o.grad.data(), xn->value.data(), wn->value.data(),
                                 rstd.data(), rows, dim);
    }, bytes);
  }
  return Var(out);
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
  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized(s);
  kernels::rope_forward(out->value.data(), x.value().data(), *table, batch, seq_len, n_heads, head_dim, offset);
  if (Tape* tape = recording_tape("rope", {&x})) {
    tape->record(out, [xn = x.node_ptr(), table, batch, seq_len, n_heads, head_dim, offset](Node& o) {
      if (float* dx = grad_ptr(*xn))
        kernels::rope_backward(dx, o.grad.data(), *table, batch, seq_len, n_heads, head_dim, offset);
    }, 0);
  }
  return Var(out);
}

Var silu(const Var& x) {
  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized(x.shape());
  kernels::silu_forward(out->value.data(), x.value().data(), x.value().size());
  if (Tape* tape = recording_tape("silu", {&x})) {
    tape->record(out, [xn = x.node_ptr()](Node& o) {
      if (float* dx = grad_ptr(*xn)) kernels::silu_backward(dx, o.grad.data(), xn->value.data(), o.grad.size());
    }, 0);
  }
  return Var(out);
}

Var swiglu(const Var& a, const Var& b) {
  expect_shape("swiglu", "b", b.shape(), a.shape());
  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized(a.shape());
  kernels::swiglu_forward(out->value.data(), a.value().data(), b.value().data(), a.value().size());
  if (Tape* tape = recording_tape("swiglu", {&a, &b})) {
    tape->record(out, [an = a.node_ptr(), bn = b.node_ptr()](Node& o) {
      kernels::swiglu_backward(grad_ptr(*an), grad_ptr(*bn), o.grad.data(), an->value.data(), bn->value.data(),
                               o.grad.size());
    }, 0);
  }
  return Var(out);
}

Var attention(const Var& q, const Var& k, const Var& v, std::size_t n_heads) {
  const Shape& s = q.shape();
  if (s.size() != 3 || n_heads == 0 || s[2] % n_heads != 0)
    throw std::invalid_argument(
        fmt::format("attention: expected q (B, T, H*Dh) with {} heads, got {}", n_heads, to_string(s)));
  expect_shape("attention", "k", k.shape(), s);
  expect_shape("attention", "v", v.shape(), s);
  kernels::AttentionShape shape{s[0], s[1], s[1], n_heads, s[2] / n_heads, 0};
  auto out = std::make_shared<Node>();
  out->value = Tensor::uninitialized(s);
  Tensor lse = Tensor::uninitialized({s[0], n_heads, s[1]});
  kernels::attention_forward(out->value.data(), lse.data(), q.value().data(), k.value().data(), v.value().data(),
                             shape);
  if (Tape* tape = recording_tape("attention", {&q, &k, &v})) {
    std::size_t bytes = lse.bytes();
    tape->record(out, [qn = q.node_ptr(), kn = k.node_ptr(), vn = v.node_ptr(), lse = std::move(lse),
                       shape](Node& o) {
      kernels::attention_backward(grad_ptr(*qn), grad_ptr(*kn), grad_ptr(*vn), o.grad.data(), o.value.data(),
                                  lse.data(), qn->value.data(), kn->value.data(), vn->value.data(), shape);
    }, bytes);
  }
  return Var(out);
}

Var cross_entropy(const Var& logits, std::span<const std::int32_t> targets) {
  std::size_t vocab = last_dim(logits, "cross_entropy");
  std::size_t rows = logits.value().size() / std::max<std::size_t>(vocab, 1);
  if (targets.size() != rows)
    throw std::invalid_argument(fmt::format("cross_entropy: logits {} have {} rows but {} targets were given",
                                            to_string(logits.shape()), rows, targets.size()));
  if (rows == 0) throw std::invalid_argument("cross_entropy: no rows");
  check_ids("cross_entropy", targets, vocab);
  Tensor lse = Tensor::uninitialized({rows});
  auto out = std::make_shared<Node>();
  out->value = Tensor::scalar(kernels::cross_entropy_forward(lse.data(), logits.value().data(), targets.data(), rows, vocab));
  if (Tape* tape = recording_tape("cross_entropy", {&logits})) {
    std::vector<std::int32_t> saved(targets.begin(), targets.end());
    std::size_t bytes = lse.bytes() + saved.size() * sizeof(std::int32_t);
    tape->record(out, [ln = logits.node_ptr(), lse = std::move(lse), targets = std::move(saved), rows,
                       vocab](Node& o) {
      if (float* dl = grad_ptr(*ln))
        kernels::cross_entropy_backward(dl, o.grad[0], ln->value.data(), lse.data(), targets.data(), rows, vocab);
    }, bytes);
  }
  return Var(out);
}

Var sum(const Var& x) {
  double total = 0;
  for (std::size_t i = 0; i < x.value().size(); ++i) total += x.value()[i];
  auto out = std::make_shared<Node>();
  out->value = Tensor::scalar(float(total));
  if (Tape* tape = recording_tape("sum", {&x})) {
    tape->record(out, [xn = x.node_ptr()](Node& o) {
      if (Tensor* dx = grad_if_needed(*xn))
        for (std::size_t i = 0; i < dx->size(); ++i) (*dx)[i] += o.grad[0];
    }, 0);
  }
  return Var(out);
}

Var mean(const Var& x) {
  if (x.value().size() == 0) throw std::invalid_argument("mean: empty tensor");
  return scale(sum(x), 1.0f / float(x.value().size()));
}

}  // namespace tapegrad
