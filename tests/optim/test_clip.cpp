// Global-norm gradient clipping: the norm reported, the scaling, the no-op below the threshold.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "core/kernels.h"
#include "optim/clip.h"
#include "support/helpers.h"

using namespace tapegrad;

namespace {
// Two parameters with gradients (3, 4) and (12): global norm sqrt(9 + 16 + 144) = 13.
ParameterList params_with_norm_13() {
  ParameterList params = {{"a", Var(Tensor({2}), true)}, {"b", Var(Tensor({1, 1}), true)},
                          {"no_grad", Var(Tensor({4}), true)}};
  params[0].var.grad_buffer() = Tensor({2}, {3.0f, 4.0f});
  params[1].var.grad_buffer() = Tensor({1, 1}, {-12.0f});
  return params;
}
}  // namespace

TEST_CASE("clip_grad_norm returns the global norm and scales every gradient by max_norm / (norm + 1e-6)") {
  ParameterList params = params_with_norm_13();
  CHECK(optim::clip_grad_norm(params, 6.5f) == 13.0f);
  const float c = float(6.5 / (13.0 + 1e-6));
  CHECK(params[0].var.grad()[0] == 3.0f * c);
  CHECK(params[0].var.grad()[1] == 4.0f * c);
  CHECK(params[1].var.grad()[0] == -12.0f * c);
  CHECK_FALSE(params[2].var.has_grad());  // counted as zero, and still without a gradient
  // Tolerance: three float products at relative 6e-8 each.
  CHECK(std::abs(optim::clip_grad_norm(params, 100.0f) - 6.5) <= 1e-5);
}

TEST_CASE("clip_grad_norm leaves gradients untouched when the norm is below max_norm") {
  ParameterList params = params_with_norm_13();
  CHECK(optim::clip_grad_norm(params, 13.5f) == 13.0f);
  CHECK(params[0].var.grad()[1] == 4.0f);
  CHECK(params[1].var.grad()[0] == -12.0f);
}

TEST_CASE("clip_grad_norm accumulates in double, so squares beyond float range still give a finite norm") {
  ParameterList params = {{"big", Var(Tensor({4}), true)}};
  params[0].var.grad_buffer().fill(1e30f);  // 1e60 per square: inf in float, fine in double
  const float norm = optim::clip_grad_norm(params, 1.0f);
  CHECK(norm == doctest::Approx(2e30).epsilon(1e-6));
  CHECK(params[0].var.grad()[0] == doctest::Approx(0.5).epsilon(1e-6));
}

TEST_CASE("clip_grad_norm reports a non-finite norm without touching the gradients, and refuses a bad max_norm") {
  ParameterList params = params_with_norm_13();
  params[0].var.grad_buffer()[0] = NAN;
  CHECK(std::isnan(optim::clip_grad_norm(params, 1.0f)));
  CHECK(params[1].var.grad()[0] == -12.0f);
  CHECK(test::error_of([&] { optim::clip_grad_norm(params, 0.0f); }) ==
        "clip_grad_norm: max_norm must be finite and > 0, got 0");
  CHECK(optim::clip_grad_norm({}, 1.0f) == 0.0f);
}

TEST_CASE("the sum of squares is the same on one thread and two, and within double rounding of the exact sum") {
  // Three blocks of 4096 and a tail: the blocks run on different threads when there are two.
  const std::vector<float> g = test::random_vector<float>(3 * 4096 + 5, 11);
  long double exact = 0;
  for (float x : g) exact += (long double)x * x;
  const int saved = num_threads();
  set_num_threads(1);
  const double one = kernels::sum_squares(g.data(), g.size());
  set_num_threads(2);
  const double two = kernels::sum_squares(g.data(), g.size());
  set_num_threads(saved);
  CHECK(one == two);
  // Tolerance: 12,293 double additions at relative 1.1e-16 each bound the error by 1.4e-12.
  CHECK(std::abs(one - double(exact)) <= 1.4e-12 * double(exact));
}
