// Llama: the decoder of Llama 2/3, SmolLM2 and their kin (Touvron et al. 2023): token embedding,
// pre-norm blocks of RMSNorm, rotary grouped-query attention and a SwiGLU FFN, a final RMSNorm and
// a head without bias, tied to the embedding or not. Described once, in run() (Note [One
// description], nn/tape_pass.h): the training forward, prefill and the cached step come from it.
//
// Note [Llama's RoPE]: tapegrad's rope rotates interleaved pairs (2i, 2i+1) of each head with
// angle m * theta^(-2i/Dh) (kernels::make_rope_table, base rope_theta), which is llama.cpp's
// LLAMA_ROPE_TYPE_NORM. GGUF files store attn_q and attn_k rows in that order already; Hugging
// Face's q_proj and k_proj rows are in rotate-half order (pairs (i, i + Dh/2)), and loading them
// applies llama.cpp's converter permutation per head (ForeignTensor::hf_rope_heads,
// nn/models/foreign_tensors.h; REAL_MODELS_NOTES.md section 1c).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "nn/checkpoint_metadata.h"
#include "nn/decoder_model.h"
#include "nn/models/foreign_tensors.h"

namespace tapegrad::nn {

/// The sizes and options of a Llama.
struct LlamaConfig {
  /// @{ Vocabulary size, model width, query heads, blocks, and the longest text (tokens).
  std::size_t vocab = 0, d_model = 0, n_heads = 0, n_blocks = 0, max_len = 0;
  /// @}
  std::optional<std::size_t> n_kv_heads;  ///< key and value heads, dividing n_heads; default n_heads
  std::optional<std::size_t> head_dim;    ///< Dh; default d_model / n_heads
  std::optional<std::size_t> d_ff;        ///< the FFN's hidden size; default 4 * d_model
  float norm_eps = 1e-5f;                 ///< the RMSNorms' epsilon
  double rope_theta = 10000.0;            ///< the RoPE base (Note [Llama's RoPE])
  bool tied_head = false;                 ///< the head is the token embedding (x E^T), else its own (D, V)
  std::uint64_t seed = 0;                 ///< initialisation, and the root of the dropout streams
  float dropout = 0;                      ///< on the embedding output, the attention probabilities, each residual branch
  bool remat = false;                     ///< rematerialise each block in backward (Note [Remat])

  std::size_t kv_heads() const { return n_kv_heads.value_or(n_heads); }  ///< n_kv_heads, or n_heads.
  std::size_t head_size() const { return head_dim.value_or(n_heads ? d_model / n_heads : 0); }  ///< Dh.
  std::size_t ffn_dim() const { return d_ff.value_or(4 * d_model); }     ///< d_ff, or 4 * d_model.
  std::size_t q_width() const { return n_heads * head_size(); }         ///< the rows of q: n_heads * Dh
  std::size_t kv_width() const { return kv_heads() * head_size(); }     ///< the rows of k, v and the cache
  /// Throws std::invalid_argument naming the values when the shapes are impossible.
  void validate() const;
};

/// h = x + Attn(RMSNorm_a(x)); out = h + FFN(RMSNorm_f(h)). Attn: q = rope(x Wq) (D, H*Dh),
/// k = rope(x Wk) and v = x Wv (D, KVH*Dh), causal grouped-query attention, then Wo (H*Dh, D).
/// FFN (SwiGLU): (silu(x W1) * (x W3)) W2. No biases.
class LlamaBlock : public Module {
 public:
  /// Projections ~ N(0, init_std^2), the residual outputs Wo and W2 ~ N(0, out_std^2), norms one.
  LlamaBlock(const LlamaConfig& config, std::shared_ptr<const kernels::RopeTable<float>> rope, float init_std,
             float out_std, Rng& rng);
  /// The block's one description (x: (B, T, D) on the tape, or rows in a cache pass).
  template <ModelPass P> typename P::Value run(P& p, const typename P::Value& x) const;
  void members(Members& m) override;

