// Embedding: a (vocab, d_model) table looked up by token id.
#pragma once

#include <memory>
#include <span>

#include "core/quant/packed_matrix.h"
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

  Var weight;  ///< (V, D); undefined when the table is packed
  /// Inference only: the table (V, D) in a block format (nn/packed_weights.h), which decoding
  /// (CachePass) reads instead of weight; never a parameter, never trained.
  std::shared_ptr<const quant::PackedMatrix> packed;
};

}  // namespace tapegrad::nn
