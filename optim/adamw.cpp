// AdamW: the per-step scalars in double, then one fused, allocation-free loop per parameter.
#include "optim/adamw.h"

#include <cmath>

#include "core/tape.h"

namespace tapegrad::optim {

namespace {

// The elementwise AdamW update of one parameter of n elements (scalars precomputed by step()):
// p = p * decay; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps).
// The loop reads each element once and has no dependence between iterations, so -O3 vectorises
// it (sqrt and division included); __restrict tells the compiler the four arrays never alias.
void adamw_update(float* __restrict p, float* __restrict m, float* __restrict v, const float* __restrict g,
                  std::size_t n, float decay, float beta1, float beta2, float step_size, float inv_bc2_sqrt,
                  float eps) {
  const float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
  for (std::size_t i = 0; i < n; ++i) {
    const float grad = g[i];
    const float mi = beta1 * m[i] + one_minus_beta1 * grad;
    const float vi = beta2 * v[i] + one_minus_beta2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_bc2_sqrt + eps);
  }
}

}  // namespace

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

void AdamW::step() {
  const std::int64_t t = advance_step();
  // The scalars are combined in double and rounded to float once, as PyTorch does with its
  // Python-float hyperparameters.
  const double lr = this->lr(), beta1 = options_.beta1, beta2 = options_.beta2;
  const double bias_correction1 = 1.0 - std::pow(beta1, double(t));
  const double bias_correction2 = 1.0 - std::pow(beta2, double(t));
  const float step_size = float(lr / bias_correction1);
  const float inv_bc2_sqrt = float(1.0 / std::sqrt(bias_correction2));
  const float decay_factor = float(1.0 - lr * double(options_.weight_decay));
  for (std::size_t i = 0; i < params().size(); ++i) {
    const NamedParameter& p = params()[i];
    Var var = p.var;
    if (!var.has_grad()) continue;
    const float decay = decays(p, options_.decay_all_params) ? decay_factor : 1.0f;
    const float* grad = var.grad().data();
    float* value = var.mutable_value().data();  // bumps the version
    adamw_update(value, slot(i, 0).data(), slot(i, 1).data(), grad, var.value().size(), decay, options_.beta1,
                 options_.beta2, step_size, inv_bc2_sqrt, options_.eps);
  }
}

}  // namespace tapegrad::optim
