// causal_attention: fused, or composed with dropout on the probabilities.
#include "nn/causal_attention.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace tapegrad::nn {

Var causal_attention(const Var& q, const Var& k, const Var& v, AttentionHeads heads, const Dropout& drop, Rng& rng) {
  if (!drop.active()) return attention(q, k, v, heads);
  const Shape& s = q.shape();
  const std::size_t n_heads = heads.n_heads, n_kv_heads = heads.n_kv_heads;
  if (s.size() != 3 || n_heads == 0 || s[2] % n_heads != 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0)
    throw std::invalid_argument(fmt::format("causal_attention: expected q (B, T, H*Dh) with {} heads and {} KV heads "
                                            "dividing them, got {}",
                                            n_heads, n_kv_heads, to_string(s)));
  const std::size_t batch = s[0], seq_len = s[1], d_model = s[2], head_dim = d_model / n_heads;
  const std::size_t group = n_heads / n_kv_heads;
  Tensor mask({seq_len, seq_len});  // (T, T): -inf above the diagonal
  for (std::size_t i = 0; i < seq_len; ++i)
    for (std::size_t j = i + 1; j < seq_len; ++j) mask[i * seq_len + j] = -std::numeric_limits<float>::infinity();
  auto split = [&](const Var& t) { return permute(reshape(t, {batch, seq_len, n_heads, head_dim}), {0, 2, 1, 3}); };
  // Each KV head repeated for its query heads (its gradient the sum of theirs), then as q.
  auto repeated = [&](const Var& t) {
    if (group == 1) return split(t);
    Var wide = expand(reshape(t, {batch, seq_len, n_kv_heads, 1, head_dim}),
                      {batch, seq_len, n_kv_heads, group, head_dim});
    return split(reshape(wide, {batch, seq_len, d_model}));
  };
  Var scores = matmul(split(q), repeated(k), false, true) * (1.0f / std::sqrt(float(head_dim))) + Var(mask);  // (B, H, T, T)
  Var probs = drop.forward(softmax(scores, -1), rng);
  Var out = matmul(probs, repeated(v));  // (B, H, T, Dh)
  return reshape(permute(out, {0, 2, 1, 3}), {batch, seq_len, d_model});
}

}  // namespace tapegrad::nn
