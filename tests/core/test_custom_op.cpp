// A differentiable op defined outside core/ with the public API (core/op.h), as a user writes
// one: it records on a Tape, records nothing under a NoGradScope, rematerialises, passes
// gradcheck and trains like a built-in op. docs/custom-ops.md shows this file's code; its test
// (tests/docs/test_docs.cpp) fails if the two differ.
#include <doctest/doctest.h>

#include "core/gradcheck.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/remat.h"
#include "optim/adamw.h"
#include "support/checks.h"

using namespace tapegrad;

namespace {

/// y = a * x^3 + b (a, b scalars broadcast over x); x any shape, a, b shape [1]. Saves x.
Var cubic(const Var& x, const Var& a, const Var& b) {
  if (a.shape() != Shape{1} || b.shape() != Shape{1})
    throw std::invalid_argument("cubic: a and b must have shape [1], got " + to_string(a.shape()) + " and " +
                                to_string(b.shape()));
  Op op("cubic", {x, a, b});
  Tensor y(x.shape());
  for (std::size_t i = 0; i < y.size(); ++i) {
    float v = x.value()[i];
    y[i] = a.value()[0] * v * v * v + b.value()[0];
  }
  // dx += 3 a x^2 dy;  da += sum(x^3 dy);  db += sum(dy)
  return op.finish(std::move(y), [x, a, b](const Tensor& dy, const Tensor&) {
    Tensor da(dy.shape());
    for (std::size_t i = 0; i < dy.size(); ++i) {
      float v = x.value()[i];
      if (float* dx = grad_ptr(x)) dx[i] += 3 * a.value()[0] * v * v * dy[i];
      da[i] = v * v * v * dy[i];
    }
    accumulate_grad(a, da);  // summed down to a's shape [1] (sum_to)
    accumulate_grad(b, dy);
  });
}

}  // namespace

TEST_CASE("a custom op defined outside core passes gradcheck on every input") {
  test::check_float_op("cubic", [](const std::vector<Var>& v) { return cubic(v[0], v[1], v[2]); },
                       {test::random_tensor({3, 4}, 1), Tensor({1}, {0.7f}), Tensor({1}, {-0.3f})});
}

TEST_CASE("a custom op records on a Tape and nothing under a NoGradScope") {
  Var x(test::random_tensor({5}, 2), true), a(Tensor({1}, {2.0f}), true), b(Tensor({1}, {1.0f}), true);
  {
    Tape tape;
    Var y = cubic(x, a, b);
    CHECK(tape.size() == 1);
    CHECK_FALSE(y.is_leaf());
    tape.backward(sum(y));
  }
  for (std::size_t i = 0; i < 5; ++i) CHECK(x.grad()[i] == doctest::Approx(6 * x.value()[i] * x.value()[i]));
  CHECK(b.grad()[0] == doctest::Approx(5));
  {
    Tape tape;
    NoGradScope no_grad;
    Var y = cubic(x, a, b);
    CHECK(y.is_leaf());
    CHECK(tape.size() == 0);
  }
  CHECK(test::contains(test::error_of([&] { cubic(x, Var(Tensor({2})), b); }), "cubic: a and b must have shape [1]"));
}

TEST_CASE("a custom op inside a rematerialised block gives the plain path's gradients exactly") {
  Tensor x0 = test::random_tensor({4, 3}, 3);
  Var a(Tensor({1}, {0.5f}), true), b(Tensor({1}, {0.25f}), true), w(test::random_tensor({3, 3}, 4), true);
  Block block = [&](const Var& x, const Tensor*) { return cubic(tanh(matmul(x, w)), a, b); };
  auto run = [&](bool remat) {
    for (Var* p : {&a, &b, &w}) p->zero_grad();
    Var x(x0, true);
    Tape tape;
    Var y = remat ? rematerialize(block, x) : block(x, nullptr);
    CHECK(tape.size() == (remat ? 1u : 3u));
    tape.backward(sum(mul(y, y)));
    return std::vector<Tensor>{x.grad(), a.grad(), b.grad(), w.grad()};
  };
  std::vector<Tensor> plain = run(false), remat = run(true);
  for (std::size_t k = 0; k < plain.size(); ++k) CHECK(max_abs_diff(plain[k], remat[k]) == 0.0f);
}

TEST_CASE("a custom op trains like a built-in one: AdamW fits a and b of y = a x^3 + b") {
  Rng rng(5);
  Tensor x_values({64}), y_values({64});
  for (std::size_t i = 0; i < 64; ++i) {
    x_values[i] = 2 * rng.uniform() - 1;
    y_values[i] = 2 * x_values[i] * x_values[i] * x_values[i] + 1;  // the target: a = 2, b = 1
  }
  Var x(x_values), target(y_values);
  Var a(Tensor({1}, {0.5f}), /*requires_grad=*/true), b(Tensor({1}, {0.0f}), /*requires_grad=*/true);
  optim::AdamW optimizer({{"a", a}, {"b", b}}, {.lr = 0.05f});
  for (int step = 0; step < 300; ++step) {
    optimizer.zero_grad();
    Tape tape;
    Var loss = mse_loss(cubic(x, a, b), target);
    tape.backward(loss);
    optimizer.step();
  }
  CHECK(a.value()[0] == doctest::Approx(2.0f).epsilon(0.02));
  CHECK(b.value()[0] == doctest::Approx(1.0f).epsilon(0.02));
}
