// Gradient-check wrappers used by the op tests, with the tolerances they justify.
#pragma once

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/gradcheck.h"
#include "support/helpers.h"

namespace tapegrad::test {

// Double-precision kernels: central differences with eps = 1e-6 have truncation error
// O(eps^2 f''') ~ 1e-12 and rounding error ~ 1e-16 |L| / eps ~ 1e-9 for |L| ~ 10, so any
// gradient bug (errors of order 1e-2 or more) stands out against atol 1e-7 + rtol 1e-6.
constexpr double kDoubleEps = 1e-6, kDoubleAtol = 1e-7, kDoubleRtol = 1e-6;

// Float ops through the tape: eps = 1e-2 keeps the rounding noise of a float32 loss (relative
// 6e-8 of |L| ~ 10, divided by 2 eps: ~3e-5) well below the tolerance, while the truncation
// error of these smooth ops, O(eps^2) ~ 1e-4, also stays below atol 2e-3 + rtol 2e-3.
constexpr double kFloatEps = 1e-2, kFloatAtol = 2e-3, kFloatRtol = 2e-3;

// The loss of the checks, accumulated in double: L(x) = sum(forward(x) * R).
inline double weighted_sum(const std::vector<double>& y, const std::vector<double>& R) {
  double total = 0;
  for (std::size_t i = 0; i < y.size(); ++i) total += y[i] * R[i];
  return total;
}

/// The gradient check of a double kernel: forward() reads x, analytic is dL/dx for dy = R. Inputs
/// of up to 256 elements are perturbed one element at a time. Larger ones (2n forward passes would
/// take minutes under the sanitizers at n = 16,640): 16 elements one at a time (a fixed odd stride
/// drifting by one every 7, so that rows and columns both vary), the last one, and 4 random unit
/// directions u over every element at once, (L(x + eps u) - L(x - eps u)) / 2 eps against
/// <analytic, u>. An element whose gradient is off by e moves <analytic, u> by about e / sqrt(n):
/// a bug's 1e-2 at n = 16,640 by 8e-5, against a tolerance of about 1e-6.
inline GradcheckReport double_gradient_report(const std::string& what, std::vector<double>& x,
                                              const std::function<std::vector<double>()>& forward,
                                              const std::vector<double>& R, const std::vector<double>& analytic,
                                              double eps = kDoubleEps) {
  const std::size_t n = x.size();
  if (n <= 256) return check_kernel_gradient<double>(what, x, forward, R, analytic, eps, kDoubleAtol, kDoubleRtol);
  GradcheckReport report;
  auto passes = [&](const std::string& where, double numerical, double expected) {
    const double error = std::fabs(expected - numerical), limit = kDoubleAtol + kDoubleRtol * std::fabs(numerical);
    report.max_abs_error = std::max(report.max_abs_error, error);
    if (error <= limit) return true;
    report = {false, report.max_abs_error,
              fmt::format("{}: {}: analytic {:.9g}, numerical {:.9g} (|diff| {:.3g} > {:.3g})", what, where, expected,
                          numerical, error, limit)};
    return false;
  };
  const std::size_t elements = 16, stride = n / elements | 1;
  for (std::size_t k = 0; k <= elements; ++k) {
    const std::size_t i = k == elements ? n - 1 : (k * stride + k / 7) % n;
    const double saved = x[i];
    x[i] = saved + eps;
    const double plus = weighted_sum(forward(), R);
    x[i] = saved - eps;
    const double minus = weighted_sum(forward(), R);
    x[i] = saved;
    if (!passes(fmt::format("element {}", i), (plus - minus) / (2 * eps), analytic[i])) return report;
  }
  const std::vector<double> saved = x;
  for (std::uint64_t d = 0; d < 4; ++d) {
    std::vector<double> u = random_vector<double>(n, 1000 + d);
    const double norm = std::sqrt(weighted_sum(u, u));
    double expected = 0;
    for (std::size_t i = 0; i < n; ++i) expected += analytic[i] * (u[i] /= norm);
    for (std::size_t i = 0; i < n; ++i) x[i] = saved[i] + eps * u[i];
    const double plus = weighted_sum(forward(), R);
    for (std::size_t i = 0; i < n; ++i) x[i] = saved[i] - eps * u[i];
    const double minus = weighted_sum(forward(), R);
    x = saved;
    if (!passes(fmt::format("random direction {}", d), (plus - minus) / (2 * eps), expected)) return report;
  }
  return report;
}

/// double_gradient_report as a doctest check.
inline void check_double(const std::string& what, std::vector<double>& x,
                         const std::function<std::vector<double>()>& forward, const std::vector<double>& R,
                         const std::vector<double>& analytic, double eps = kDoubleEps) {
  GradcheckReport r = double_gradient_report(what, x, forward, R, analytic, eps);
  CHECK_MESSAGE(r.ok, r.message);
}

inline void check_float_op(const std::string& op, const std::function<Var(const std::vector<Var>&)>& f,
                           std::vector<Tensor> inputs) {
  GradcheckReport r = gradcheck(op, f, std::move(inputs), kFloatEps, kFloatAtol, kFloatRtol);
  CHECK_MESSAGE(r.ok, r.message);
}

}  // namespace tapegrad::test
