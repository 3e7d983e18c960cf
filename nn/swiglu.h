// SwiGLU feed-forward (Shazeer 2020): (silu(x W1) * (x W3)) W2, no biases.
#pragma once

#include "nn/linear.h"

namespace tapegrad::nn {

class SwiGLU : public Module {
 public:
  SwiGLU(std::size_t d_model, std::size_t d_ff, float init_std, float out_std, Rng& rng);
  Var forward(const Var& x) const;  // (.., D) -> (.., D)
  /// silu(x W1) * (x W3), before W2 (the block folds its residual add into that projection).
  Var hidden(const Var& x) const;  // (.., D) -> (.., F)
  void collect_params(const std::string& prefix, ParameterList& out) const override;

  Linear w1, w3, w2;  // (D, F), (D, F), (F, D)
};

}  // namespace tapegrad::nn
