// Causal multi-head (or grouped-query) attention with dropout on the probabilities, for the
// blocks of every architecture: the fused attention op when dropout is off, otherwise the same math from
// primitives (tests/core/test_fused_vs_composed.cpp checks that the two agree).
#pragma once

#include "nn/dropout.h"

namespace tapegrad::nn {

/// softmax(q k^T / sqrt(Dh) + causal mask) v per head, head h with KV head h / (H / KVH); q
/// (B, T, H*Dh), k and v (B, T, KVH*Dh) -> (B, T, H*Dh). drop (when active) zeroes probabilities
/// with masks drawn from rng.
Var causal_attention(const Var& q, const Var& k, const Var& v, AttentionHeads heads, const Dropout& drop, Rng& rng);

}  // namespace tapegrad::nn
