// RotaryAttention: causal multi-head self-attention with RoPE on q and k (SPEC section 2):
// q = x Wq, k = x Wk, v = x Wv, heads are contiguous column chunks, out = attn(q, k, v) Wo.
#pragma once

#include <memory>

#include "core/kernels.h"
#include "nn/dropout.h"
#include "nn/linear.h"

namespace tapegrad::nn {

class RotaryAttention : public Module {
 public:
  RotaryAttention(std::size_t d_model, std::size_t n_heads, std::shared_ptr<const kernels::RopeTable<float>> rope,
                  float init_std, float out_std, Rng& rng);
  Var forward(const Var& x) const;  // (B, T, D) -> (B, T, D)
  /// attn(q, k, v): the heads' outputs side by side, before Wo (the block folds its residual add
  /// into that projection).
  Var heads(const Var& x) const;
  /// The same with dropout on the attention probabilities (nn/causal_attention.h).
  Var heads(const Var& x, const Dropout& drop, Rng& rng) const;
  void collect_params(const std::string& prefix, ParameterList& out) const override;

  std::size_t n_heads;
  std::shared_ptr<const kernels::RopeTable<float>> rope_table;  // shared by every block
  Linear wq, wk, wv, wo;
};

}  // namespace tapegrad::nn
