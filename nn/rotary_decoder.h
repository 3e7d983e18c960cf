// RotaryDecoder: embedding, n pre-norm rotary blocks, final RMSNorm and a biased head
// (SPEC section 2). forward/loss record on the tape for training; prefill/step (nn/kv_cache.h)
// run the same kernels without a tape for generation, reading the parameters on every call.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "nn/block.h"
#include "nn/embedding.h"
#include "nn/kv_cache.h"

namespace tapegrad::nn {

class KVCache;

struct DecoderConfig {
  std::size_t vocab = 0, d_model = 0, n_heads = 0, n_blocks = 0, max_len = 0;
  std::optional<std::size_t> d_ff;  // default 4 * d_model
  bool remat = false;
  float norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  std::uint64_t seed = 0;  // initialisation, and the root of the dropout streams
  float dropout = 0;       // SPEC section 8: embedding output, attention probabilities, residual branches

  std::size_t ffn_dim() const { return d_ff.value_or(4 * d_model); }
  std::size_t head_dim() const { return n_heads ? d_model / n_heads : 0; }
  /// Throws std::invalid_argument naming the values when the shapes are impossible.
  void validate() const;
};

class RotaryDecoder : public Module {
 public:
  using Cache = KVCache;
  /// Initialisation (seeded by config.seed, in parameter order): embedding and every projection
  /// ~ N(0, 0.02^2), except the residual outputs Wo and W2 ~ N(0, (0.02 / sqrt(2 n_blocks))^2)
  /// (GPT-2); head weight ~ N(0, 0.02^2); head bias zero; norm weights one.
  explicit RotaryDecoder(const DecoderConfig& config);

  /// ids (B*T, row-major) -> logits (B, T, vocab). T <= max_len.
  Var forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const;
  /// Mean next-token cross-entropy of forward(inputs) against targets, both (B*T).
  Var loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, std::size_t batch,
           std::size_t seq_len) const;

  /// Writes prompt tokens at cache positions pos.. in one batched pass; returns their logits (T, vocab).
  Tensor prefill(std::span<const std::int32_t> tokens, KVCache& cache) const;
  /// One token at the cache's next position; returns its logits (vocab). No tape, no allocation.
  std::span<const float> step(std::int32_t token, KVCache& cache) const;
  KVCache make_cache() const;

  /// Sum of the parameters' versions: changes whenever any parameter is updated in place.
  std::uint64_t weights_version() const;

  void collect_params(const std::string& prefix, ParameterList& out) const override;
  void set_training(bool on) override;
  const DecoderConfig& config() const { return config_; }

  /// The dropout streams of the next forward derive from (seed, dropout_step, block): set it
  /// once per training step, so that a resumed run draws the same masks (as Gpt2).
  std::uint64_t dropout_step = 0;

  Embedding embed;
  std::vector<DecoderBlock> blocks;
  RMSNorm norm;
  Linear head;
  Dropout embed_drop;

 private:
  RotaryDecoder(const DecoderConfig& config, Rng&& rng);
  /// The inference pass over tokens at the cache's next positions; returns their logits (T, vocab),
  /// which live in the cache until its next call.
  const float* run_cached(std::span<const std::int32_t> tokens, KVCache& cache) const;
  DecoderConfig config_;
  std::vector<Var> param_vars_;  // handles to every parameter, for weights_version()
  std::shared_ptr<const kernels::RopeTable<float>> rope_;
};

/// SPEC section 2's factory: rotary_decoder(65, 64, 4, 2, 256) has 139,777 parameters.
RotaryDecoder rotary_decoder(std::size_t vocab, std::size_t d_model, std::size_t n_heads, std::size_t n_blocks,
                             std::size_t max_len, std::optional<std::size_t> d_ff = std::nullopt, bool remat = false,
                             std::uint64_t seed = 0);

}  // namespace tapegrad::nn

/// RotaryDecoder(vocab=65, d_model=64, n_heads=4, n_blocks=2, max_len=256, d_ff=256, remat=false)
template <>
struct fmt::formatter<tapegrad::nn::RotaryDecoder> : fmt::formatter<std::string_view> {
  auto format(const tapegrad::nn::RotaryDecoder& m, format_context& ctx) const {
    const auto& c = m.config();
    return fmt::format_to(ctx.out(), "RotaryDecoder(vocab={}, d_model={}, n_heads={}, n_blocks={}, max_len={}, d_ff={}, remat={})",
                          c.vocab, c.d_model, c.n_heads, c.n_blocks, c.max_len, c.ffn_dim(), c.remat);
  }
};
