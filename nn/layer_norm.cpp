// LayerNorm module on the fused layer_norm op.
#include "nn/layer_norm.h"

#include "core/ops.h"

namespace tapegrad::nn {

LayerNorm::LayerNorm(std::size_t dim, float eps_) : weight(parameter({dim})), bias(parameter({dim})), eps(eps_) {
  weight.mutable_value().fill(1.0f);
}

Var LayerNorm::forward(const Var& x) const { return layer_norm(x, weight, bias, eps); }

void LayerNorm::members(Members& m) {
  m("weight", weight);
  m("bias", bias);
}

}  // namespace tapegrad::nn
