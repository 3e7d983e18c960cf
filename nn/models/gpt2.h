// gpt2: the pre-LN GPT-2 decoder (Radford et al. 2019), for any vocabulary, written with the public
// API only (modules, and the ops of a pass) to show how a model is built:
//   x = E[ids] + P[0:T]; per block h = x + Attn(LN1(x)), out = h + MLP(LN2(h));
//   logits = LN(x) E^T (the head is the tied token embedding, no bias).
// Described once, in run() (Note [One description], nn/tape_pass.h): training forward, prefill
// and the cached step come from it. Dropout, when p > 0 and in training mode: on the embedding
// output, the attention probabilities and each residual branch before its add.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "nn/checkpoint_metadata.h"
#include "nn/decoder_model.h"
#include "nn/models/foreign_tensors.h"

namespace tapegrad::nn {

/// The sizes and options of a Gpt2.
struct Gpt2Config {
  /// @{ Vocabulary size, model width, attention heads, blocks, and the longest text (tokens).
  std::size_t vocab = 0, d_model = 0, n_heads = 0, n_blocks = 0, max_len = 0;
  /// @}
  std::optional<std::size_t> d_ff;  ///< the MLP's hidden size; default 4 * d_model
  float norm_eps = 1e-5f;           ///< the LayerNorms' epsilon
  float dropout = 0;                ///< on the embedding output, the attention probabilities, each residual branch
  bool remat = false;               ///< rematerialise each block in backward (Note [Remat])
  std::uint64_t seed = 0;           ///< initialisation, and the root of the dropout streams

  std::size_t ffn_dim() const { return d_ff.value_or(4 * d_model); }        ///< d_ff, or 4 * d_model.
  std::size_t head_dim() const { return n_heads ? d_model / n_heads : 0; }  ///< d_model / n_heads.
  /// Throws std::invalid_argument naming the values when the shapes are impossible.
  void validate() const;
};

/// h = x + Attn(LN_a(x)); out = h + FFN(LN_f(h)). Attn: q, k, v, o projections with biases, heads
/// as contiguous column chunks, causal softmax(q k^T / sqrt(Dh)) v, no RoPE. FFN (GPT-2's MLP):
/// gelu_tanh(x W1 + b1) W2 + b2. Members named as Llama's block's (attn_norm, attn.w*, ffn_norm,
/// ffn.w*, drop); checkpoints of 0.2 and before named them ln1, ln2 and mlp.w* (read still).
class Gpt2Block : public Module {
 public:
  /// Projections ~ N(0, init_std^2), the residual outputs Wo and W2 ~ N(0, out_std^2), biases zero.
  Gpt2Block(const Gpt2Config& config, float init_std, float out_std, Rng& rng);
  /// The block's one description (x: (B, T, D) on the tape, or rows in a cache pass).
  template <ModelPass P> typename P::Value run(P& p, const typename P::Value& x) const;
  void members(Members& m) override;

  std::size_t n_heads;  ///< attention heads
  LayerNorm attn_norm;  ///< before attention
  /// @{ The attention projections, (D, D) with biases, named attn.w*.
  Linear wq, wk, wv, wo;
  /// @}
  LayerNorm ffn_norm;  ///< before the FFN
  /// @{ The FFN: W1 (D, F) and W2 (F, D) with biases, named ffn.w*.
  Linear w1, w2;
  /// @}
  Dropout drop;  ///< on the attention probabilities and each residual branch
};

/// The GPT-2 decoder: token and position embeddings, Gpt2Blocks, a final LayerNorm, tied head.
class Gpt2 : public Module, public DecoderModel<Gpt2> {
 public:
  /// Initialisation (seeded by config.seed, in parameter order): embeddings and projections
  /// ~ N(0, 0.02^2), the residual outputs Wo and W2 ~ N(0, (0.02 / sqrt(2 n_blocks))^2), biases
  /// zero, LayerNorm weights one and biases zero.
  explicit Gpt2(const Gpt2Config& config);

  /// The model's one description: token ids (in the pass) -> logits.
  template <ModelPass P> typename P::Value run(P& p) const;

  void members(Members& m) override;
  const Gpt2Config& config() const { return config_; }  ///< The configuration, d_ff filled in.

  /// The dropout streams of the next forward derive from (seed, dropout_step, block): set it
  /// once per training step (train sets the step number), so that a resumed run draws
  /// the same masks as the uninterrupted one.
  std::uint64_t dropout_step = 0;

  Embedding embed;                ///< the token embedding (V, D), also the output head (tied)
  Embedding pos;                  ///< the position embedding (max_len, D)
  std::vector<Gpt2Block> blocks;  ///< n_blocks blocks
  LayerNorm norm;                 ///< the final norm
  Dropout embed_drop;             ///< on the embedding output

 private:
  Gpt2(const Gpt2Config& config, Rng&& rng);
  Gpt2Config config_;
};

/// The config as checkpoint metadata: vocab_size, d_model, n_heads, n_blocks, max_len, d_ff,
/// norm_eps, dropout, and dropout_seed (config.seed) when dropout is not 0.
Metadata gpt2_config_metadata(const Gpt2Config& config);
/// The config that gpt2_config_metadata wrote (dropout 0 and seed 0 when absent; remat false);
/// throws std::runtime_error naming a missing or bad key.
Gpt2Config gpt2_config_from_metadata(const Metadata& metadata);

/// gpt2(65, 64, 4, 2, 256) has 120,640 parameters.
Gpt2 gpt2(std::size_t vocab, std::size_t d_model, std::size_t n_heads, std::size_t n_blocks, std::size_t max_len,
          std::optional<std::size_t> d_ff = std::nullopt, float dropout = 0, bool remat = false, std::uint64_t seed = 0);

/// One entry per parameter of a Gpt2 of this config, in params() order: its names in Hugging Face's
/// GPT2LMHeadModel (transformer.h.N.attn.c_attn.weight, ...: Conv1D matrices (in, out); the fused
/// c_attn split into q, k and v) and in GGUF (llama.cpp's gpt2: blk.N.attn_qkv.weight, ...). The
/// model's math is GPT2LMHeadModel's: LayerNorm (eps 1e-5), GELU's tanh form (gelu_new), learned
/// positions, biases on every projection, the head tied to the token embedding; the attn.bias
/// buffers of older files (the causal mask) are no parameters and have no entry. Files saved
/// from GPT2Model (openai-community/gpt2) name the same tensors without "transformer.".
std::vector<ForeignTensor> gpt2_foreign_tensors(const Gpt2Config& config);

}  // namespace tapegrad::nn

// Printing with fmt. Outside the API reference: Doxygen never sees namespace fmt, so it cannot
// place this specialization.
/// \cond
/// Gpt2(vocab=65, d_model=64, n_heads=4, n_blocks=2, max_len=256, d_ff=256, dropout=0, remat=false)
template <>
struct fmt::formatter<tapegrad::nn::Gpt2> : fmt::formatter<std::string_view> {
  auto format(const tapegrad::nn::Gpt2& m, format_context& ctx) const {
    const auto& c = m.config();
    return fmt::format_to(ctx.out(), "Gpt2(vocab={}, d_model={}, n_heads={}, n_blocks={}, max_len={}, d_ff={}, dropout={}, remat={})",
                          c.vocab, c.d_model, c.n_heads, c.n_blocks, c.max_len, c.ffn_dim(), c.dropout, c.remat);
  }
};
/// \endcond
