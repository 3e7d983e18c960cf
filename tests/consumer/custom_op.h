// A differentiable op defined outside the library with its public API alone
// (core/op_recording.h), as a user writes one, and the checks that make it trustworthy:
// gradcheck on every input, one tape entry and none under a NoGradScope, its error message,
// bit-identical gradients inside a rematerialised block, and training with AdamW. It uses only
// installed headers: the installed
// package builds it (tests/consumer, scripts/check_install.sh), and the suite runs the same checks
// (tests/core/test_custom_op.cpp). docs/custom-ops.md shows this file's code; the suite fails if
// the two differ.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/gradcheck.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/remat.h"
#include "optim/adamw.h"

namespace custom_op_example {

using namespace tapegrad;

/// y = a * x^3 + b (a, b scalars broadcast over x); x any shape, a, b shape [1]. Saves x.
inline Var cubic(const Var& x, const Var& a, const Var& b) {
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

/// Uniform values in [-1, 1) of the given shape, from a seeded generator.
inline Tensor uniform_tensor(Shape shape, std::uint64_t seed) {
  Rng rng(seed);
  Tensor t(std::move(shape));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 2 * rng.uniform() - 1;
  return t;
}

/// Every check of cubic; returns what failed (empty when all pass).
inline std::vector<std::string> check_cubic() {
  std::vector<std::string> failures;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) failures.push_back(what);
  };

  // The gradient of every input against central differences of sum(cubic(x, a, b) * R): eps 1e-2,
  // an element passes within 2e-3 + 2e-3 |numerical| (gradcheck's defaults for float ops).
  GradcheckReport report = gradcheck("cubic", [](const std::vector<Var>& v) { return cubic(v[0], v[1], v[2]); },
                                     {uniform_tensor({3, 4}, 1), Tensor({1}, {0.7f}), Tensor({1}, {-0.3f})});
  expect(report.ok, "gradcheck: " + report.message);

  // One tape entry, the gradients by hand; nothing recorded under a NoGradScope; a clear error.
  Var x(uniform_tensor({5}, 2), true), a(Tensor({1}, {2.0f}), true), b(Tensor({1}, {1.0f}), true);
  {
    Tape tape;
    Var y = cubic(x, a, b);
    expect(tape.size() == 1 && !y.is_leaf(), "cubic records one tape entry");
    tape.backward(sum(y));
  }
  for (std::size_t i = 0; i < 5; ++i)
    expect(std::fabs(x.grad()[i] - 6 * x.value()[i] * x.value()[i]) < 1e-5f, "dx = 3 a x^2");
  expect(b.grad()[0] == 5.0f, "db = sum(dy)");
  {
    Tape tape;
    NoGradScope no_grad;
    Var y = cubic(x, a, b);
    expect(y.is_leaf() && tape.size() == 0, "cubic records nothing under a NoGradScope");
  }
  try {
    cubic(x, Var(Tensor({2})), b);
    expect(false, "cubic refuses an a of shape [2]");
  } catch (const std::invalid_argument& e) {
    expect(std::string(e.what()).starts_with("cubic: a and b must have shape [1]"), e.what());
  }

  // Inside a rematerialised block (only the block's input is kept; the inside is recomputed in
  // backward) the gradients are the plain path's, bit for bit.
  {
    Tensor x0 = uniform_tensor({4, 3}, 3);
    Var a(Tensor({1}, {0.5f}), true), b(Tensor({1}, {0.25f}), true), w(uniform_tensor({3, 3}, 4), true);
    Block block = [&](const Var& x, const Tensor*) { return cubic(tanh(matmul(x, w)), a, b); };
    auto run = [&](bool remat) {
      for (Var* p : {&a, &b, &w}) p->zero_grad();
      Var x(x0, true);
      Tape tape;
      Var y = remat ? rematerialize(block, x) : block(x, nullptr);
      tape.backward(sum(mul(y, y)));
      return std::vector<Tensor>{x.grad(), a.grad(), b.grad(), w.grad()};
    };
    std::vector<Tensor> plain = run(false), remat = run(true);
    for (std::size_t k = 0; k < plain.size(); ++k)
      expect(max_abs_diff(plain[k], remat[k]) == 0.0f, "remat changes gradient " + std::to_string(k));
  }

  // It trains like a built-in op: AdamW fits a and b so that cubic matches y = 2 x^3 + 1.
  {
    Tensor x_values = uniform_tensor({64}, 5), y_values({64});
    for (std::size_t i = 0; i < 64; ++i) y_values[i] = 2 * x_values[i] * x_values[i] * x_values[i] + 1;
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
    expect(std::fabs(a.value()[0] - 2.0f) < 0.04f && std::fabs(b.value()[0] - 1.0f) < 0.04f,
           "AdamW fits a = 2, b = 1: got a = " + std::to_string(a.value()[0]) + ", b = " + std::to_string(b.value()[0]));
  }
  return failures;
}

}  // namespace custom_op_example
