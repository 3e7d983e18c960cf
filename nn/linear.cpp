// Linear layer.
#include "nn/linear.h"

#include <stdexcept>

#include "core/ops.h"
#include "core/random.h"

namespace tapegrad::nn {

Linear::Linear(std::size_t in, std::size_t out, bool has_bias, float init_std, Rng& rng) : weight(parameter({in, out})) {
  rng.fill_normal(weight.mutable_value(), init_std);
  if (has_bias) bias = parameter({out});
}

Var LoraAdapter::add_to(const Var& y, const Var& x, const Tensor* known_output) const {
  Var down = matmul(x, a);  // (.., r)
  Var scaled = tapegrad::scale(down, scale());
  return add_matmul(y, scaled, b, known_output);
}

Var Linear::forward(const Var& x) const {
  if (packed)
    throw std::logic_error("Linear::forward: the weights are packed for inference (nn/packed_weights.h); decode through "
                           "a KVCache, or load them as f32 to run the full forward or train");
  Var y = bias.defined() ? add_matmul(bias, x, weight) : matmul(x, weight);
  return adapter ? adapter->add_to(y, x) : y;
}

void Linear::members(Members& m) {
  m("weight", weight);
  m("bias", bias);  // skipped when the layer has none
  if (adapter) {
    m("lora_a", adapter->a);
    m("lora_b", adapter->b);
  }
}

}  // namespace tapegrad::nn
