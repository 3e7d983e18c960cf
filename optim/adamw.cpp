// AdamW: the per-step scalars in double, then one fused, allocation-free loop per parameter.
#include "optim/adamw.h"

#include <xsimd/xsimd.hpp>

#include <cmath>

#include "core/tape.h"

namespace tapegrad::optim {

namespace {

// The per-step scalars of the update, rounded to float once.
struct Scalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, inv_bc2_sqrt, eps;
};

// p = p * decay; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= step_size * m / (sqrt(v) / sqrt(bias_correction2) + eps), on a float or an xsimd batch.
template <class V>
void adamw_element(V& p, V& m, V& v, V g, const Scalars& s) {
  using std::sqrt;  // xsimd::sqrt for batches, by argument-dependent lookup
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  p = p * s.decay - s.step_size * m / (sqrt(v) * s.inv_bc2_sqrt + s.eps);
}

// The update of one parameter of n elements: xsimd batches, then a scalar tail. Explicit SIMD
// because std::sqrt's errno handling keeps the compiler from vectorising a plain loop.
void adamw_update(float* p, float* m, float* v, const float* g, std::size_t n, const Scalars& s) {
  using Batch = xsimd::batch<float>;
  constexpr std::size_t W = Batch::size;
  std::size_t i = 0;
  for (; i + W <= n; i += W) {
    Batch pb = Batch::load_unaligned(p + i), mb = Batch::load_unaligned(m + i), vb = Batch::load_unaligned(v + i);
    adamw_element(pb, mb, vb, Batch::load_unaligned(g + i), s);
    pb.store_unaligned(p + i);
    mb.store_unaligned(m + i);
    vb.store_unaligned(v + i);
  }
  for (; i < n; ++i) adamw_element(p[i], m[i], v[i], g[i], s);
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

const char* AdamW::invalid_slot_value(std::size_t slot, float value) const {
  if (slot == 1 && value < 0.0f) return "the second moment v must be >= 0";
  return Optimizer::invalid_slot_value(slot, value);
}

void AdamW::step() {
  const std::int64_t t = advance_step();
  // The scalars are combined in double and rounded to float once, as PyTorch does with its
  // Python-float hyperparameters.
  const double lr = this->lr(), beta1 = options_.beta1, beta2 = options_.beta2;
  const double bias_correction1 = 1.0 - std::pow(beta1, double(t));
  const double bias_correction2 = 1.0 - std::pow(beta2, double(t));
  Scalars scalars{1.0f,
                  options_.beta1,
                  float(1.0 - beta1),
                  options_.beta2,
                  float(1.0 - beta2),
                  float(lr / bias_correction1),
                  float(1.0 / std::sqrt(bias_correction2)),
                  options_.eps};
  const float decay_factor = float(1.0 - lr * double(options_.weight_decay));
  for (std::size_t i = 0; i < params().size(); ++i) {
    NamedParameter& p = mutable_params()[i];
    Var& var = p.var;
    const Held part = held_part(i);
    if (!var.has_grad() || part.count == 0) continue;
    scalars.decay = decays(p, options_.decay_all_params) ? decay_factor : 1.0f;
    const float* grad = var.grad().data() + part.begin;
    float* value = var.mutable_value().data() + part.begin;  // bumps the version
    adamw_update(value, slot(i, 0), slot(i, 1), grad, part.count, scalars);
  }
}

}  // namespace tapegrad::optim
