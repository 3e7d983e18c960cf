// Gradient checks: analytic gradients against central finite differences of
// L(x) = sum(f(x) * R) for a fixed random R. check_kernel_gradient runs in any precision (the
// tests use double kernels); gradcheck runs differentiable float ops through a Tape.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/tape.h"

namespace tapegrad {

/// The outcome of a gradient check.
struct GradcheckReport {
  bool ok = true;            ///< every element passed
  double max_abs_error = 0;  ///< the largest |analytic - numerical| seen
  std::string message;       ///< the first failing element: input, index, analytic and numerical values
};

/// forward() reads x and returns f(x) (flattened); analytic is dL/dx for dL/dy = R.
/// An element passes when |analytic - numerical| <= atol + rtol * |numerical|.
template <class T>
GradcheckReport check_kernel_gradient(const std::string& what, std::vector<T>& x,
                                      const std::function<std::vector<T>()>& forward, const std::vector<T>& R,
                                      const std::vector<T>& analytic, double eps, double atol, double rtol) {
  GradcheckReport report;
  auto loss = [&] {
    std::vector<T> y = forward();
    double total = 0;
    for (std::size_t i = 0; i < y.size(); ++i) total += double(y[i]) * double(R[i]);
    return total;
  };
  for (std::size_t i = 0; i < x.size(); ++i) {
    T saved = x[i];
    x[i] = T(double(saved) + eps);
    double plus = loss();
    x[i] = T(double(saved) - eps);
    double minus = loss();
    x[i] = saved;
    double numerical = (plus - minus) / (2 * eps), error = std::fabs(double(analytic[i]) - numerical);
    report.max_abs_error = std::max(report.max_abs_error, error);
    if (report.ok && !(error <= atol + rtol * std::fabs(numerical))) {
      report.ok = false;
      report.message = fmt::format("{}: element {}: analytic {:.9g}, numerical {:.9g} (|diff| {:.3g} > {:.3g})",
                                   what, i, double(analytic[i]), numerical, error, atol + rtol * std::fabs(numerical));
    }
  }
  return report;
}

/// Checks d sum(f(inputs) * R)/d input for every input of a float op through a Tape: each input
/// becomes a leaf, R is drawn from a seeded normal, the loss is accumulated in double.
GradcheckReport gradcheck(const std::string& op, const std::function<Var(const std::vector<Var>&)>& f,
                          std::vector<Tensor> inputs, double eps = 1e-2, double atol = 2e-3, double rtol = 2e-3);

}  // namespace tapegrad
