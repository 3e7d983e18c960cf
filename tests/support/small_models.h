// The small decoders the KV-cache and generate tests share: each architecture at vocab 13,
// d_model 16, and a way to sharpen their logits so that differences show.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "core/random.h"
#include "nn/models/gpt2.h"
#include "nn/models/llama.h"
#include "nn/models/rotary_decoder.h"

namespace tapegrad::test {

// Scales every matrix up so that logits are far from uniform and differences show.
template <class M>
void sharpen(M& model, std::uint64_t seed) {
  Rng rng(seed);
  for (auto& p : model.params())
    if (p.var.shape().size() == 2) rng.fill_normal(p.var.mutable_value(), 0.3f);
}

// A Llama of grouped-query attention: heads KV heads sharing each of kv_heads, untied head.
inline nn::Llama grouped_llama(std::size_t d_model, std::size_t heads, std::size_t kv_heads, std::size_t n_blocks,
                                std::size_t max_len, std::optional<std::size_t> d_ff) {
  nn::LlamaConfig c{.vocab = 13, .d_model = d_model, .n_heads = heads, .n_blocks = n_blocks, .max_len = max_len};
  c.n_kv_heads = kv_heads, c.d_ff = d_ff;
  return nn::Llama(c);
}

// Each architecture at vocab 13, d_model 16, 2 heads (Llama: 4 heads on 2 KV heads).
template <class M>
M small_model(std::size_t max_len, std::size_t n_blocks = 2, std::optional<std::size_t> d_ff = 40) {
  if constexpr (std::is_same_v<M, nn::Gpt2>) return nn::gpt2(13, 16, 2, n_blocks, max_len, d_ff);
  else if constexpr (std::is_same_v<M, nn::Llama>) return grouped_llama(16, 4, 2, n_blocks, max_len, d_ff);
  else return nn::rotary_decoder(13, 16, 2, n_blocks, max_len, d_ff);
}

}  // namespace tapegrad::test
