// Causal multi-head attention with dropout on the probabilities, for the blocks of both
// architectures: the fused attention op when dropout is off, otherwise the same math from
// primitives (tests/core/test_fused_vs_composed.cpp checks that the two agree).
#pragma once

#include "nn/dropout.h"

namespace tapegrad::nn {

/// softmax(q k^T / sqrt(Dh) + causal mask) v per head; q, k, v (B, T, H*Dh) -> (B, T, H*Dh).
/// drop (when active) zeroes probabilities with masks drawn from rng.
Var causal_attention(const Var& q, const Var& k, const Var& v, std::size_t n_heads, const Dropout& drop, Rng& rng);

}  // namespace tapegrad::nn
