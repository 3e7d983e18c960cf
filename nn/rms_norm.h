// RMSNorm module (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * w, w starting at ones.
#pragma once

#include "nn/module.h"

namespace tapegrad::nn {

class RMSNorm : public Module {
 public:
  explicit RMSNorm(std::size_t dim, float eps = 1e-5f);
  Var forward(const Var& x) const;  // (.., D) -> (.., D)
  void collect_params(const std::string& prefix, ParameterList& out) const override;

  Var weight;  // (D)
  float eps;
};

}  // namespace tapegrad::nn
