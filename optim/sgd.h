// Stochastic gradient descent with momentum, as torch.optim.SGD (dampening 0, no Nesterov):
// g = grad + wd p (coupled L2 decay); buf = momentum buf + g; p -= lr buf.
#pragma once

#include "optim/optimizer.h"

namespace tapegrad::optim {

/// SGD hyperparameters; the defaults are plain SGD without momentum or decay.
struct SGDOptions {
  float lr = 1e-2f;               ///< the learning rate (a schedule may change it; see set_lr)
  float momentum = 0.0f;          ///< 0: plain p -= lr g, and no state tensors
  float weight_decay = 0.0f;      ///< L2 term wd * p added to the gradient (coupled, as PyTorch's SGD)
  bool decay_all_params = false;  ///< false: decay matrices (rank >= 2) only, never norm weights or biases
};

/// Stochastic gradient descent with optional momentum and L2 weight decay, as torch.optim.SGD.
class SGD : public Optimizer {
 public:
  /// Validates the options (lr, momentum, weight_decay finite and >= 0; momentum < 1); with
  /// momentum the state is one slot "momentum" per parameter (PyTorch's momentum_buffer).
  SGD(ParameterList params, SGDOptions options = {});

  /// p -= lr (momentum buf + grad + wd p) for every parameter with a gradient (see the file comment).
  void step() override;
  /// The options given at construction (options().lr is the initial lr; see lr()).
  const SGDOptions& options() const { return options_; }

 private:
  SGDOptions options_;
};

}  // namespace tapegrad::optim
