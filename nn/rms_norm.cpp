// RMSNorm module.
#include "nn/rms_norm.h"

#include "core/ops.h"

namespace tapegrad::nn {

RMSNorm::RMSNorm(std::size_t dim, float eps_) : weight(parameter({dim})), eps(eps_) { weight.mutable_value().fill(1.0f); }

Var RMSNorm::forward(const Var& x) const { return rms_norm(x, weight, eps); }

void RMSNorm::members(Members& m) { m("weight", weight); }

}  // namespace tapegrad::nn
