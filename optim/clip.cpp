// Global-norm gradient clipping: one pass to sum squares in double, one pass to scale, or the
// scaling handed to the optimizer's update (kernels on the kernel threads, with results that do
// not depend on their number).
#include "optim/clip.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "core/kernels.h"

namespace tapegrad::optim {

namespace {

/// max_norm checked, then the global norm of params' gradients, in double: exact enough for
/// millions of elements and free of float overflow above ~1.8e19 per element.
double norm_for_clipping(const ParameterList& params, float max_norm) {
  if (!(std::isfinite(max_norm) && max_norm > 0.0f))
    throw std::invalid_argument(fmt::format("clip_grad_norm: max_norm must be finite and > 0, got {}", max_norm));
  double sum_squares = 0.0;
  for (const NamedParameter& p : params)
    if (p.var.has_grad()) sum_squares += kernels::sum_squares(p.var.grad().data(), p.var.grad().size());
  return std::sqrt(sum_squares);
}

/// The factor clipping multiplies every gradient by: max_norm / (norm + 1e-6) rounded to float
/// when below 1, else exactly 1 (which leaves every gradient's bits as they are).
float clip_coefficient(double norm, float max_norm) {
  const double coefficient = double(max_norm) / (norm + 1e-6);
  return std::isfinite(norm) && coefficient < 1.0 ? float(coefficient) : 1.0f;
}

}  // namespace

float clip_grad_norm(const ParameterList& params, float max_norm) {
  const double norm = norm_for_clipping(params, max_norm);
  const float c = clip_coefficient(norm, max_norm);
  if (c != 1.0f)
    for (const NamedParameter& p : params) {
      if (!p.var.has_grad()) continue;
      Tensor& grad = Var(p.var).grad_buffer();
      kernels::scale_forward(grad.data(), grad.data(), c, grad.size());
    }
  return float(norm);
}

float clip_grad_norm_and_step(Optimizer& optimizer, float max_norm) {
  const double norm = norm_for_clipping(optimizer.params(), max_norm);
  if (std::isfinite(norm)) optimizer.step_scaled(clip_coefficient(norm, max_norm));
  return float(norm);
}

}  // namespace tapegrad::optim
