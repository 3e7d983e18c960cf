// Each fused op against the same computation written with the general primitives: values and
// the gradients of every input agree. Tolerance: 2e-5 absolute + 1e-4 relative
// per element; both sides are float32 with the same inputs, so they differ only by rounding in
// a different order of operations (observed max differences are around 1e-6).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "core/ops.h"
#include "support/checks.h"

using namespace tapegrad;

namespace {

using Fn = std::function<Var(const std::vector<Var>&)>;

// y and the gradients of sum(y * R) with respect to every input.
std::vector<Tensor> value_and_grads(const Fn& f, const std::vector<Tensor>& inputs) {
  std::vector<Var> leaves;
  for (const Tensor& t : inputs) leaves.emplace_back(t, true);
  Tape tape;
  Var y = f(leaves);
  Tensor R = test::random_tensor(y.shape(), 99);
  tape.backward(sum(mul(y, Var(R))));
  std::vector<Tensor> out = {y.value()};
  for (const Var& v : leaves) out.push_back(v.grad());
  return out;
}

void check_same(const char* what, const Fn& fused, const Fn& composed, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> a = value_and_grads(fused, inputs), b = value_and_grads(composed, inputs);
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    CAPTURE(what);
    CAPTURE(k);  // 0: the value, k: the gradient of input k - 1
    REQUIRE(a[k].shape() == b[k].shape());
    for (std::size_t i = 0; i < a[k].size(); ++i)
      CHECK(std::fabs(a[k][i] - b[k][i]) <= 2e-5 + 1e-4 * std::fabs(b[k][i]));
  }
}

}  // namespace

TEST_CASE("rms_norm equals x * rsqrt(mean(x^2) + eps) * w") {
  check_same("rms_norm", [](const std::vector<Var>& v) { return rms_norm(v[0], v[1]); },
             [](const std::vector<Var>& v) { return v[0] * rsqrt(mean(square(v[0]), -1, true) + 1e-5f) * v[1]; },
             {test::random_tensor({2, 3, 8}, 1), test::random_tensor({8}, 2)});
}

TEST_CASE("swiglu equals silu(a) * b") {
  check_same("swiglu", [](const std::vector<Var>& v) { return swiglu(v[0], v[1]); },
             [](const std::vector<Var>& v) { return silu(v[0]) * v[1]; },
             {test::random_tensor({4, 6}, 3), test::random_tensor({4, 6}, 4)});
}

TEST_CASE("layer_norm equals (x - mean) / sqrt(var + eps) * w + b") {
  check_same("layer_norm", [](const std::vector<Var>& v) { return layer_norm(v[0], v[1], v[2]); },
             [](const std::vector<Var>& v) {
               Var centred = v[0] - mean(v[0], -1, true);
               return centred / sqrt(mean(square(centred), -1, true) + 1e-5f) * v[1] + v[2];
             },
             {test::random_tensor({2, 3, 8}, 5, 2.0f), test::random_tensor({8}, 6), test::random_tensor({8}, 7)});
}

TEST_CASE("cross_entropy equals -mean of log_softmax at the targets, with and without an ignored id") {
  const std::size_t rows = 6, vocab = 5;
  std::vector<std::int32_t> targets = test::random_ids(rows, vocab, 8);
  Tensor onehot({2, 3, vocab});
  for (std::size_t r = 0; r < rows; ++r) onehot[r * vocab + std::size_t(targets[r])] = 1;
  Fn composed = [&](const std::vector<Var>& v) {
    return -sum(log_softmax(v[0], -1) * Var(onehot)) / float(rows);
  };
  Tensor logits = test::random_tensor({2, 3, vocab}, 9);
  check_same("cross_entropy", [&](const std::vector<Var>& v) { return cross_entropy(v[0], targets); }, composed, {logits});
  check_same("cross_entropy (ignore_index, none ignored)",
             [&](const std::vector<Var>& v) { return cross_entropy(v[0], targets, -1); }, composed, {logits});
  std::vector<std::int32_t> some = targets;
  some[1] = some[4] = -1;
  Tensor kept = onehot;
  for (std::size_t j = 0; j < vocab; ++j) kept[1 * vocab + j] = kept[4 * vocab + j] = 0;
  check_same("cross_entropy (ignore_index)", [&](const std::vector<Var>& v) { return cross_entropy(v[0], some, -1); },
             [&](const std::vector<Var>& v) { return -sum(log_softmax(v[0], -1) * Var(kept)) / float(rows - 2); },
             {logits});
}

TEST_CASE("attention equals softmax(q k^T / sqrt(Dh) + causal mask) v over heads") {
  const std::size_t B = 2, T = 5, H = 2, Dh = 4, D = H * Dh;
  Tensor mask({T, T});  // -inf above the diagonal
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = i + 1; j < T; ++j) mask[i * T + j] = -std::numeric_limits<float>::infinity();
  auto heads = [&](const Var& x) { return permute(reshape(x, {B, T, H, Dh}), {0, 2, 1, 3}); };  // (B, H, T, Dh)
  check_same("attention", [&](const std::vector<Var>& v) { return attention(v[0], v[1], v[2], H); },
             [&](const std::vector<Var>& v) {
               Var scores = matmul(heads(v[0]), heads(v[1]), false, true) / std::sqrt(float(Dh)) + Var(mask);
               Var out = matmul(softmax(scores, -1), heads(v[2]));  // (B, H, T, Dh)
               return reshape(permute(out, {0, 2, 1, 3}), {B, T, D});
             },
             {test::random_tensor({B, T, D}, 10), test::random_tensor({B, T, D}, 11), test::random_tensor({B, T, D}, 12)});
}

TEST_CASE("rope equals rotating the interleaved pairs with cos and sin tables") {
  const std::size_t B = 2, T = 3, H = 2, Dh = 4, D = H * Dh, offset = 2;
  auto table = std::make_shared<kernels::RopeTable<float>>(kernels::make_rope_table<float>(8, Dh));
  Tensor cos({T, 1, Dh / 2, 1}), sin({T, 1, Dh / 2, 1});
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t i = 0; i < Dh / 2; ++i) {
      cos[t * Dh / 2 + i] = table->cos[(offset + t) * table->half + i];
      sin[t * Dh / 2 + i] = table->sin[(offset + t) * table->half + i];
    }
  check_same("rope", [&](const std::vector<Var>& v) { return rope(v[0], table, H, offset); },
             [&](const std::vector<Var>& v) {
               Var pairs = reshape(v[0], {B, T, H, Dh / 2, 2});
               Var x0 = slice(pairs, -1, 0, 1), x1 = slice(pairs, -1, 1, 2);
               Var c(cos), s(sin);
               return reshape(cat({x0 * c - x1 * s, x0 * s + x1 * c}, -1), {B, T, D});
             },
             {test::random_tensor({B, T, D}, 13)});
}
