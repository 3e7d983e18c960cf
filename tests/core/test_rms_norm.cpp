// rms_norm: its formula, its gradient by central differences, and its shape errors.
#include <doctest/doctest.h>

#include <cmath>

#include "core/ops.h"
#include "support/checks.h"

using namespace tapegrad;

TEST_CASE("rms_norm matches x / sqrt(mean(x^2) + eps) * w") {
  Tensor x = test::random_tensor({2, 3, 8}, 1), w = test::random_tensor({8}, 2);
  Tensor y = rms_norm(Var(x), Var(w), 1e-5f).value();
  for (std::size_t r = 0; r < 6; ++r) {
    double ms = 0;
    for (std::size_t j = 0; j < 8; ++j) ms += double(x[r * 8 + j]) * x[r * 8 + j];
    double inv = 1 / std::sqrt(ms / 8 + 1e-5);
    for (std::size_t j = 0; j < 8; ++j) CHECK(y[r * 8 + j] == doctest::Approx(x[r * 8 + j] * inv * w[j]).epsilon(1e-5));
  }
}

TEST_CASE("rms_norm backward matches central differences in double and in float") {
  for (auto [rows, dim] : {std::pair{1, 1}, {1, 6}, {5, 7}, {3, 33}}) {
    auto x = test::random_vector<double>(rows * dim, 1), w = test::random_vector<double>(dim, 2);
    auto R = test::random_vector<double>(rows * dim, 3);
    std::vector<double> dx(rows * dim), dw(dim), rstd(rows);
    std::vector<double> y(rows * dim);
    kernels::rms_norm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5);
    kernels::rms_norm_backward<double>(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), rows, dim);
    auto forward = [&] {
      std::vector<double> out(rows * dim);
      kernels::rms_norm_forward<double>(out.data(), nullptr, x.data(), w.data(), rows, dim, 1e-5);
      return out;
    };
    test::check_double("rms_norm dx", x, forward, R, dx);
    test::check_double("rms_norm dw", w, forward, R, dw);
  }
  test::check_float_op("rms_norm", [](const std::vector<Var>& v) { return rms_norm(v[0], v[1]); },
                       {test::random_tensor({2, 3, 6}, 4), test::random_tensor({6}, 5)});
}

TEST_CASE("rms_norm names the weight shape it expected") {
  CHECK(test::error_of([] { rms_norm(Var(Tensor({4, 8})), Var(Tensor({4}))); }) ==
        "rms_norm: expected weight to be [8], got [4]");
}
