// Linear: y = x W (+ b), W stored (in, out), as checkpoints store every matrix.
#pragma once

#include "nn/module.h"

namespace tapegrad {
class Rng;
}

namespace tapegrad::nn {

/// A dense layer y = x W (+ b), W stored (in, out) (torch.nn.Linear stores its transpose).
class Linear : public Module {
 public:
  /// W ~ N(0, init_std^2); b (when present) starts at zero.
  Linear(std::size_t in, std::size_t out, bool bias, float init_std, Rng& rng);
  /// x (.., in) -> (.., out).
  Var forward(const Var& x) const;
  void members(Members& m) override;

  std::size_t in() const { return weight.shape()[0]; }   ///< The input size.
  std::size_t out() const { return weight.shape()[1]; }  ///< The output size.
  Var weight;  ///< (in, out)
  Var bias;    ///< (out) or undefined
};

}  // namespace tapegrad::nn