  AttentionHeads heads;                                   ///< query and KV heads
  std::shared_ptr<const kernels::RopeTable<float>> rope;  ///< the RoPE table, shared by every block
  RMSNorm attn_norm;                                      ///< before attention
  /// @{ The attention projections, named attn.w*.
  Linear wq, wk, wv, wo;
  /// @}
  RMSNorm ffn_norm;  ///< before the FFN
  /// @{ The FFN: gate W1 (D, F), up W3 (D, F), down W2 (F, D), named ffn.w*.
  Linear w1, w3, w2;
  /// @}
  Dropout drop;  ///< on the attention probabilities and each residual branch
};

/// The Llama model: token embedding, LlamaBlocks, a final RMSNorm, and a head without bias.
class Llama : public Module, public DecoderModel<Llama> {
 public:
  /// Initialisation (seeded by config.seed, in parameter order) as the rotary decoder's: the
  /// embedding, the untied head and every projection ~ N(0, 0.02^2), except the residual outputs
  /// Wo and W2 ~ N(0, (0.02 / sqrt(2 n_blocks))^2); norm weights one.
  explicit Llama(const LlamaConfig& config);

  /// The model's one description: token ids (in the pass) -> logits.
  template <ModelPass P> typename P::Value run(P& p) const;

  void members(Members& m) override;
  /// The configuration, n_kv_heads, head_dim and d_ff filled in.
  const LlamaConfig& config() const { return config_; }

  /// The dropout streams of the next forward derive from (seed, dropout_step, block).
  std::uint64_t dropout_step = 0;

  Embedding embed;                 ///< the token embedding (V, D)
  std::vector<LlamaBlock> blocks;  ///< n_blocks blocks
  RMSNorm norm;                    ///< the final norm
  std::optional<Linear> head;      ///< (D, V) without bias; absent when the head is tied
  Dropout embed_drop;              ///< on the embedding output

 private:
  Llama(const LlamaConfig& config, Rng&& rng);
  LlamaConfig config_;
};

/// The config as checkpoint metadata: vocab_size, d_model, n_heads, n_kv_heads, head_dim,
/// n_blocks, max_len, d_ff, norm_eps, rope_theta, tied_head ("true" or "false"), and dropout and
/// dropout_seed (config.seed) when dropout is not 0.
Metadata llama_config_metadata(const LlamaConfig& config);
/// The config that llama_config_metadata wrote (dropout 0 and seed 0 when absent; remat false);
/// throws std::runtime_error naming a missing or bad key.
LlamaConfig llama_config_from_metadata(const Metadata& metadata);

/// One entry per parameter of a Llama of this config, in params() order: its names in Hugging
/// Face's LlamaForCausalLM (model.layers.N.self_attn.q_proj.weight, ...) and in GGUF (llama.cpp's
/// blk.N.attn_q.weight, ...), with the q and k rows' RoPE permutation for Hugging Face files.
std::vector<ForeignTensor> llama_foreign_tensors(const LlamaConfig& config);

}  // namespace tapegrad::nn

// Printing with fmt. Outside the API reference: Doxygen never sees namespace fmt.
/// \cond
/// Llama(vocab=65, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, n_blocks=2, max_len=256, d_ff=256, tied_head=false)
template <>
struct fmt::formatter<tapegrad::nn::Llama> : fmt::formatter<std::string_view> {
  auto format(const tapegrad::nn::Llama& m, format_context& ctx) const {
    const auto& c = m.config();
    return fmt::format_to(ctx.out(),
                          "Llama(vocab={}, d_model={}, n_heads={}, n_kv_heads={}, head_dim={}, n_blocks={}, "
                          "max_len={}, d_ff={}, tied_head={})",
                          c.vocab, c.d_model, c.n_heads, c.kv_heads(), c.head_size(), c.n_blocks, c.max_len,
                          c.ffn_dim(), c.tied_head);
  }
};
/// \endcond
