// Row ops of neural nets on general axes: softmax, log_softmax, cross_entropy with an ignored
// target, dropout and mse_loss. Plain portable loops; rows are (outer, n, inner) views.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/kernels.h"
#include "core/ops.h"
#include "core/random.h"

namespace tapegrad {

// y = exp(x - max) / sum exp(x - max) along the axis; dx = y (dy - sum_k dy y)
Var softmax(const Var& x, int axis) {
  std::size_t a = axis_index("softmax", axis, x.shape());
  // Named variables, not a structured binding: clang 14 cannot capture bindings in lambdas.
  const AxisSplit split = split_at_axis(x.shape(), a);
  const std::size_t outer = split.outer, n = split.n, inner = split.inner;
  Op op("softmax", {x});
  Tensor y = Tensor::uninitialized(x.shape());
  const Tensor& xv = x.value();
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t i = 0; i < inner; ++i) {
      auto at = [&](std::size_t k) { return (o * n + k) * inner + i; };
      float m = -std::numeric_limits<float>::infinity();
      for (std::size_t k = 0; k < n; ++k) m = std::max(m, xv[at(k)]);
      double total = 0;
      for (std::size_t k = 0; k < n; ++k) total += y[at(k)] = std::exp(xv[at(k)] - m);
      for (std::size_t k = 0; k < n; ++k) y[at(k)] = float(y[at(k)] / total);
    }
  return op.finish(std::move(y), [x, outer, n, inner](const Tensor& dy, const Tensor& yv) {
    float* dx = grad_ptr(x);
    if (!dx) return;
    for (std::size_t o = 0; o < outer; ++o)
      for (std::size_t i = 0; i < inner; ++i) {
        auto at = [&](std::size_t k) { return (o * n + k) * inner + i; };
        double dot = 0;
        for (std::size_t k = 0; k < n; ++k) dot += double(dy[at(k)]) * yv[at(k)];
        for (std::size_t k = 0; k < n; ++k) dx[at(k)] += yv[at(k)] * float(dy[at(k)] - dot);
      }
  });
}

// y = x - logsumexp(x) along the axis; dx = dy - exp(y) sum_k dy
Var log_softmax(const Var& x, int axis) {
  std::size_t a = axis_index("log_softmax", axis, x.shape());
  // Named variables, not a structured binding: clang 14 cannot capture bindings in lambdas.
  const AxisSplit split = split_at_axis(x.shape(), a);
  const std::size_t outer = split.outer, n = split.n, inner = split.inner;
  Op op("log_softmax", {x});
  Tensor y = Tensor::uninitialized(x.shape());
  const Tensor& xv = x.value();
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t i = 0; i < inner; ++i) {
      auto at = [&](std::size_t k) { return (o * n + k) * inner + i; };
      float m = -std::numeric_limits<float>::infinity();
      for (std::size_t k = 0; k < n; ++k) m = std::max(m, xv[at(k)]);
      double total = 0;
      for (std::size_t k = 0; k < n; ++k) total += std::exp(double(xv[at(k)]) - m);
      float lse = float(m + std::log(total));
      for (std::size_t k = 0; k < n; ++k) y[at(k)] = xv[at(k)] - lse;
    }
  return op.finish(std::move(y), [x, outer, n, inner](const Tensor& dy, const Tensor& yv) {
    float* dx = grad_ptr(x);
    if (!dx) return;
    for (std::size_t o = 0; o < outer; ++o)
      for (std::size_t i = 0; i < inner; ++i) {
        auto at = [&](std::size_t k) { return (o * n + k) * inner + i; };
        double total = 0;
        for (std::size_t k = 0; k < n; ++k) total += dy[at(k)];
        for (std::size_t k = 0; k < n; ++k) dx[at(k)] += dy[at(k)] - std::exp(yv[at(k)]) * float(total);
      }
  });
}

