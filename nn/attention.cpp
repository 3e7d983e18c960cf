// RotaryAttention module.
#include "nn/attention.h"

#include "core/ops.h"
#include "nn/causal_attention.h"

namespace tapegrad::nn {

RotaryAttention::RotaryAttention(std::size_t d_model, std::size_t heads,
                                 std::shared_ptr<const kernels::RopeTable<float>> rope, float init_std, float out_std,
                                 Rng& rng)
    : n_heads(heads),
      rope_table(std::move(rope)),
      wq(d_model, d_model, false, init_std, rng),
      wk(d_model, d_model, false, init_std, rng),
      wv(d_model, d_model, false, init_std, rng),
      wo(d_model, d_model, false, out_std, rng) {}

Var RotaryAttention::heads(const Var& x) const {
  Var q = rope(wq.forward(x), rope_table, n_heads);
  Var k = rope(wk.forward(x), rope_table, n_heads);
  return attention(q, k, wv.forward(x), n_heads);
}

Var RotaryAttention::heads(const Var& x, const Dropout& drop, Rng& rng) const {
  Var q = rope(wq.forward(x), rope_table, n_heads);
  Var k = rope(wk.forward(x), rope_table, n_heads);
  return causal_attention(q, k, wv.forward(x), n_heads, drop, rng);
}

Var RotaryAttention::forward(const Var& x) const { return wo.forward(heads(x)); }

void RotaryAttention::collect_params(const std::string& prefix, ParameterList& out) const {
  wq.collect_params(prefix + "wq.", out);
  wk.collect_params(prefix + "wk.", out);
  wv.collect_params(prefix + "wv.", out);
  wo.collect_params(prefix + "wo.", out);
}

}  // namespace tapegrad::nn
