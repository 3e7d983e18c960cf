// RotaryDecoder: construction, validation and the training forward.
#include "nn/rotary_decoder.h"

#include <cmath>
#include <stdexcept>

#include "core/ops.h"
#include "core/random.h"
#include "nn/kv_cache.h"

namespace tapegrad::nn {

void DecoderConfig::validate() const {
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
static Rng validated_init_rng(const DecoderConfig& config) {
  config.validate();
  return Rng(config.seed);
}

RotaryDecoder::RotaryDecoder(const DecoderConfig& config) : RotaryDecoder(config, validated_init_rng(config)) {}

RotaryDecoder::RotaryDecoder(const DecoderConfig& config, Rng&& rng)
    : embed(config.vocab, config.d_model, 0.02f, rng),
      norm(config.d_model, config.norm_eps),
      head(config.d_model, config.vocab, true, 0.02f, rng),
      embed_drop(config.dropout),
      config_(config),
      rope_(std::make_shared<kernels::RopeTable<float>>(
          kernels::make_rope_table<float>(config.max_len, config.head_dim(), config.rope_theta))) {
  config_.d_ff = config.ffn_dim();
  float out_std = 0.02f / std::sqrt(2.0f * float(config.n_blocks));
  blocks.reserve(config.n_blocks);
  for (std::size_t i = 0; i < config.n_blocks; ++i)
    blocks.emplace_back(config.d_model, config.n_heads, config.ffn_dim(), config.norm_eps, config.remat, rope_, 0.02f,
                        out_std, rng, config.dropout);
  for (const auto& p : params()) param_vars_.push_back(p.var);
}

Var RotaryDecoder::forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const {
  if (batch == 0 || seq_len == 0 || ids.size() != batch * seq_len)
    throw std::invalid_argument(fmt::format("RotaryDecoder::forward: {} ids for batch {} x seq_len {}", ids.size(),
                                            batch, seq_len));
  if (seq_len > config_.max_len)
    throw std::invalid_argument(fmt::format("RotaryDecoder::forward: seq_len {} exceeds max_len {}", seq_len,
                                            config_.max_len));
  Var x = embed.forward(ids, batch, seq_len);
  if (embed_drop.active()) {
    Rng rng(dropout_seed(config_.seed, dropout_step, 0));
    x = embed_drop.forward(x, rng);
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) x = blocks[i].forward(x, dropout_seed(config_.seed, dropout_step, i + 1));
  return head.forward(norm.forward(x));
}

Var RotaryDecoder::loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, std::size_t batch,
                        std::size_t seq_len) const {
  return cross_entropy(forward(inputs, batch, seq_len), targets);
}

std::uint64_t RotaryDecoder::weights_version() const {
  std::uint64_t v = 0;
  for (const Var& p : param_vars_) v += p.version();
  return v;
}

void RotaryDecoder::set_training(bool on) {
  Module::set_training(on);
  for (auto& b : blocks) b.set_training(on);
  embed_drop.set_training(on);
}

void RotaryDecoder::collect_params(const std::string& prefix, ParameterList& out) const {
  embed.collect_params(prefix + "embed.", out);
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].collect_params(fmt::format("{}blocks.{}.", prefix, i), out);
  norm.collect_params(prefix + "norm.", out);
  head.collect_params(prefix + "head.", out);
}

RotaryDecoder rotary_decoder(std::size_t vocab, std::size_t d_model, std::size_t n_heads, std::size_t n_blocks,
                             std::size_t max_len, std::optional<std::size_t> d_ff, bool remat, std::uint64_t seed) {
  DecoderConfig config;
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

}  // namespace tapegrad::nn
