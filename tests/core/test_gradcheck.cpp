// gradcheck itself: a wrong gradient is caught, so the gradient checks can fail.
#include <doctest/doctest.h>

#include "core/ops.h"
#include "support/checks.h"

using namespace tapegrad;

TEST_CASE("gradcheck catches a wrong gradient (the checks can fail)") {
  std::vector<double> x = test::random_vector<double>(6, 1), R = test::random_vector<double>(6, 2);
  auto square = [&] {
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * x[i];
    return y;
  };
  std::vector<double> right(6), wrong(6);
  for (std::size_t i = 0; i < 6; ++i) {
    right[i] = 2 * x[i] * R[i];
    wrong[i] = 2.02 * x[i] * R[i];  // a 1% error
  }
  CHECK(check_kernel_gradient<double>("x^2", x, square, R, right, test::kDoubleEps, test::kDoubleAtol,
                                      test::kDoubleRtol).ok);
  GradcheckReport bad = check_kernel_gradient<double>("x^2", x, square, R, wrong, test::kDoubleEps,
                                                      test::kDoubleAtol, test::kDoubleRtol);
  CHECK_FALSE(bad.ok);
  CHECK(test::contains(bad.message, "x^2: element 0"));

  // An input too large to perturb element by element (the sampled elements and random directions):
  // one gradient element off by 1e-2, and no sampled element, must still fail.
  const std::size_t n = 3000;
  std::vector<double> big = test::random_vector<double>(n, 3), big_R = test::random_vector<double>(n, 4);
  auto big_square = [&] {
    std::vector<double> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = big[i] * big[i];
    return y;
  };
  std::vector<double> big_right(n);
  for (std::size_t i = 0; i < n; ++i) big_right[i] = 2 * big[i] * big_R[i];
  CHECK(test::double_gradient_report("x^2", big, big_square, big_R, big_right).ok);
  std::vector<double> one_wrong = big_right;
  one_wrong[1234] += 1e-2;
  GradcheckReport sampled_bad = test::double_gradient_report("x^2", big, big_square, big_R, one_wrong);
  CHECK_FALSE(sampled_bad.ok);
  CHECK(test::contains(sampled_bad.message, "x^2: random direction"));

  // The float op checker too: an op whose tape misses part of its output's dependence fails.
  GradcheckReport op_bad = gradcheck(
      "leaky", [](const std::vector<Var>& v) {
        Var y = scale(v[0], 3.0f);
        Var extra;
        {
          NoGradScope no_grad;
          extra = scale(v[0], 0.1f);  // not recorded: its gradient is missing
        }
        return add(y, extra);
      },
      {test::random_tensor({3, 4}, 5)}, test::kFloatEps, test::kFloatAtol, test::kFloatRtol);
  CHECK_FALSE(op_bad.ok);
}
