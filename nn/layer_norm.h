// LayerNorm (Ba et al. 2016) over the last axis: weight starts at ones, bias at zeros.
#pragma once

#include "nn/module.h"

namespace tapegrad::nn {

/// LayerNorm over the last axis with a weight (ones) and a bias (zeros): the layer_norm op.
class LayerNorm : public Module {
 public:
  /// Normalises vectors of size dim; eps is added to the variance.
  explicit LayerNorm(std::size_t dim, float eps = 1e-5f);
  /// x (.., D) -> (.., D)
  Var forward(const Var& x) const;
  void members(Members& m) override;

  Var weight;  ///< (D), starts at ones
  Var bias;    ///< (D), starts at zeros
  float eps;  ///< added to the variance
};

}  // namespace tapegrad::nn
