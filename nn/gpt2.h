// gpt2: the pre-LN GPT-2 decoder of SPEC section 9 (Radford et al. 2019), character level,
// written with the public API only (core/ops.h and nn modules) to show how a model is built:
//   x = E[ids] + P[0:T]; per block h = x + Attn(LN1(x)), out = h + MLP(LN2(h));
//   logits = LN(x) E^T (the head is the tied token embedding, no bias).
// Dropout (SPEC section 8), when p > 0 and in training mode: on the embedding output, the
// attention probabilities and each residual branch before its add.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"

namespace tapegrad::nn {

struct Gpt2Config {
  std::size_t vocab = 0, d_model = 0, n_heads = 0, n_blocks = 0, max_len = 0;
  std::optional<std::size_t> d_ff;  // default 4 * d_model
  float norm_eps = 1e-5f;
  float dropout = 0;
  bool remat = false;
  std::uint64_t seed = 0;  // initialisation, and the root of the dropout streams

  std::size_t ffn_dim() const { return d_ff.value_or(4 * d_model); }
  std::size_t head_dim() const { return n_heads ? d_model / n_heads : 0; }
  /// Throws std::invalid_argument naming the values when the shapes are impossible.
  void validate() const;
};

/// q, k, v, o projections with biases; heads as in SPEC section 2, no RoPE.
class Gpt2Attention : public Module {
 public:
  Gpt2Attention(std::size_t d_model, std::size_t n_heads, float dropout, float init_std, float out_std, Rng& rng);
  /// x (B, T, D) -> (B, T, D). rng draws the dropout mask of the probabilities (when active).
  Var forward(const Var& x, Rng& rng) const;
  void collect_params(const std::string& prefix, ParameterList& out) const override;
  void set_training(bool on) override;

  std::size_t n_heads;
  Linear wq, wk, wv, wo;
  Dropout attn_drop;
};

/// gelu_tanh(x W1 + b1) W2 + b2.
class Gpt2Mlp : public Module {
 public:
  Gpt2Mlp(std::size_t d_model, std::size_t d_ff, float init_std, float out_std, Rng& rng);
  Var forward(const Var& x) const;
  void collect_params(const std::string& prefix, ParameterList& out) const override;

  Linear w1, w2;
};

class Gpt2Block : public Module {
 public:
  Gpt2Block(const Gpt2Config& config, float init_std, float out_std, Rng& rng);
  /// x (B, T, D) -> (B, T, D); the dropout masks come from Rng(dropout_seed). With remat the
  /// block is one tape entry (Note [Remat]) and its re-run draws the same masks from that seed.
  Var forward(const Var& x, std::uint64_t dropout_seed) const;
  void collect_params(const std::string& prefix, ParameterList& out) const override;
  void set_training(bool on) override;

  bool remat;
  LayerNorm ln1;
  Gpt2Attention attn;
  LayerNorm ln2;
  Gpt2Mlp mlp;
  Dropout resid_drop;

 private:
  Var forward_inside(const Var& x, std::uint64_t dropout_seed) const;
};

class Gpt2 : public Module {
 public:
  /// Initialisation (seeded by config.seed, in parameter order): embeddings and projections
  /// ~ N(0, 0.02^2), the residual outputs Wo and W2 ~ N(0, (0.02 / sqrt(2 n_blocks))^2), biases
  /// zero, LayerNorm weights one and biases zero.
  explicit Gpt2(const Gpt2Config& config);

  /// ids (B*T, row-major) -> logits (B, T, vocab). T <= max_len.
  Var forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const;
  /// Mean next-token cross-entropy of forward(inputs) against targets, both (B*T).
  Var loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, std::size_t batch,
           std::size_t seq_len) const;

  void collect_params(const std::string& prefix, ParameterList& out) const override;
  void set_training(bool on) override;
  const Gpt2Config& config() const { return config_; }

  /// The dropout streams of the next forward derive from (seed, dropout_step, block): set it
  /// once per training step (train_char sets the step number), so that a resumed run draws
  /// the same masks as the uninterrupted one.
  std::uint64_t dropout_step = 0;

  Embedding embed;  // (V, D), also the output head (tied)
  Embedding pos;    // (max_len, D)
  std::vector<Gpt2Block> blocks;
  LayerNorm norm;
  Dropout embed_drop;

 private:
  Gpt2(const Gpt2Config& config, Rng&& rng);
  Gpt2Config config_;
};

/// SPEC section 9's factory: gpt2(65, 64, 4, 2, 256) has 120,640 parameters.
Gpt2 gpt2(std::size_t vocab, std::size_t d_model, std::size_t n_heads, std::size_t n_blocks, std::size_t max_len,
          std::optional<std::size_t> d_ff = std::nullopt, float dropout = 0, bool remat = false, std::uint64_t seed = 0);

}  // namespace tapegrad::nn

/// Gpt2(vocab=65, d_model=64, n_heads=4, n_blocks=2, max_len=256, d_ff=256, dropout=0, remat=false)
template <>
struct fmt::formatter<tapegrad::nn::Gpt2> : fmt::formatter<std::string_view> {
  auto format(const tapegrad::nn::Gpt2& m, format_context& ctx) const {
    const auto& c = m.config();
    return fmt::format_to(ctx.out(), "Gpt2(vocab={}, d_model={}, n_heads={}, n_blocks={}, max_len={}, d_ff={}, dropout={}, remat={})",
                          c.vocab, c.d_model, c.n_heads, c.n_blocks, c.max_len, c.ffn_dim(), c.dropout, c.remat);
  }
};
