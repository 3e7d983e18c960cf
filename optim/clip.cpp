// Global-norm gradient clipping: one pass to sum squares in double, one pass to scale (kernels on
// the kernel threads, with results that do not depend on their number).
#include "optim/clip.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "core/kernels.h"

namespace tapegrad::optim {

float clip_grad_norm(const ParameterList& params, float max_norm) {
  if (!(std::isfinite(max_norm) && max_norm > 0.0f))
    throw std::invalid_argument(fmt::format("clip_grad_norm: max_norm must be finite and > 0, got {}", max_norm));
  // In double: exact enough for millions of elements and free of float overflow above ~1.8e19
  // per element.
  double sum_squares = 0.0;
  for (const NamedParameter& p : params)
    if (p.var.has_grad()) sum_squares += kernels::sum_squares(p.var.grad().data(), p.var.grad().size());
  const double norm = std::sqrt(sum_squares);
  const double coefficient = double(max_norm) / (norm + 1e-6);
  if (std::isfinite(norm) && coefficient < 1.0) {
    const float c = float(coefficient);
    for (const NamedParameter& p : params) {
      if (!p.var.has_grad()) continue;
      Tensor& grad = Var(p.var).grad_buffer();
      kernels::scale_forward(grad.data(), grad.data(), c, grad.size());
    }
  }
  return float(norm);
}

}  // namespace tapegrad::optim
