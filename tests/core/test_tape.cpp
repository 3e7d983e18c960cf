#include <doctest/doctest.h>

#include "core/ops.h"
#include "core/remat.h"
#include "support/checks.h"

using namespace tapegrad;
using test::contains;
using test::error_of;

TEST_CASE("backward seeds one, walks in reverse and accumulates into leaves used twice") {
  Var x(Tensor({3}, {1, 2, 3}), true);
  Tape tape;
  Var y = add(mul(x, x), scale(x, 3.0f));  // y = x^2 + 3x, dy/dx = 2x + 3
  tape.backward(sum(y));
  CHECK(x.grad()[0] == 5.0f);
  CHECK(x.grad()[2] == 9.0f);
}

TEST_CASE("gradients accumulate across backward passes until zero_grad") {
  Var x(Tensor({2}, {1, 2}), true);
  for (int pass = 0; pass < 2; ++pass) {
    Tape tape;
    tape.backward(sum(scale(x, 2.0f)));
  }
  CHECK(x.grad()[0] == 4.0f);
  x.zero_grad();
  CHECK_FALSE(x.has_grad());
}

TEST_CASE("a no-grad scope records nothing and values without grad are not recorded") {
  Var x(Tensor({2}, {1, 2}), true);
  Tape tape;
  {
    NoGradScope no_grad;
    Var y = scale(x, 2.0f);
    CHECK_FALSE(y.requires_grad());
  }
  CHECK(tape.size() == 0);
  Var c(Tensor({2}, {1, 1}));
  Var z = add(c, c);
  CHECK(tape.size() == 0);
  CHECK_FALSE(z.requires_grad());
  Var w = add(x, c);
  CHECK(tape.size() == 1);
  CHECK(Tape::current() == &tape);
}

TEST_CASE("the tape reports the bytes it holds and frees them when cleared") {
  Var x(Tensor({4, 8}), true);
  Var w(Tensor({8}, 1.0f), true);
  Tape tape;
  Var y = rms_norm(x, w);  // output 4x8 floats + rstd 4 floats
  CHECK(tape.bytes() == (32 + 4) * sizeof(float));
  Var z = silu(y);
  CHECK(tape.bytes() == (32 + 4 + 32) * sizeof(float));
  tape.clear();
  CHECK(tape.bytes() == 0);
  CHECK(tape.size() == 0);
}

TEST_CASE("backward twice and values from a cleared tape are clear errors") {
  Var x(Tensor({2}, {1, 2}), true);
  Tape tape;
  Var loss = sum(scale(x, 2.0f));
  tape.backward(loss);
  CHECK(contains(error_of([&] { tape.backward(loss); }), "this tape is spent"));
  Var y = scale(x, 2.0f);
  tape.clear();
  CHECK(contains(error_of([&] { (void)add(y, y); }), "computed on a tape that has since been cleared"));
  CHECK(contains(error_of([&] { tape.backward(Var(Tensor::scalar(1.0f), true)); }), "the output is a leaf"));
  CHECK(contains(error_of([&] { tape.backward(scale(x, 1.0f)); }), "the loss must have one element, got shape [2]"));
}

TEST_CASE("a value outliving its tape cannot be differentiated") {
  Var x(Tensor({2}, {1, 2}), true);
  Var y;
  {
    Tape tape;
    y = scale(x, 2.0f);
  }
  Tape next;
  CHECK(contains(error_of([&] { (void)sum(y); }), "cleared or spent"));
}

TEST_CASE("tapes nest: an inner tape records and backpropagates on its own") {
  Var x(Tensor({2}, {1, 2}), true), w(Tensor({2}, {3, 4}), true);
  Tape outer;
  Var a = mul(x, w);
  {
    Tape inner;
    CHECK(Tape::current() == &inner);
    Var b = mul(w, w);
    inner.backward(sum(b));
    CHECK(w.grad()[1] == 8.0f);
  }
  CHECK(Tape::current() == &outer);
  outer.backward(sum(a));
  CHECK(w.grad()[1] == 8.0f + 2.0f);
  CHECK(x.grad()[0] == 3.0f);
}

