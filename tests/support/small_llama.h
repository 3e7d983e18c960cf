// The small Llamas the nn tests share: one to train, decode and save, and a smaller one for
// finite-difference gradient checks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "nn/models/llama.h"

namespace tapegrad::test {

/// vocab 11, d_model 16, 4 heads of 4 on kv_heads KV heads, 2 blocks, max_len 24, d_ff 24.
inline nn::LlamaConfig small_llama_config(bool tied_head = false, std::size_t kv_heads = 2, std::uint64_t seed = 3) {
  nn::LlamaConfig c{.vocab = 11, .d_model = 16, .n_heads = 4, .n_blocks = 2, .max_len = 24};
  c.n_kv_heads = kv_heads, c.d_ff = 24, c.tied_head = tied_head, c.seed = seed;
  return c;
}

/// vocab 7, d_model 8, 2 heads on kv_heads KV heads, 2 blocks, max_len 5, d_ff 12: small enough
/// for central differences over every parameter.
inline nn::LlamaConfig gradcheck_llama_config(std::size_t kv_heads, bool tied_head = false) {
  nn::LlamaConfig c{.vocab = 7, .d_model = 8, .n_heads = 2, .n_blocks = 2, .max_len = 5};
  c.n_kv_heads = kv_heads, c.d_ff = 12, c.tied_head = tied_head;
  return c;
}

}  // namespace tapegrad::test
