// SGD against hand-computed double recurrences (with and without momentum, decay on matrices
// only), version bumps, and state export and restore.
#include <doctest/doctest.h>

#include <cmath>

#include "optim/sgd.h"
#include "optim/tiny_model.h"

using namespace tapegrad;
using test::contains;
using test::error_of;

namespace {
double grad_at(std::size_t i, int t) { return 0.6 * std::cos(0.9 * double(i) - 0.4 * t) - 0.1 * t; }
}  // namespace

TEST_CASE("SGD with momentum follows the hand-computed recurrence, decaying the matrix but not the vector") {
  Var w(test::random_tensor({3, 2}, 21, 0.5f), true), b(test::random_tensor({2}, 22, 0.5f), true);
  optim::SGDOptions options{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.05f};
  optim::SGD opt({{"w", w}, {"b", b}}, options);
  const std::vector<float> lrs = {0.1f, 0.05f, 0.2f, 0.1f};

  std::vector<double> p, buf(8, 0.0);
  for (std::size_t i = 0; i < 6; ++i) p.push_back(w.value()[i]);
  for (std::size_t i = 0; i < 2; ++i) p.push_back(b.value()[i]);
  for (int t = 1; t <= 4; ++t) {
    for (std::size_t i = 0; i < 6; ++i) w.grad_buffer()[i] = float(grad_at(i, t));
    for (std::size_t i = 0; i < 2; ++i) b.grad_buffer()[i] = float(grad_at(6 + i, t));
    opt.set_lr(lrs[t - 1]);
    opt.step();
    for (std::size_t i = 0; i < 8; ++i) {
      // PyTorch's SGD: g = grad + wd p; buf = momentum buf + g (buf = g at t = 1); p -= lr buf.
      const double wd = i < 6 ? double(options.weight_decay) : 0.0;
      const double g = double(float(grad_at(i, t))) + wd * p[i];
      buf[i] = t == 1 ? g : double(options.momentum) * buf[i] + g;
      p[i] -= double(lrs[t - 1]) * buf[i];
    }
  }
  // Tolerance: |p| < 2 and |buf| < 4, each float step rounds a handful of times at relative
  // 6e-8; four steps stay below 1e-6, while decaying b would move it by ~1e-3.
  for (std::size_t i = 0; i < 8; ++i) {
    const float got = i < 6 ? w.value()[i] : b.value()[i - 6];
    CHECK_MESSAGE(std::abs(got - p[i]) <= 1e-6, "element ", i, ": ", got, " vs reference ", p[i]);
  }
  optim::OptimizerState state = opt.state();
  REQUIRE(state.tensors.size() == 2);
  CHECK(state.tensors[0].name == "optim.w.momentum");
  CHECK(state.tensors[1].name == "optim.b.momentum");
  CHECK(std::abs(state.tensors[1].value[1] - buf[7]) <= 1e-6);
}

TEST_CASE("SGD without momentum is p -= lr * grad exactly and keeps no state tensors") {
  Var w(Tensor({2, 2}, {1, 2, 3, 4}), true);
  optim::SGD opt({{"w", w}}, {.lr = 0.5f});
  w.grad_buffer().fill(2.0f);
  opt.step();
  CHECK(w.value()[0] == 0.0f);
  CHECK(w.value()[3] == 3.0f);
  CHECK(opt.state().tensors.empty());
  CHECK(opt.state().step == 1);
}

TEST_CASE("an SGD step bumps the version of the parameters it updates") {
  test::TinyModel model(4);
  optim::SGD opt(model.params, {.momentum = 0.9f});
  const std::uint64_t before = model.params[1].var.version();
  test::train_step(model, test::TinyBatch(), opt, 0.1f);
  CHECK(model.params[1].var.version() > before);
}

TEST_CASE("SGD state exported after N steps and loaded into a new optimizer continues bit-identically") {
  const test::TinyBatch batch;
  const optim::SGDOptions options{.momentum = 0.9f, .weight_decay = 0.01f};
  test::TinyModel straight(8), resumed(8);
  optim::SGD straight_opt(straight.params, options), first_opt(resumed.params, options);
  for (int s = 0; s < 10; ++s) test::train_step(straight, batch, straight_opt, 0.05f);
  for (int s = 0; s < 5; ++s) test::train_step(resumed, batch, first_opt, 0.05f);
  optim::SGD resumed_opt(resumed.params, options);
  resumed_opt.load_state(first_opt.state());
  for (int s = 5; s < 10; ++s) test::train_step(resumed, batch, resumed_opt, 0.05f);
  for (std::size_t i = 0; i < straight.params.size(); ++i)
    CHECK_MESSAGE(test::bitwise_equal(resumed.params[i].var.value(), straight.params[i].var.value()),
                  straight.params[i].name);
}

TEST_CASE("SGD refuses a momentum outside [0, 1) and a negative weight decay") {
  Var w(Tensor({2}), true);
  CHECK(error_of([&] { optim::SGD({{"w", w}}, {.momentum = 1.5f}); }) == "SGD: momentum must be in [0, 1), got 1.5");
  CHECK(contains(error_of([&] { optim::SGD({{"w", w}}, {.weight_decay = -1.0f}); }),
                 "SGD: weight_decay must be finite and >= 0, got -1"));
}
