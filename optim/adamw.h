// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019, Algorithm 2), in the update
// order of torch.optim.AdamW: p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
#pragma once

#include "optim/optimizer.h"

namespace tapegrad::optim {

/// AdamW hyperparameters, torch.optim.AdamW's defaults.
struct AdamWOptions {
  float lr = 1e-3f;            ///< the learning rate (a schedule may change it; see set_lr)
  float beta1 = 0.9f;          ///< decay of the first moment m
  float beta2 = 0.999f;        ///< decay of the second moment v
  float eps = 1e-8f;           ///< added to sqrt(v) in the denominator
  float weight_decay = 0.01f;  ///< decoupled: p -= lr * weight_decay * p
  bool decay_all_params = false;  ///< false: decay matrices (rank >= 2) only, never norm weights or biases
};

/// AdamW (Loshchilov and Hutter 2019): Adam with decoupled weight decay, as torch.optim.AdamW.
class AdamW : public Optimizer {
 public:
  /// Validates the options (lr, eps, weight_decay finite and >= 0; betas in [0, 1)); the state
  /// is two slots per parameter, "m" (first moment) and "v" (second moment).
  AdamW(ParameterList params, AdamWOptions options = {});

  /// One AdamW update (file comment) of every parameter with a gradient, t = steps() after the
  /// call. The bias corrections use the optimizer's step count, shared by all parameters.
  void step() override;
  /// The same update with each gradient multiplied by grad_scale as it is read (the gradients
  /// are left unscaled): one pass over the parameters, their state and gradients.
  void step_scaled(float grad_scale) override;
  /// The options given at construction (options().lr is the initial lr; see lr()).
  const AdamWOptions& options() const { return options_; }

 protected:
  /// v is a running mean of squares: a negative element would make the next step's sqrt NaN.
  const char* invalid_slot_value(std::size_t slot, float value) const override;

 private:
  AdamWOptions options_;
};

}  // namespace tapegrad::optim
