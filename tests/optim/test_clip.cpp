// Global-norm gradient clipping: the norm reported, the scaling, the no-op below the threshold.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/kernels.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "optim/tiny_model.h"
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

namespace {
// A matrix, a vector with a tail past every SIMD width and a parameter without a gradient, with
// random values and gradients of global norm about 20 (so clipping at 1 scales them).
ParameterList random_params() {
  ParameterList params = {{"w", Var(Tensor({13, 7}), true)}, {"b", Var(Tensor({37}), true)},
                          {"unused", Var(Tensor({5}), true)}};
  std::uint64_t seed = 3;
  for (std::size_t i = 0; i < 2; ++i) {
    Tensor& value = params[i].var.mutable_value();
    const std::vector<float> v = test::random_vector<float>(value.size(), seed++);
    std::copy(v.begin(), v.end(), value.data());
    Tensor grad(value.shape());
    const std::vector<float> g = test::random_vector<float>(value.size(), seed++);
    for (std::size_t j = 0; j < g.size(); ++j) grad[j] = 2.0f * g[j];
    params[i].var.grad_buffer() = std::move(grad);
  }
  return params;
}

ParameterList copy_of(const ParameterList& params) {
  ParameterList copy;
  for (const NamedParameter& p : params) {
    copy.push_back({p.name, Var(p.var.value(), true)});
    if (p.var.has_grad()) copy.back().var.grad_buffer() = p.var.grad();
  }
  return copy;
}

// Three steps of `optimizer` over params (fresh gradients each step), by clip_grad_norm then
// step(), or by clip_grad_norm_and_step: the norms returned.
template <class Optimizer, class Options>
std::vector<float> three_steps(ParameterList params, const Options& options, float max_norm, bool fused,
                               optim::OptimizerState* state, std::optional<optim::FlatRange> shard = {}) {
  Optimizer optimizer(params, options);
  if (shard) optimizer.keep_only(*shard);
  const ParameterList gradients = copy_of(params);
  std::vector<float> norms;
  for (int s = 0; s < 3; ++s) {
    for (std::size_t i = 0; i < params.size(); ++i)
      if (gradients[i].var.has_grad()) params[i].var.grad_buffer() = gradients[i].var.grad();
    if (fused) {
      norms.push_back(optim::clip_grad_norm_and_step(optimizer, max_norm));
    } else {
      norms.push_back(optim::clip_grad_norm(params, max_norm));
      optimizer.step();
    }
    optimizer.zero_grad();
  }
  if (!shard) *state = optimizer.state();
  return norms;
}

void check_same_bits(const ParameterList& a, const ParameterList& b) {
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(test::bitwise_equal(a[i].var.value(), b[i].var.value()));
}
}  // namespace

TEST_CASE("clip_grad_norm_and_step leaves AdamW's and SGD's parameters and state bit for bit as clipping then stepping") {
  for (float max_norm : {1.0f, 1e6f}) {  // clipped, and not
    CAPTURE(max_norm);
    const ParameterList start = random_params();
    ParameterList two_passes = copy_of(start), fused = copy_of(start);
    optim::OptimizerState two_passes_state, fused_state;
    const optim::AdamWOptions adamw{.lr = 1e-2f, .weight_decay = 0.1f};
    const std::vector<float> norms = three_steps<optim::AdamW>(two_passes, adamw, max_norm, false, &two_passes_state);
    CHECK(three_steps<optim::AdamW>(fused, adamw, max_norm, true, &fused_state) == norms);
    CHECK((norms[0] > max_norm) == (max_norm == 1.0f));  // clipping happened at 1 only
    check_same_bits(two_passes, fused);
    for (std::size_t i = 0; i < fused_state.tensors.size(); ++i)
      CHECK(test::bitwise_equal(two_passes_state.tensors[i].value, fused_state.tensors[i].value));
    // A shard (ZeRO-1): the elements held are updated alike.
    ParameterList sharded_two_passes = copy_of(start), sharded_fused = copy_of(start);
    const optim::FlatRange shard{50, 120};
    three_steps<optim::AdamW>(sharded_two_passes, adamw, max_norm, false, nullptr, shard);
    three_steps<optim::AdamW>(sharded_fused, adamw, max_norm, true, nullptr, shard);
    check_same_bits(sharded_two_passes, sharded_fused);
    // SGD scales the gradients in place, then steps (Optimizer::step_scaled).
    ParameterList sgd_two_passes = copy_of(start), sgd_fused = copy_of(start);
    const optim::SGDOptions sgd{.lr = 0.1f, .momentum = 0.9f};
    three_steps<optim::SGD>(sgd_two_passes, sgd, max_norm, false, &two_passes_state);
    three_steps<optim::SGD>(sgd_fused, sgd, max_norm, true, &fused_state);
    check_same_bits(sgd_two_passes, sgd_fused);
  }
}

TEST_CASE("clip_grad_norm_and_step takes no step on a non-finite norm, and refuses a bad max_norm") {
  ParameterList params = params_with_norm_13();
  params[0].var.grad_buffer()[0] = INFINITY;
  const ParameterList before = copy_of(params);
  optim::AdamW optimizer(params);
  CHECK(std::isinf(optim::clip_grad_norm_and_step(optimizer, 1.0f)));
  CHECK(optimizer.steps() == 0);
  check_same_bits(before, params);
  CHECK(test::error_of([&] { optim::clip_grad_norm_and_step(optimizer, -1.0f); }) ==
        "clip_grad_norm: max_norm must be finite and > 0, got -1");
}
