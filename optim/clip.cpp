// Global-norm gradient clipping: one pass to sum squares in double, one pass to scale.
#include "optim/clip.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace tapegrad::optim {

float clip_grad_norm(const ParameterList& params, float max_norm) {
  if (!(std::isfinite(max_norm) && max_norm > 0.0f))
    throw std::invalid_argument(fmt::format("clip_grad_norm: max_norm must be finite and > 0, got {}", max_norm));
  double sum_squares = 0.0;
  for (const NamedParameter& p : params) {
    if (!p.var.has_grad()) continue;
    const Tensor& grad = p.var.grad();
    const float* g = grad.data();
    // Four partial sums: independent chains the compiler can pipeline (double keeps the total
    // exact enough for millions of elements and free of float overflow above ~1.8e19 per element).
    double partial[4] = {0.0, 0.0, 0.0, 0.0};
    const std::size_t n = grad.size();
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (std::size_t k = 0; k < 4; ++k) partial[k] += double(g[i + k]) * double(g[i + k]);
    for (; i < n; ++i) partial[0] += double(g[i]) * double(g[i]);
    sum_squares += (partial[0] + partial[1]) + (partial[2] + partial[3]);
  }
  const double norm = std::sqrt(sum_squares);
  const double coefficient = double(max_norm) / (norm + 1e-6);
  if (std::isfinite(norm) && coefficient < 1.0) {
    const float c = float(coefficient);
    for (const NamedParameter& p : params) {
      if (!p.var.has_grad()) continue;
      Tensor& grad = Var(p.var).grad_buffer();
      float* g = grad.data();
      for (std::size_t i = 0; i < grad.size(); ++i) g[i] *= c;
    }
  }
  return float(norm);
}

}  // namespace tapegrad::optim
