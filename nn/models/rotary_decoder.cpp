// RotaryDecoder: validation, construction, and the one description of the model and its block.
#include "nn/models/rotary_decoder.h"

#include <cmath>
#include <stdexcept>

#include "core/ops.h"
#include "core/random.h"
#include "nn/architecture.h"

namespace tapegrad::nn {

void RotaryDecoderConfig::validate() const {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(fmt::format("rotary_decoder(vocab={}, d_model={}, n_heads={}, n_blocks={}, max_len={}, d_ff={}): {}",
                                            vocab, d_model, n_heads, n_blocks, max_len, ffn_dim(), why));
  };
  if (vocab == 0 || d_model == 0 || n_heads == 0 || n_blocks == 0 || max_len == 0 || ffn_dim() == 0)
    fail("every size must be positive");
  if (vocab > std::size_t(INT32_MAX)) fail("vocab must fit in int32 token ids");
  // Bounds on the buffers that scale with max_len (RoPE table, KV cache: max_len x d_model per
  // block), so that no configuration, e.g. one read from a forged checkpoint, asks for gigabytes.
  constexpr std::size_t max_positions = 1 << 20, max_cache_floats = std::size_t(1) << 28;
  if (max_len > max_positions) fail(fmt::format("max_len {} exceeds the supported {}", max_len, max_positions));
  if (max_len * d_model > max_cache_floats)
    fail(fmt::format("max_len x d_model = {} exceeds the supported {} (a 1 GiB cache per block)", max_len * d_model,
                     max_cache_floats));
  if (d_model % n_heads != 0) fail(fmt::format("d_model {} is not divisible by n_heads {}", d_model, n_heads));
  if (head_dim() % 2 != 0) fail(fmt::format("head size d_model / n_heads = {} must be even for RoPE", head_dim()));
  if (!(dropout >= 0 && dropout < 1)) fail(fmt::format("dropout {} must be in [0, 1)", dropout));
  if (!(norm_eps > 0) || !(rope_theta > 0)) fail(fmt::format("norm_eps {} and rope_theta {} must be positive", norm_eps, rope_theta));
}

// Validation runs before any parameter is allocated.
static Rng validated_init_rng(const RotaryDecoderConfig& config) {
  config.validate();
  return Rng(config.seed);
}

// The block config of a rotary decoder: Llama's with n_kv_heads = n_heads and Dh = d_model / n_heads.
static LlamaConfig block_config(const RotaryDecoderConfig& c) {
  return {.vocab = c.vocab, .d_model = c.d_model, .n_heads = c.n_heads, .n_blocks = c.n_blocks, .max_len = c.max_len,
          .d_ff = c.ffn_dim(), .norm_eps = c.norm_eps, .rope_theta = c.rope_theta, .dropout = c.dropout};
}

RotaryDecoderBlock::RotaryDecoderBlock(const RotaryDecoderConfig& c,
                                       std::shared_ptr<const kernels::RopeTable<float>> rope_table, float init_std,
                                       float out_std, Rng& rng)
    : LlamaBlock(block_config(c), std::move(rope_table), init_std, out_std, rng), n_heads(c.n_heads) {}

RotaryDecoder::RotaryDecoder(const RotaryDecoderConfig& config) : RotaryDecoder(config, validated_init_rng(config)) {}

RotaryDecoder::RotaryDecoder(const RotaryDecoderConfig& config, Rng&& rng)
    : embed(config.vocab, config.d_model, 0.02f, rng),
      norm(config.d_model, config.norm_eps),
      head(config.d_model, config.vocab, true, 0.02f, rng),
      embed_drop(config.dropout),
      config_(config) {
  config_.d_ff = config.ffn_dim();
  auto rope = std::make_shared<kernels::RopeTable<float>>(
      kernels::make_rope_table<float>(config.max_len, config.head_dim(), config.rope_theta));
  float out_std = 0.02f / std::sqrt(2.0f * float(config.n_blocks));
  blocks.reserve(config.n_blocks);
  for (std::size_t i = 0; i < config.n_blocks; ++i) blocks.emplace_back(config_, rope, 0.02f, out_std, rng);
}

template <ModelPass P>
typename P::Value RotaryDecoder::run(P& p) const {
  auto x = p.dropout(p.embed(embed), embed_drop);
  x = run_blocks(p, x, blocks, config_.remat, config_.seed, dropout_step);
  return p.head(p.rms_norm(x, norm), head);
}
template Var RotaryDecoder::run<TapePass>(TapePass&) const;
template Rows RotaryDecoder::run<CachePass>(CachePass&) const;
template ModelPassArchetype::Value RotaryDecoder::run<ModelPassArchetype>(ModelPassArchetype&) const;

void RotaryDecoder::members(Members& m) {
  m("embed", embed);
  m("embed_drop", embed_drop);
  m("blocks", blocks);
  m("norm", norm);
  m("head", head);
}

RotaryDecoder rotary_decoder(std::size_t vocab, std::size_t d_model, std::size_t n_heads, std::size_t n_blocks,
                             std::size_t max_len, std::optional<std::size_t> d_ff, bool remat, std::uint64_t seed) {
  RotaryDecoderConfig config;
  config.vocab = vocab;
  config.d_model = d_model;
  config.n_heads = n_heads;
  config.n_blocks = n_blocks;
  config.max_len = max_len;
  config.d_ff = d_ff;
  config.remat = remat;
  config.seed = seed;
  return RotaryDecoder(config);
}

Metadata rotary_decoder_config_metadata(const RotaryDecoderConfig& c) {
  Metadata metadata = {{"norm_eps", fmt::format("{}", c.norm_eps)}, {"rope_theta", fmt::format("{}", c.rope_theta)}};
  write_model_sizes(c, metadata);
  if (c.dropout > 0) metadata["dropout"] = fmt::format("{}", c.dropout);  // absent: 0, as in the first files
  write_dropout_seed(c, metadata);
  return metadata;
}

RotaryDecoderConfig rotary_decoder_config_from_metadata(const Metadata& metadata) {
  RotaryDecoderConfig config;
  read_model_sizes(metadata, config);
  config.norm_eps = float(metadata_positive(metadata, "norm_eps"));
  config.rope_theta = metadata_positive(metadata, "rope_theta");
  if (metadata.count("dropout")) config.dropout = float(metadata_probability(metadata, "dropout"));
  read_dropout_seed(metadata, config);
  return config;
}

// Listed in nn/architecture.cpp.
Architecture rotary_architecture() {
  return make_architecture<RotaryDecoder>("rotary", &rotary_decoder_config_from_metadata, &rotary_decoder_config_metadata);
}

}  // namespace tapegrad::nn
