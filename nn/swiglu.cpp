// SwiGLU module.
#include "nn/swiglu.h"

#include "core/ops.h"

namespace tapegrad::nn {

SwiGLU::SwiGLU(std::size_t d_model, std::size_t d_ff, float init_std, float out_std, Rng& rng)
    : w1(d_model, d_ff, false, init_std, rng), w3(d_model, d_ff, false, init_std, rng), w2(d_ff, d_model, false, out_std, rng) {}

Var SwiGLU::hidden(const Var& x) const { return swiglu(w1.forward(x), w3.forward(x)); }

Var SwiGLU::forward(const Var& x) const { return w2.forward(hidden(x)); }

void SwiGLU::collect_params(const std::string& prefix, ParameterList& out) const {
  w1.collect_params(prefix + "w1.", out);
  w3.collect_params(prefix + "w3.", out);
  w2.collect_params(prefix + "w2.", out);
}

}  // namespace tapegrad::nn
