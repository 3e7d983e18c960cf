// cross_entropy: its formula, its stability for huge logits and its gradient by central differences.
#include <doctest/doctest.h>

#include <cmath>

#include "core/ops.h"
#include "support/checks.h"

using namespace tapegrad;

TEST_CASE("cross_entropy is the mean of logsumexp minus the target logit") {
  Tensor logits = test::random_tensor({2, 3, 5}, 1, 3.0f);
  std::vector<std::int32_t> targets = {0, 4, 2, 2, 1, 3};
  double expected = 0;
  for (std::size_t r = 0; r < 6; ++r) {
    double z = 0;
    for (std::size_t j = 0; j < 5; ++j) z += std::exp(double(logits[r * 5 + j]));
    expected += std::log(z) - logits[r * 5 + targets[r]];
  }
  CHECK(cross_entropy(Var(logits), targets).value().item() == doctest::Approx(expected / 6).epsilon(1e-6));
}

TEST_CASE("cross_entropy is stable for huge logits") {
  Tensor logits({1, 3}, {1000.0f, 0.0f, -1000.0f});
  std::vector<std::int32_t> t = {1};
  CHECK(cross_entropy(Var(logits), t).value().item() == doctest::Approx(1000.0));
}

TEST_CASE("cross_entropy backward matches central differences in double and in float") {
  const std::size_t n = 4, V = 7;
  std::vector<std::int32_t> targets = {6, 0, 3, 3};
  auto logits = test::random_vector<double>(n * V, 1, 2.0);
  std::vector<double> lse(n), dlogits(n * V), R = {0.7};
  kernels::cross_entropy_forward<double>(lse.data(), logits.data(), targets.data(), n, V);
  kernels::cross_entropy_backward<double>(dlogits.data(), 0.7, logits.data(), lse.data(), targets.data(), n, V);
  test::check_double("cross_entropy", logits, [&] {
    std::vector<double> l(n);
    return std::vector<double>{kernels::cross_entropy_forward<double>(l.data(), logits.data(), targets.data(), n, V)};
  }, R, dlogits);
  test::check_float_op("cross_entropy", [&](const std::vector<Var>& v) { return cross_entropy(v[0], targets); },
                       {test::random_tensor({4, 7}, 2)});
}

TEST_CASE("cross_entropy names bad targets and counts") {
  std::vector<std::int32_t> t = {0, 9};
  CHECK(test::error_of([&] { cross_entropy(Var(Tensor({2, 5})), t); }) ==
        "cross_entropy: id 9 at index 1 is outside the vocabulary of size 5");
  std::vector<std::int32_t> one = {0};
  CHECK(test::error_of([&] { cross_entropy(Var(Tensor({2, 5})), one); }) ==
        "cross_entropy: logits [2, 5] have 2 rows but 1 targets were given");
}
