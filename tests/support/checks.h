// Gradient-check wrappers used by the op tests, with the tolerances they justify.
#pragma once

#include <doctest/doctest.h>

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

/// Checks a double kernel: forward() reads x, analytic is dL/dx for dy = R.
inline void check_double(const std::string& what, std::vector<double>& x,
                         const std::function<std::vector<double>()>& forward, const std::vector<double>& R,
                         const std::vector<double>& analytic) {
  GradcheckReport r = check_kernel_gradient<double>(what, x, forward, R, analytic, kDoubleEps, kDoubleAtol,
                                                    kDoubleRtol);
  CHECK_MESSAGE(r.ok, r.message);
}

inline void check_float_op(const std::string& op, const std::function<Var(const std::vector<Var>&)>& f,
                           std::vector<Tensor> inputs) {
  GradcheckReport r = gradcheck(op, f, std::move(inputs), kFloatEps, kFloatAtol, kFloatRtol);
  CHECK_MESSAGE(r.ok, r.message);
}

}  // namespace tapegrad::test
