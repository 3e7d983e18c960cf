// linear_cross_entropy (the head fused with the loss): equal to matmul then cross_entropy, chunk
// by chunk, in float32 and bf16, and its gradients by central differences.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "core/ops.h"
#include "core/precision.h"
#include "support/checks.h"

using namespace tapegrad;

namespace {

// The kernel in double on n rows in chunks of chunk_rows: the loss, and dx, dw, db (written).
struct DoubleRun {
  double loss = 0;
  std::vector<double> dx, dw, db;
};
DoubleRun run_double(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>* bias,
                     const std::vector<std::int32_t>& targets, std::size_t dim, std::size_t vocab, bool transpose_w,
                     std::size_t chunk_rows, bool gradients) {
  const std::size_t n = targets.size();
  DoubleRun r;
  std::vector<double> scratch(chunk_rows * vocab);
  if (gradients) r.dx.resize(n * dim), r.dw.resize(dim * vocab), r.db.resize(vocab);
  auto ptr = [&](std::vector<double>& v) { return gradients ? v.data() : nullptr; };
  r.loss = kernels::linear_cross_entropy<double>(ptr(r.dx), ptr(r.dw), bias ? ptr(r.db) : nullptr, x.data(), w.data(),
                                                 bias ? bias->data() : nullptr, targets.data(), n, dim, vocab,
                                                 transpose_w, chunk_rows, scratch.data(), /*overwrite=*/true,
                                                 /*bf16_products=*/false);
  return r;
}

}  // namespace

TEST_CASE("linear_cross_entropy's gradients match central differences in double, chunk by chunk, either layout") {
  const std::size_t n = 7, dim = 5, vocab = 11, chunk_rows = 3;  // chunks of 3, 3 and 1 rows
  const std::vector<std::int32_t> targets = {10, 0, 3, 3, 7, 1, 9};
  for (bool transpose_w : {false, true}) {
    CAPTURE(transpose_w);
    auto x = test::random_vector<double>(n * dim, 1, 1.5);
    auto w = test::random_vector<double>(dim * vocab, 2, 1.0);
    auto b = test::random_vector<double>(vocab, 3, 0.5);
    const DoubleRun at = run_double(x, w, &b, targets, dim, vocab, transpose_w, chunk_rows, true);
    const std::vector<double> R = {0.7}, scaled = [&] {
      std::vector<double> all;
      for (const auto* g : {&at.dx, &at.dw, &at.db})
        for (double v : *g) all.push_back(0.7 * v);
      return all;
    }();
    auto loss = [&] { return std::vector<double>{run_double(x, w, &b, targets, dim, vocab, transpose_w, chunk_rows, false).loss}; };
    const auto part = [&](std::size_t begin, std::size_t size) {
      return std::vector<double>(scaled.begin() + std::ptrdiff_t(begin), scaled.begin() + std::ptrdiff_t(begin + size));
    };
    test::check_double("linear_cross_entropy dx", x, loss, R, part(0, n * dim));
    test::check_double("linear_cross_entropy dw", w, loss, R, part(n * dim, dim * vocab));
    test::check_double("linear_cross_entropy db", b, loss, R, part(n * dim + dim * vocab, vocab));
  }
}

