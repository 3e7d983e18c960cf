// Linear layer.
#include "nn/linear.h"

#include "core/ops.h"
#include "core/random.h"

namespace tapegrad::nn {

Linear::Linear(std::size_t in, std::size_t out, bool has_bias, float init_std, Rng& rng) : weight(parameter({in, out})) {
  rng.fill_normal(weight.mutable_value(), init_std);
  if (has_bias) bias = parameter({out});
}

Var Linear::forward(const Var& x) const {
  return bias.defined() ? add_matmul(bias, x, weight) : matmul(x, weight);
}

void Linear::members(Members& m) {
  m("weight", weight);
  m("bias", bias);  // skipped when the layer has none
}

}  // namespace tapegrad::nn
