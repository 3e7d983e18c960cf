// AdamW: the per-step scalars in double, then the fused update kernel on each parameter.
#include "optim/adamw.h"

#include <cmath>

#include "core/kernels.h"
#include "core/tape.h"

namespace tapegrad::optim {

AdamW::AdamW(ParameterList params, AdamWOptions options)
    : Optimizer("AdamW", std::move(params), {"m", "v"}, options.lr), options_(options) {
  auto in_unit = [](float b) { return std::isfinite(b) && b >= 0.0f && b < 1.0f; };
  detail::check_hyperparameter("AdamW", "beta1", options.beta1, in_unit(options.beta1), "in [0, 1)");
  detail::check_hyperparameter("AdamW", "beta2", options.beta2, in_unit(options.beta2), "in [0, 1)");
  detail::check_hyperparameter("AdamW", "eps", options.eps, std::isfinite(options.eps) && options.eps >= 0.0f,
                               "finite and >= 0");
  detail::check_hyperparameter("AdamW", "weight_decay", options.weight_decay,
                               std::isfinite(options.weight_decay) && options.weight_decay >= 0.0f,
                               "finite and >= 0");
}

const char* AdamW::invalid_slot_value(std::size_t slot, float value) const {
  if (slot == 1 && value < 0.0f) return "the second moment v must be >= 0";
  return Optimizer::invalid_slot_value(slot, value);
}

void AdamW::step() { step_scaled(1.0f); }

void AdamW::step_scaled(float grad_scale) {
  const std::int64_t t = advance_step();
  // The scalars are combined in double and rounded to float once, as PyTorch does with its
  // Python-float hyperparameters.
  const double lr = this->lr(), beta1 = options_.beta1, beta2 = options_.beta2;
  const double bias_correction1 = 1.0 - std::pow(beta1, double(t));
  const double bias_correction2 = 1.0 - std::pow(beta2, double(t));
  kernels::AdamWScalars<float> scalars{.decay = 1.0f,
                                       .beta1 = options_.beta1,
                                       .one_minus_beta1 = float(1.0 - beta1),
                                       .beta2 = options_.beta2,
                                       .one_minus_beta2 = float(1.0 - beta2),
                                       .step_size = float(lr / bias_correction1),
                                       .inv_bc2_sqrt = float(1.0 / std::sqrt(bias_correction2)),
                                       .eps = options_.eps,
                                       .grad_scale = grad_scale};
  const float decay_factor = float(1.0 - lr * double(options_.weight_decay));
  for (std::size_t i = 0; i < params().size(); ++i) {
    NamedParameter& p = mutable_params()[i];
    Var& var = p.var;
    const Held part = held_part(i);
    if (!var.has_grad() || part.count == 0) continue;
    scalars.decay = decays(p, options_.decay_all_params) ? decay_factor : 1.0f;
    const float* grad = var.grad().data() + part.begin;
    float* value = var.mutable_value().data() + part.begin;  // bumps the version
    kernels::adamw_update(value, slot(i, 0), slot(i, 1), grad, part.count, scalars);
  }
}

}  // namespace tapegrad::optim
