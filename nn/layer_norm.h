// LayerNorm (Ba et al. 2016) over the last axis: weight starts at ones, bias at zeros.
#pragma once

#include "nn/module.h"

namespace tapegrad::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::size_t dim, float eps = 1e-5f);
  /// x (.., D) -> (.., D)
  Var forward(const Var& x) const;
  void collect_params(const std::string& prefix, ParameterList& out) const override;

  Var weight, bias;  // (D)
  float eps;
};

}  // namespace tapegrad::nn