TEST_CASE("linear_cross_entropy equals matmul then cross_entropy, values and gradients, with and without bias") {
  const std::vector<std::int32_t> targets = {4, 0, 12, 7, 7, 1};
  for (bool transpose_w : {false, true})
    for (bool with_bias : {false, true}) {
      CAPTURE(transpose_w);
      CAPTURE(with_bias);
      const Tensor x = test::random_tensor({2, 3, 6}, 1, 2.0f);
      const Tensor w = test::random_tensor(transpose_w ? Shape{13, 6} : Shape{6, 13}, 2);
      const Tensor b = test::random_tensor({13}, 3);
      auto run = [&](bool fused) {
        Var xv(x, true), wv(w, true), bv = with_bias ? Var(b, true) : Var();
        Tape tape;
        Var loss;
        if (fused) {
          loss = linear_cross_entropy(xv, wv, targets, transpose_w, bv);
        } else {
          Var logits = matmul(xv, wv, false, transpose_w);
          if (with_bias) logits = add_bias(logits, bv);
          loss = cross_entropy(logits, targets);
        }
        Var scaled = loss * 0.7f;  // a result gradient other than 1
        tape.backward(scaled);
        std::vector<Tensor> out = {loss.value(), xv.grad(), wv.grad()};
        if (with_bias) out.push_back(bv.grad());
        return out;
      };
      const std::vector<Tensor> fused = run(true), composed = run(false);
      for (std::size_t k = 0; k < fused.size(); ++k) {
        CAPTURE(k);  // 0: the loss, then dx, dw, db
        REQUIRE(fused[k].shape() == composed[k].shape());
        for (std::size_t i = 0; i < fused[k].size(); ++i)
          CHECK(std::fabs(fused[k][i] - composed[k][i]) <= 2e-6 + 1e-5 * std::fabs(composed[k][i]));
      }
    }
}

TEST_CASE("under bf16 precision linear_cross_entropy is the bf16 matmul then cross_entropy, bit for bit") {
  const std::vector<std::int32_t> targets = {4, 0, 12, 7, 7, 1};
  for (bool transpose_w : {false, true}) {
    CAPTURE(transpose_w);
    const Tensor x = test::random_tensor({2, 3, 6}, 1, 2.0f);
    const Tensor w = test::random_tensor(transpose_w ? Shape{13, 6} : Shape{6, 13}, 2);
    auto run = [&](bool fused, Precision precision) {
      PrecisionScope scope(precision);
      Var xv(x, true), wv(w, true);
      Tape tape;
      Var loss = fused ? linear_cross_entropy(xv, wv, targets, transpose_w)
                       : cross_entropy(matmul(xv, wv, false, transpose_w), targets);
      tape.backward(loss);
      return std::vector<Tensor>{loss.value(), xv.grad(), wv.grad()};
    };
    const std::vector<Tensor> fused = run(true, Precision::bf16), composed = run(false, Precision::bf16);
    for (std::size_t k = 0; k < fused.size(); ++k) {
      CAPTURE(k);  // 0: the loss, then dx, dw
      REQUIRE(fused[k].shape() == composed[k].shape());
      CHECK(std::memcmp(fused[k].data(), composed[k].data(), fused[k].bytes()) == 0);
    }
    // The products were rounded: float32's loss differs.
    CHECK(run(true, Precision::f32)[0].item() != fused[0].item());
  }
}

TEST_CASE("linear_cross_entropy's rows are cross_entropy's arithmetic, bit for bit (an identity projection)") {
  // x I is x exactly, so the loss and dx = g I^T must be cross_entropy_forward's and _backward's bits.
  const std::size_t n = 9, vocab = 37, chunk_rows = 4;
  const std::vector<std::int32_t> targets = {0, 36, 5, 5, 17, 2, 30, 11, 8};
  const Tensor x = test::random_tensor({n, vocab}, 5, 3.0f);
  std::vector<float> identity(vocab * vocab, 0.0f), scratch(chunk_rows * vocab), dx(n * vocab), dw(vocab * vocab);
  for (std::size_t i = 0; i < vocab; ++i) identity[i * vocab + i] = 1.0f;
  const float fused = kernels::linear_cross_entropy<float>(dx.data(), dw.data(), nullptr, x.data(), identity.data(),
                                                           nullptr, targets.data(), n, vocab, vocab, false, chunk_rows,
                                                           scratch.data(), true, false);
  std::vector<float> lse(n), dlogits(n * vocab, 0.0f);
  const float plain = kernels::cross_entropy_forward<float>(lse.data(), x.data(), targets.data(), n, vocab);
  kernels::cross_entropy_backward<float>(dlogits.data(), 1.0f, x.data(), lse.data(), targets.data(), n, vocab);
  CHECK(std::memcmp(&fused, &plain, sizeof(float)) == 0);
  CHECK(std::memcmp(dx.data(), dlogits.data(), dx.size() * sizeof(float)) == 0);
}

