// The tape: backward order, accumulation into leaves, zero_grad and no-grad scopes.
#include <doctest/doctest.h>

#include <algorithm>

#include "core/ops.h"
#include "core/remat.h"
#include "support/checks.h"
#include "support/helpers.h"

using namespace tapegrad;
using test::contains;
using test::error_of;
using test::random_tensor;

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

namespace {
// Records, for each watched leaf, how many entries had run when its gradient was reported final,
// and its gradient then.
struct FinalGradients final : BackwardObserver {
  std::vector<Var> leaves;
  std::size_t entries = 0;
  std::vector<int> at;  // -1: not reported
  std::vector<Tensor> seen;
  explicit FinalGradients(std::vector<Var> watched) : leaves(std::move(watched)), at(leaves.size(), -1), seen(leaves.size()) {}
  const std::vector<Var>& watched() const override { return leaves; }
  void gradient_final(std::size_t i) override {
    CHECK(at[i] == -1);  // once per backward
    at[i] = int(entries);
    if (leaves[i].has_grad()) seen[i] = leaves[i].grad();
  }
  void entry_done() override { ++entries; }
};

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::equal(a.data(), a.data() + a.size(), b.data());
}
}  // namespace

TEST_CASE("a backward observer hears each watched leaf's gradient once, when no entry left to run reads it") {
  Var a(Tensor({2}, {1, 2}), true), b(Tensor({2}, {3, 4}), true), unused(Tensor({1}), true);
  Tape tape;
  Var h = mul(a, a);          // entry 0 reads a
  Var y = add(mul(h, b), a);  // entries 1 (mul reads b) and 2 (add reads a again)
  Var loss = sum(y);          // entry 3
  FinalGradients observer({a, b, unused});
  tape.backward(loss, &observer);
  CHECK(observer.at[2] == 0);  // read by no entry: before any ran
  CHECK(observer.at[1] == 2);  // with mul(h, b), the third entry to run
  CHECK(observer.at[0] == 3);  // only with mul(a, a), the first entry recorded, which runs last
  CHECK(observer.entries == 4);
  for (std::size_t i : {0, 1}) CHECK(same_values(observer.seen[i], observer.leaves[i].grad()));
  CHECK_FALSE(unused.has_grad());
}

TEST_CASE("a rematerialised block's parameters are its entry's inputs: final after it, and guarded against change") {
  Var x(Tensor({1, 2}, {1, -2}), true), w1(random_tensor({2, 2}, 3), true), w2(random_tensor({2, 2}, 4), true);
  auto block = [&](const Var& h, const Tensor*) { return matmul(tanh(matmul(h, w1)), w2); };
  Tape tape;
  Var y = rematerialize(block, matmul(x, w1));  // entries: matmul(x, w1), rematerialize
  Var loss = sum(y);
  FinalGradients observer({w1, w2, x});
  tape.backward(loss, &observer);
  CHECK(observer.at[1] == 1);  // w2: inside the block only, final with the remat entry
  CHECK(observer.at[0] == 2);  // w1: also read by the first matmul
  CHECK(observer.at[2] == 2);
  CHECK(same_values(observer.seen[1], w2.grad()));

  Tape again;
  Var z = sum(rematerialize(block, scale(x, 1.0f)));
  w2.mutable_value()[0] += 1.0f;
  CHECK(contains(error_of([&] { again.backward(z); }), "rematerialize's input 2 of shape [2, 2] was changed in place"));
}
