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