TEST_CASE("linear_cross_entropy outside a tape gives the loss and keeps no gradients") {
  const std::vector<std::int32_t> targets = {1, 2};
  Var x(test::random_tensor({2, 4}, 1), true), w(test::random_tensor({4, 3}, 2), true);
  const float expected = cross_entropy(matmul(x, w), targets).value().item();
  CHECK(linear_cross_entropy(x, w, targets).value().item() == doctest::Approx(expected).epsilon(1e-6));
  CHECK(!x.has_grad());
  CHECK(!w.has_grad());
}

TEST_CASE("linear_cross_entropy names the shapes and targets it refuses") {
  const std::vector<std::int32_t> two = {0, 1}, bad = {0, 5}, one = {0};
  Var x(Tensor({2, 4})), w(Tensor({4, 5}));
  CHECK(test::error_of([&] { linear_cross_entropy(x, Var(Tensor({3, 5})), two); }) ==
        "linear_cross_entropy: the weight's input size is not x's last size; x is [2, 4], weight is [3, 5]");
  CHECK(test::error_of([&] { linear_cross_entropy(x, w, two, true); }) ==
        "linear_cross_entropy: the weight's input size is not x's last size; x is [2, 4], weight is [4, 5] (transposed)");
  CHECK(test::error_of([&] { linear_cross_entropy(x, w, two, false, Var(Tensor({4}))); }) ==
        "linear_cross_entropy: the bias is not (V); x is [2, 4], weight is [4, 5], bias is [4]");
  CHECK(test::error_of([&] { linear_cross_entropy(x, w, one); }) ==
        "linear_cross_entropy: 2 rows but 1 targets; x is [2, 4], weight is [4, 5]");
  CHECK(test::error_of([&] { linear_cross_entropy(x, w, bad); }) ==
        "linear_cross_entropy: target 5 at index 1 is outside the vocabulary of size 5");
}

TEST_CASE("linear_cross_entropy hands its weight's gradient over when it is the first, and adds when it is not") {
  // Two heads on one weight (as a tied embedding and head): the later loss's backward runs first
  // and hands its gradient over; the earlier one adds into it.
  const std::vector<std::int32_t> targets = {4, 0, 12, 7};
  const Tensor x1 = test::random_tensor({4, 6}, 1), x2 = test::random_tensor({4, 6}, 2);
  const Tensor w = test::random_tensor({6, 13}, 3);
  auto run = [&](bool fused) {
    Var x1v(x1, true), x2v(x2, true), wv(w, true);
    Tape tape;
    auto head_loss = [&](const Var& x) {
      return fused ? linear_cross_entropy(x, wv, targets, false) : cross_entropy(matmul(x, wv), targets);
    };
    tape.backward(head_loss(x1v) * 0.3f + head_loss(x2v) * 0.7f);
    return std::vector<Tensor>{x1v.grad(), x2v.grad(), wv.grad()};
  };
  const std::vector<Tensor> fused = run(true), composed = run(false);
  for (std::size_t k = 0; k < fused.size(); ++k) {
    CAPTURE(k);
    REQUIRE(fused[k].shape() == composed[k].shape());
    for (std::size_t i = 0; i < fused[k].size(); ++i)
      CHECK(std::fabs(fused[k][i] - composed[k][i]) <= 2e-6 + 1e-5 * std::fabs(composed[k][i]));
  }
}

