// SGD with momentum: one tight loop per parameter, no allocation.
#include "optim/sgd.h"

#include <cmath>

#include "core/tape.h"

namespace tapegrad::optim {

namespace {
std::vector<std::string> sgd_slots(float momentum) {
  if (momentum == 0.0f) return {};
  return {"momentum"};
}
}  // namespace

SGD::SGD(ParameterList params, SGDOptions options)
    : Optimizer("SGD", std::move(params), sgd_slots(options.momentum), options.lr), options_(options) {
  detail::check_hyperparameter("SGD", "momentum", options.momentum,
                               std::isfinite(options.momentum) && options.momentum >= 0.0f && options.momentum < 1.0f,
                               "in [0, 1)");
  detail::check_hyperparameter("SGD", "weight_decay", options.weight_decay,
                               std::isfinite(options.weight_decay) && options.weight_decay >= 0.0f, "finite and >= 0");
}

void SGD::step() {
  advance_step();
  const float lr = this->lr(), momentum = options_.momentum;
  for (std::size_t i = 0; i < params().size(); ++i) {
    NamedParameter& p = mutable_params()[i];
    Var& var = p.var;
    const Held part = held_part(i);
    if (!var.has_grad() || part.count == 0) continue;
    const float wd = decays(p, options_.decay_all_params) ? options_.weight_decay : 0.0f;
    const float* grad = var.grad().data() + part.begin;
    float* value = var.mutable_value().data() + part.begin;  // bumps the version
    const std::size_t n = part.count;
    if (momentum == 0.0f) {
      for (std::size_t j = 0; j < n; ++j) value[j] -= lr * (grad[j] + wd * value[j]);
      continue;
    }
    float* buf = slot(i, 0);
    for (std::size_t j = 0; j < n; ++j) {
      const float g = grad[j] + wd * value[j];
      buf[j] = momentum * buf[j] + g;
      value[j] -= lr * buf[j];
    }
  }
}

}  // namespace tapegrad::optim