// loss = (1/C) sum over counted rows r of lse_r - x[r, t_r];  dx[r] += dy/C (softmax(x[r]) - onehot(t_r))
Var cross_entropy(const Var& logits, std::span<const std::int32_t> targets, std::int32_t ignore_index) {
  if (logits.shape().empty()) throw std::invalid_argument("cross_entropy: expected logits (.., V), got a scalar");
  std::size_t vocab = logits.shape().back(), rows = logits.value().size() / std::max<std::size_t>(vocab, 1);
  if (targets.size() != rows)
    throw std::invalid_argument(fmt::format("cross_entropy: logits {} have {} rows but {} targets were given",
                                            to_string(logits.shape()), rows, targets.size()));
  std::size_t counted = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    if (targets[r] == ignore_index) continue;
    if (targets[r] < 0 || std::size_t(targets[r]) >= vocab)
      throw std::out_of_range(fmt::format("cross_entropy: target {} at row {} is outside the vocabulary of size {} "
                                          "(ignore_index is {})",
                                          targets[r], r, vocab, ignore_index));
    ++counted;
  }
  if (counted == 0)
    throw std::invalid_argument(fmt::format("cross_entropy: every one of the {} targets is ignore_index {}", rows,
                                            ignore_index));
  Op op("cross_entropy", {logits});
  Tensor lse = Tensor::uninitialized({rows});  // (rows)
  const float* xv = logits.value().data();
  double total = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = xv + r * vocab;
    float m = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < vocab; ++j) m = std::max(m, row[j]);
    double s = 0;
    for (std::size_t j = 0; j < vocab; ++j) s += std::exp(double(row[j]) - m);
    lse[r] = float(m + std::log(s));
    if (targets[r] != ignore_index) total += lse[r] - row[targets[r]];
  }
  std::vector<std::int32_t> saved(targets.begin(), targets.end());
  std::size_t bytes = lse.bytes() + saved.size() * sizeof(std::int32_t);
  return op.finish(Tensor::scalar(float(total / double(counted))),
                   [logits, lse = std::move(lse), targets = std::move(saved), ignore_index, counted, rows,
                    vocab](const Tensor& dy, const Tensor&) {
                     float* dx = grad_ptr(logits);
                     if (!dx) return;
                     float scale = dy[0] / float(counted);
                     const float* xv = logits.value().data();
                     for (std::size_t r = 0; r < rows; ++r) {
                       if (targets[r] == ignore_index) continue;
                       for (std::size_t j = 0; j < vocab; ++j)
                         dx[r * vocab + j] += scale * std::exp(xv[r * vocab + j] - lse[r]);
                       dx[r * vocab + std::size_t(targets[r])] -= scale;
                     }
                   },
                   bytes);
}

Var mse_loss(const Var& a, const Var& b) {
  if (a.shape() != b.shape())
    throw std::invalid_argument(
        fmt::format("mse_loss: a {} and b {} must have the same shape", to_string(a.shape()), to_string(b.shape())));
  return mean(square(sub(a, b)));
}

// y = x m with m = 0 (probability p) or 1 / (1 - p); dx += dy m. Saves m.
Var dropout(const Var& x, float p, bool training, Rng& rng) {
  if (!(p >= 0 && p < 1)) throw std::invalid_argument(fmt::format("dropout: p = {} must be in [0, 1)", p));
  if (!training || p == 0) return x;
  Op op("dropout", {x});
  Tensor mask = Tensor::uninitialized(x.shape());
  float keep_scale = 1 / (1 - p);
  for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = rng.uniform() < p ? 0.0f : keep_scale;
  Tensor y = Tensor::uninitialized(x.shape());
  kernels::mul_forward(y.data(), x.value().data(), mask.data(), y.size());
  std::size_t bytes = op.recording() ? mask.bytes() : 0;
  return op.finish(std::move(y), [x, mask = std::move(mask)](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x))
      for (std::size_t i = 0; i < dy.size(); ++i) dx[i] += dy[i] * mask[i];
  }, bytes);
}

}  // namespace tapegrad