TEST_CASE("adopt_grad takes a gradient only for a value that needs one and has none yet, of its shape") {
  Var x(Tensor({2, 3}, 0.0f), true), frozen(Tensor({2, 3}, 0.0f), false);
  Tensor g({2, 3}, 1.5f);
  CHECK_FALSE(adopt_grad(frozen, g));
  CHECK(g.size() == 6);
  Tensor wrong({3, 2}, 0.0f);
  CHECK_THROWS_WITH_AS(adopt_grad(x, wrong), "adopt_grad: a gradient of shape [3, 2] for a value of shape [2, 3]",
                       std::invalid_argument);
  REQUIRE(adopt_grad(x, g));
  CHECK(g.empty());
  CHECK(x.grad()[5] == 1.5f);
  Tensor again({2, 3}, 2.0f);
  CHECK_FALSE(adopt_grad(x, again));  // x has a gradient now: the caller adds
  CHECK(x.grad()[0] == 1.5f);
}

TEST_CASE("under bf16 the fused head's chunks share one rounded weight: bf16_gemm's bits over many chunks and column blocks") {
  // Shapes past AMX column blocks (256), blocks of k (32) and whole tiles, in 4 chunks, whose
  // products are big enough to split over two threads.
  const std::size_t n = 100, dim = 150, vocab = 600, chunk_rows = 32;
  std::vector<std::int32_t> targets(n);
  for (std::size_t r = 0; r < n; ++r) targets[r] = std::int32_t(r * 37 % vocab);
  const Tensor x = test::random_tensor({n, dim}, 7, 2.0f);
  for (bool transpose_w : {false, true}) {
    CAPTURE(transpose_w);
    const Tensor w = test::random_tensor(transpose_w ? Shape{vocab, dim} : Shape{dim, vocab}, 8);
    const std::size_t ldw = transpose_w ? dim : vocab;
    std::vector<float> scratch(chunk_rows * vocab), dx(n * dim), dw(dim * vocab);
    const float fused = kernels::linear_cross_entropy<float>(dx.data(), dw.data(), nullptr, x.data(), w.data(), nullptr,
                                                             targets.data(), n, dim, vocab, transpose_w, chunk_rows,
                                                             scratch.data(), true, true);
    // The same products one by one: the logits and dx of every row at once (a row's bits do not
    // depend on the rows beside it), dw chunk by chunk as the fused loop adds it.
    std::vector<float> logits(n * vocab), lse(n), g(n * vocab, 0.0f), dx_ref(n * dim), dw_ref(dim * vocab);
    kernels::bf16_gemm<float>(false, transpose_w, n, vocab, dim, x.data(), dim, w.data(), ldw, false, logits.data(), vocab);
    const float plain = kernels::cross_entropy_forward<float>(lse.data(), logits.data(), targets.data(), n, vocab);
    kernels::cross_entropy_backward<float>(g.data(), 1.0f, logits.data(), lse.data(), targets.data(), n, vocab);
    kernels::bf16_gemm<float>(false, !transpose_w, n, dim, vocab, g.data(), vocab, w.data(), ldw, false, dx_ref.data(), dim);
    for (std::size_t r0 = 0; r0 < n; r0 += chunk_rows) {
      const std::size_t rows = std::min(chunk_rows, n - r0);
      if (transpose_w)
        kernels::bf16_gemm<float>(true, false, vocab, dim, rows, g.data() + r0 * vocab, vocab, x.data() + r0 * dim, dim,
                                  r0 > 0, dw_ref.data(), dim);
      else
        kernels::bf16_gemm<float>(true, false, dim, vocab, rows, x.data() + r0 * dim, dim, g.data() + r0 * vocab, vocab,
                                  r0 > 0, dw_ref.data(), vocab);
    }
    CHECK(std::memcmp(&fused, &plain, sizeof(float)) == 0);
    CHECK(std::memcmp(dx.data(), dx_ref.data(), dx.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(dw.data(), dw_ref.data(), dw.size() * sizeof(float)) == 0);
  }
}
