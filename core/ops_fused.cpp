// The fused ops (core/ops.h's second tier): each one kernel forward and one backward where its
// composition from the primitives would take several, tested against that composition
// (tests/core/test_fused_vs_composed.cpp): embedding, rms_norm, layer_norm, rope, swiglu,
// attention, cross_entropy, and linear_cross_entropy, the head and its loss, whose logits are
// never whole. Each: validate, forward (kernel), record the backward, return.
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

// linear_cross_entropy's logits held at once: at most this many floats (48 MiB), in chunks of equal
// rows (at SmolLM2's vocabulary of 49,152 the logits of 1024 rows and their gradient would be
// 200 MB each). Each chunk's products pack the weight again: SmolLM2's 1024 rows in 4 chunks of 256
// rather than 7 of 147 took a float32 step at 2 threads of a Zen 4 from 209-222 to 221-223 tokens/s
// (4 alternated pairs), its peak with remat from 2,248 to 2,268 MiB.
constexpr std::size_t max_chunk_floats = std::size_t(3) << 22;

std::size_t chunk_rows_for(std::size_t rows, std::size_t vocab) {
  const std::size_t most = std::max<std::size_t>(1, max_chunk_floats / vocab);
  const std::size_t chunks = (rows + most - 1) / most;
  return (rows + chunks - 1) / chunks;
}

}  // namespace

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

// xhat = (x - mean) rstd, y = xhat w + b. With g = dy w:
//   dx = rstd (g - mean(g) - xhat mean(g xhat)); dw += sum_rows dy xhat; db += sum_rows dy
Var layer_norm(const Var& x, const Var& weight, const Var& bias, float eps) {
  if (x.shape().empty()) throw std::invalid_argument("layer_norm: expected x (.., D), got a scalar");
  std::size_t dim = x.shape().back(), rows = x.value().size() / std::max<std::size_t>(dim, 1);
  if (weight.shape() != Shape{dim} || bias.shape() != Shape{dim})
    throw std::invalid_argument(fmt::format("layer_norm: expected weight and bias [{}] for x {}, got {} and {}", dim,
                                            to_string(x.shape()), to_string(weight.shape()), to_string(bias.shape())));
  Op op("layer_norm", {x, weight, bias});
  Tensor y = Tensor::uninitialized(x.shape());
  Tensor mean = Tensor::uninitialized({rows}), rstd = Tensor::uninitialized({rows});  // (rows)
  kernels::layer_norm_forward(y.data(), mean.data(), rstd.data(), x.value().data(), weight.value().data(),
                              bias.value().data(), rows, dim, eps);
  std::size_t bytes = mean.bytes() + rstd.bytes();
  return op.finish(std::move(y), [x, weight, bias, mean = std::move(mean), rstd = std::move(rstd), rows,
                                  dim](const Tensor& dy, const Tensor&) {
    kernels::layer_norm_backward(grad_ptr(x), grad_ptr(weight), grad_ptr(bias), dy.data(), x.value().data(),
                                 weight.value().data(), mean.data(), rstd.data(), rows, dim);
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

// Its products run at the thread's matmul precision (core/precision.h), as matmul's.
Var linear_cross_entropy(const Var& x, const Var& weight, std::span<const std::int32_t> targets, bool transpose_weight,
                         const Var& bias) {
  const Shape &sx = x.shape(), &sw = weight.shape();
  auto fail = [&](const std::string& why) {
    return std::invalid_argument(fmt::format("linear_cross_entropy: {}; x is {}, weight is {}{}{}", why, to_string(sx),
                                             to_string(sw), transpose_weight ? " (transposed)" : "",
                                             bias.defined() ? ", bias is " + to_string(bias.shape()) : ""));
  };
  if (sx.empty() || sw.size() != 2) throw fail("expected x (.., D) and a 2-D weight");
  const std::size_t dim = sx.back(), vocab = transpose_weight ? sw[0] : sw[1];
  if ((transpose_weight ? sw[1] : sw[0]) != dim) throw fail("the weight's input size is not x's last size");
  if (bias.defined() && bias.shape() != Shape{vocab}) throw fail("the bias is not (V)");
  const std::size_t rows = x.value().size() / std::max<std::size_t>(dim, 1);
  if (rows == 0 || vocab == 0) throw fail("no rows or no classes");
  if (targets.size() != rows) throw fail(fmt::format("{} rows but {} targets", rows, targets.size()));
  for (std::size_t i = 0; i < rows; ++i)
    if (targets[i] < 0 || std::size_t(targets[i]) >= vocab)
      throw std::out_of_range(fmt::format("linear_cross_entropy: target {} at index {} is outside the vocabulary of "
                                          "size {}",
                                          targets[i], i, vocab));

  std::vector<Var> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  Op op("linear_cross_entropy", inputs);
  // The gradients are made with the logits, while each chunk is at hand (the loss is the last op:
  // backward only scales them by d result): x's, the weight's and the bias's sizes are saved.
  auto fresh = [&](const Var& v) {
    return op.recording() && v.defined() && v.requires_grad() ? Tensor::uninitialized(v.shape()) : Tensor();
  };
  Tensor dx = fresh(x), dweight = fresh(weight), dbias = fresh(bias);
  const std::size_t chunk_rows = chunk_rows_for(rows, vocab);
  Tensor scratch = Tensor::uninitialized({chunk_rows, vocab});  // a chunk's logits, then their gradient
  auto data = [](Tensor& t) { return t.empty() ? nullptr : t.data(); };
  const float loss = kernels::linear_cross_entropy(
      data(dx), data(dweight), data(dbias), x.value().data(), weight.value().data(),
      bias.defined() ? bias.value().data() : nullptr, targets.data(), rows, dim, vocab, transpose_weight, chunk_rows,
      scratch.data(), /*overwrite=*/true, /*bf16_products=*/matmul_precision() == Precision::bf16);
  scratch = Tensor();
  const std::size_t bytes = dx.bytes() + dweight.bytes() + dbias.bytes();
  // d input += d result * (d loss / d input), the latter computed above.
  return op.finish(Tensor::scalar(loss), [x, weight, bias, dx = std::move(dx), dweight = std::move(dweight),
                                          dbias = std::move(dbias)](const Tensor& dy, const Tensor&) mutable {
    auto hand_over = [&](const Var& input, Tensor& saved) {
      if (saved.empty()) return;
      const std::size_t size = saved.size();
      if (adopt_grad(input, saved)) {  // the first gradient to reach the input: handed over, not copied
        // x * 1 is x, bit for bit: the loss's usual d result of 1 skips a pass over the weight's
        // gradient (113 MB read and written at SmolLM2's tied head).
        if (float* g = grad_ptr(input); dy[0] != 1.0f) kernels::scale_forward(g, g, dy[0], size);
        return;
      }
      if (float* g = grad_ptr(input)) kernels::scale_backward(g, saved.data(), dy[0], size);
    };
    hand_over(x, dx);
    hand_over(weight, dweight);
    if (bias.defined()) hand_over(bias, dbias);
  }, bytes);
}

}  // namespace tapegrad
