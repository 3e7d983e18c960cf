// RMSNorm module (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * w, w starting at ones.
#pragma once

#include "nn/module.h"

namespace tapegrad::nn {

/// RMSNorm over the last axis with a weight (ones): the rms_norm op.
class RMSNorm : public Module {
 public:
  /// Normalises vectors of size dim; eps is added to the mean square.
  explicit RMSNorm(std::size_t dim, float eps = 1e-5f);
  Var forward(const Var& x) const;  ///< (.., D) -> (.., D)
  void members(Members& m) override;

  Var weight;  ///< (D)
  float eps;  ///< added to the mean square
};

}  // namespace tapegrad::nn
