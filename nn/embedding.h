// Embedding: a (vocab, d_model) table looked up by token id.
#pragma once

#include <span>

#include "nn/module.h"

namespace tapegrad {
class Rng;
}

namespace tapegrad::nn {

/// A table of learned vectors, one row per token id (torch.nn.Embedding).
class Embedding : public Module {
 public:
  /// Table ~ N(0, init_std^2).
  Embedding(std::size_t vocab, std::size_t dim, float init_std, Rng& rng);
  /// ids (B*T) -> (B, T, D); throws naming an id >= vocab.
  Var forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const;
  void members(Members& m) override;

  Var weight;  ///< (V, D)
};

}  // namespace tapegrad::nn
