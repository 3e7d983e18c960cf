// Embedding lookup.
#include "nn/embedding.h"

#include <stdexcept>

#include "core/ops.h"
#include "core/random.h"

namespace tapegrad::nn {

Embedding::Embedding(std::size_t vocab, std::size_t dim, float init_std, Rng& rng) : weight(parameter({vocab, dim})) {
  rng.fill_normal(weight.mutable_value(), init_std);
}

Var Embedding::forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const {
  if (packed)
    throw std::logic_error("Embedding::forward: the table is packed for inference (nn/packed_weights.h); decode "
                           "through a KVCache, or load it as f32 to run the full forward or train");
  return reshape(embedding(weight, ids), {batch, seq_len, weight.shape()[1]});
}

void Embedding::members(Members& m) { m("weight", weight); }

}  // namespace tapegrad::nn