TEST_CASE("a rematerialised block gives bit-identical gradients and keeps fewer bytes") {
  Tensor xv = test::random_tensor({2, 3, 8}, 1);
  Var w1(test::random_tensor({8, 8}, 2), true), g(Tensor({8}, 1.0f), true);
  // Two blocks: one that ignores the known output (everything is recomputed) and one that hands
  // it to its last op, as the decoder block does (Note [Remat]).
  std::vector<Tensor> known_seen;  // empty: none given
  Block full = [&](const Var& x, const Tensor*) { return add(x, matmul(silu(rms_norm(x, g)), w1)); };
  Block skips_last = [&](const Var& x, const Tensor* known) {
    known_seen.push_back(known ? *known : Tensor());
    return add_matmul(x, silu(rms_norm(x, g)), w1, known);
  };
  auto run = [&](bool remat, std::size_t& bytes) {
    w1.zero_grad();
    g.zero_grad();
    known_seen.clear();
    Var x(xv, true);
    Tape tape;
    Var h = remat ? rematerialize(full, x) : full(x, nullptr);
    Var y = remat ? rematerialize(skips_last, h) : skips_last(h, nullptr);
    bytes = tape.bytes();
    tape.backward(mean(mul(y, y)));
    return std::tuple{Tensor(x.grad()), Tensor(w1.grad()), Tensor(g.grad()), Tensor(y.value())};
  };
  std::size_t plain_bytes = 0, remat_bytes = 0;
  auto [dx0, dw0, dg0, y0] = run(false, plain_bytes);
  auto [dx1, dw1, dg1, y1] = run(true, remat_bytes);
  CHECK(max_abs_diff(dx0, dx1) == 0.0f);
  CHECK(max_abs_diff(dw0, dw1) == 0.0f);
  CHECK(max_abs_diff(dg0, dg1) == 0.0f);
  // The forward runs without a known output; the re-run in backward gets the forward's output.
  REQUIRE(known_seen.size() == 2);
  CHECK(known_seen[0].empty());
  REQUIRE(!known_seen[1].empty());
  CHECK(max_abs_diff(known_seen[1], y1) == 0.0f);
  // Plain: rms_norm (48 + 6), silu 48, then matmul 48 and add 48 (first block) or add_matmul 48
  // (second block); remat: the two block outputs.
  CHECK(plain_bytes == ((48 + 6 + 48 + 48 + 48) + (48 + 6 + 48 + 48)) * sizeof(float));
  CHECK(remat_bytes == 2 * 48 * sizeof(float));
}

TEST_CASE("two linear layers and cross-entropy trained by hand-written SGD lower the loss") {
  Rng rng(3);
  Var w1(Tensor({6, 16}), true), b1(Tensor({16}), true), w2(Tensor({16, 4}), true);
  rng.fill_normal(w1.mutable_value(), 0.5f);
  rng.fill_normal(w2.mutable_value(), 0.5f);
  Tensor inputs = test::random_tensor({32, 6}, 4);
  std::vector<std::int32_t> targets(32);
  for (std::size_t i = 0; i < 32; ++i) targets[i] = (inputs[i * 6] > 0) + 2 * (inputs[i * 6 + 1] > 0);
  std::vector<float> losses;
  for (int step = 0; step < 200; ++step) {
    Tape tape;
    Var logits = matmul(silu(add_bias(matmul(Var(inputs), w1), b1)), w2);
    Var loss = cross_entropy(logits, targets);
    losses.push_back(loss.value().item());
    tape.backward(loss);
    for (Var* p : {&w1, &b1, &w2}) {
      Tensor& v = p->mutable_value();
      for (std::size_t i = 0; i < v.size(); ++i) v[i] -= 0.3f * p->grad()[i];
      p->zero_grad();
    }
  }
  CHECK(losses.front() > 1.0f);
  CHECK(losses.back() < 0.25f * losses.front());
}
