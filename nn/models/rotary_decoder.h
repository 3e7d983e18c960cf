// RotaryDecoder: token embedding, n pre-norm blocks (RMSNorm, rotary attention, SwiGLU), a final
// RMSNorm and a biased head. Described once, in run() (Note [One description], nn/tape_pass.h):
// the training forward, prefill and the cached step all come from it.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "nn/checkpoint_metadata.h"
#include "nn/decoder_model.h"
#include "nn/models/llama.h"

namespace tapegrad::nn {

/// The sizes and options of a RotaryDecoder.
struct RotaryDecoderConfig {
  /// @{ Vocabulary size, model width, attention heads, blocks, and the longest text (tokens).
  std::size_t vocab = 0, d_model = 0, n_heads = 0, n_blocks = 0, max_len = 0;
  /// @}
  std::optional<std::size_t> d_ff;  ///< the FFN's hidden size; default 4 * d_model
  bool remat = false;               ///< rematerialise each block in backward (Note [Remat])
  float norm_eps = 1e-5f;           ///< the RMSNorms' epsilon
  double rope_theta = 10000.0;      ///< the RoPE base
  std::uint64_t seed = 0;           ///< initialisation, and the root of the dropout streams
  float dropout = 0;                ///< on the embedding output, the attention probabilities, each residual branch

  std::size_t ffn_dim() const { return d_ff.value_or(4 * d_model); }        ///< d_ff, or 4 * d_model.
  std::size_t head_dim() const { return n_heads ? d_model / n_heads : 0; }  ///< d_model / n_heads.
  /// Throws std::invalid_argument naming the values when the shapes are impossible.
  void validate() const;
};

/// Llama's block (nn/models/llama.h: its math, members and initialisation order written once)
/// with every query head its own key and value head: h = x + Attn(RMSNorm_a(x)); out = h +
/// FFN(RMSNorm_f(h)), rotary attention with projections (D, D), SwiGLU FFN, no biases.
class RotaryDecoderBlock : public LlamaBlock {
 public:
  /// Projections ~ N(0, init_std^2), the residual outputs Wo and W2 ~ N(0, out_std^2), norms one.
  RotaryDecoderBlock(const RotaryDecoderConfig& config, std::shared_ptr<const kernels::RopeTable<float>> rope,
                     float init_std, float out_std, Rng& rng);
  std::size_t n_heads;  ///< attention heads
};

/// The rotary decoder: token embedding, RotaryDecoderBlocks, a final RMSNorm and a biased head.
class RotaryDecoder : public Module, public DecoderModel<RotaryDecoder> {
 public:
  /// Initialisation (seeded by config.seed, in parameter order): embedding and every projection
  /// ~ N(0, 0.02^2), except the residual outputs Wo and W2 ~ N(0, (0.02 / sqrt(2 n_blocks))^2)
  /// (GPT-2); head weight ~ N(0, 0.02^2); head bias zero; norm weights one.
  explicit RotaryDecoder(const RotaryDecoderConfig& config);

  /// The model's one description: token ids (in the pass) -> logits.
  template <ModelPass P> typename P::Value run(P& p) const;

  void members(Members& m) override;
  const RotaryDecoderConfig& config() const { return config_; }  ///< The configuration, d_ff filled in.

  /// The dropout streams of the next forward derive from (seed, dropout_step, block): set it
  /// once per training step, so that a resumed run draws the same masks.
  std::uint64_t dropout_step = 0;

  Embedding embed;                   ///< the token embedding (V, D)
  std::vector<RotaryDecoderBlock> blocks;  ///< n_blocks blocks
  RMSNorm norm;                      ///< the final norm
  Linear head;                       ///< (D, V) with bias: the logits
  Dropout embed_drop;                ///< on the embedding output

 private:
  RotaryDecoder(const RotaryDecoderConfig& config, Rng&& rng);
  RotaryDecoderConfig config_;
};

/// The config as checkpoint metadata: vocab_size, d_model, n_heads, n_blocks, max_len, d_ff,
/// norm_eps, rope_theta, and dropout and dropout_seed (config.seed) when dropout is not 0.
Metadata rotary_decoder_config_metadata(const RotaryDecoderConfig& config);
/// The config that rotary_decoder_config_metadata wrote (dropout 0 and seed 0 when absent; remat false);
/// throws std::runtime_error naming a missing or bad key.
RotaryDecoderConfig rotary_decoder_config_from_metadata(const Metadata& metadata);

/// rotary_decoder(65, 64, 4, 2, 256) has 139,777 parameters.
RotaryDecoder rotary_decoder(std::size_t vocab, std::size_t d_model, std::size_t n_heads, std::size_t n_blocks,
                             std::size_t max_len, std::optional<std::size_t> d_ff = std::nullopt, bool remat = false,
                             std::uint64_t seed = 0);

}  // namespace tapegrad::nn

// Printing with fmt. Outside the API reference: Doxygen never sees namespace fmt, so it cannot
// place these specializations.
/// \cond
/// RotaryDecoder(vocab=65, d_model=64, n_heads=4, n_blocks=2, max_len=256, d_ff=256, remat=false)
template <>
struct fmt::formatter<tapegrad::nn::RotaryDecoder> : fmt::formatter<std::string_view> {
  auto format(const tapegrad::nn::RotaryDecoder& m, format_context& ctx) const {
    const auto& c = m.config();
    return fmt::format_to(ctx.out(), "RotaryDecoder(vocab={}, d_model={}, n_heads={}, n_blocks={}, max_len={}, d_ff={}, remat={})",
                          c.vocab, c.d_model, c.n_heads, c.n_blocks, c.max_len, c.ffn_dim(), c.remat);
  }
};

/// RotaryDecoderBlock(64, 4, d_ff=256)
template <>
struct fmt::formatter<tapegrad::nn::RotaryDecoderBlock> : fmt::formatter<std::string_view> {
  auto format(const tapegrad::nn::RotaryDecoderBlock& b, format_context& ctx) const {
    return fmt::format_to(ctx.out(), "RotaryDecoderBlock({}, {}, d_ff={})", b.wq.in(), b.n_heads, b.w1.out());
  }
};
/// \endcond
