// gpt2 (SPEC section 9) from public ops and modules; no backward of its own.
#include "nn/gpt2.h"

#include <cmath>
#include <stdexcept>

#include "core/ops.h"
#include "core/random.h"
#include "core/remat.h"
#include "nn/causal_attention.h"

namespace tapegrad::nn {

void Gpt2Config::validate() const {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(fmt::format("gpt2(vocab={}, d_model={}, n_heads={}, n_blocks={}, max_len={}, d_ff={}): {}",
                                            vocab, d_model, n_heads, n_blocks, max_len, ffn_dim(), why));
  };
  if (vocab == 0 || d_model == 0 || n_heads == 0 || n_blocks == 0 || max_len == 0 || ffn_dim() == 0)
    fail("every size must be positive");
  if (vocab > std::size_t(INT32_MAX)) fail("vocab must fit in int32 token ids");
  constexpr std::size_t max_positions = 1 << 20, max_table_floats = std::size_t(1) << 28;
  if (max_len > max_positions) fail(fmt::format("max_len {} exceeds the supported {}", max_len, max_positions));
  if (max_len * d_model > max_table_floats)
    fail(fmt::format("max_len x d_model = {} exceeds the supported {}", max_len * d_model, max_table_floats));
  if (d_model % n_heads != 0) fail(fmt::format("d_model {} is not divisible by n_heads {}", d_model, n_heads));
  if (!(norm_eps > 0)) fail(fmt::format("norm_eps {} must be positive", norm_eps));
  if (!(dropout >= 0 && dropout < 1)) fail(fmt::format("dropout {} must be in [0, 1)", dropout));
}

Gpt2Attention::Gpt2Attention(std::size_t d_model, std::size_t n_heads_, float dropout, float init_std, float out_std,
                             Rng& rng)
    : n_heads(n_heads_),
      wq(d_model, d_model, true, init_std, rng),
      wk(d_model, d_model, true, init_std, rng),
      wv(d_model, d_model, true, init_std, rng),
      wo(d_model, d_model, true, out_std, rng),
      attn_drop(dropout) {}

Var Gpt2Attention::forward(const Var& x, Rng& rng) const {
  Var q = wq.forward(x), k = wk.forward(x), v = wv.forward(x);  // (B, T, D)
  return wo.forward(causal_attention(q, k, v, n_heads, attn_drop, rng));
}

void Gpt2Attention::collect_params(const std::string& prefix, ParameterList& out) const {
  wq.collect_params(prefix + "wq.", out);
  wk.collect_params(prefix + "wk.", out);
  wv.collect_params(prefix + "wv.", out);
  wo.collect_params(prefix + "wo.", out);
}

void Gpt2Attention::set_training(bool on) {
  Module::set_training(on);
  attn_drop.set_training(on);
}

Gpt2Mlp::Gpt2Mlp(std::size_t d_model, std::size_t d_ff, float init_std, float out_std, Rng& rng)
    : w1(d_model, d_ff, true, init_std, rng), w2(d_ff, d_model, true, out_std, rng) {}

Var Gpt2Mlp::forward(const Var& x) const { return w2.forward(gelu(w1.forward(x), /*approximate_tanh=*/true)); }

void Gpt2Mlp::collect_params(const std::string& prefix, ParameterList& out) const {
  w1.collect_params(prefix + "w1.", out);
  w2.collect_params(prefix + "w2.", out);
}

Gpt2Block::Gpt2Block(const Gpt2Config& c, float init_std, float out_std, Rng& rng)
    : remat(c.remat),
      ln1(c.d_model, c.norm_eps),
      attn(c.d_model, c.n_heads, c.dropout, init_std, out_std, rng),
      ln2(c.d_model, c.norm_eps),
      mlp(c.d_model, c.ffn_dim(), init_std, out_std, rng),
      resid_drop(c.dropout) {}

Var Gpt2Block::forward_inside(const Var& x, std::uint64_t dropout_seed) const {
  Rng rng(dropout_seed);  // the masks in a fixed order: probabilities, attention branch, MLP branch
  Var h = x + resid_drop.forward(attn.forward(ln1.forward(x), rng), rng);
  return h + resid_drop.forward(mlp.forward(ln2.forward(h)), rng);
}

Var Gpt2Block::forward(const Var& x, std::uint64_t dropout_seed) const {
  if (!remat) return forward_inside(x, dropout_seed);
  return rematerialize([this, dropout_seed](const Var& input, const Tensor*) {  // Note [Remat]
    return forward_inside(input, dropout_seed);
  }, x);
}

void Gpt2Block::collect_params(const std::string& prefix, ParameterList& out) const {
  ln1.collect_params(prefix + "ln1.", out);
  attn.collect_params(prefix + "attn.", out);
  ln2.collect_params(prefix + "ln2.", out);
  mlp.collect_params(prefix + "mlp.", out);
}

void Gpt2Block::set_training(bool on) {
  Module::set_training(on);
  attn.set_training(on);
  resid_drop.set_training(on);
}

static Rng validated_init_rng(const Gpt2Config& config) {
  config.validate();
  return Rng(config.seed);
}

Gpt2::Gpt2(const Gpt2Config& config) : Gpt2(config, validated_init_rng(config)) {}

Gpt2::Gpt2(const Gpt2Config& config, Rng&& rng)
    : embed(config.vocab, config.d_model, 0.02f, rng),
      pos(config.max_len, config.d_model, 0.02f, rng),
      norm(config.d_model, config.norm_eps),
      embed_drop(config.dropout),
      config_(config) {
  config_.d_ff = config.ffn_dim();
  float out_std = 0.02f / std::sqrt(2.0f * float(config.n_blocks));
  blocks.reserve(config.n_blocks);
  for (std::size_t i = 0; i < config.n_blocks; ++i) blocks.emplace_back(config_, 0.02f, out_std, rng);
}

Var Gpt2::forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const {
  if (batch == 0 || seq_len == 0 || ids.size() != batch * seq_len)
    throw std::invalid_argument(fmt::format("Gpt2::forward: {} ids for batch {} x seq_len {}", ids.size(), batch, seq_len));
  if (seq_len > config_.max_len)
    throw std::invalid_argument(fmt::format("Gpt2::forward: seq_len {} exceeds max_len {}", seq_len, config_.max_len));
  Rng embed_rng(dropout_seed(config_.seed, dropout_step, 0));
  Var positions = slice(pos.weight, 0, 0, seq_len);                                   // (T, D)
  Var x = embed_drop.forward(embed.forward(ids, batch, seq_len) + positions, embed_rng);  // (B, T, D)
  for (std::size_t i = 0; i < blocks.size(); ++i) x = blocks[i].forward(x, dropout_seed(config_.seed, dropout_step, i + 1));
  return matmul(norm.forward(x), embed.weight, false, /*transpose_b=*/true);  // (B, T, V)
}

Var Gpt2::loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, std::size_t batch,
               std::size_t seq_len) const {
  return cross_entropy(forward(inputs, batch, seq_len), targets);
}

void Gpt2::collect_params(const std::string& prefix, ParameterList& out) const {
  embed.collect_params(prefix + "embed.", out);
  pos.collect_params(prefix + "pos.", out);
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].collect_params(fmt::format("{}blocks.{}.", prefix, i), out);
  norm.collect_params(prefix + "norm.", out);
}

void Gpt2::set_training(bool on) {
  Module::set_training(on);
  for (auto& b : blocks) b.set_training(on);
  embed_drop.set_training(on);
}

Gpt2 gpt2(std::size_t vocab, std::size_t d_model, std::size_t n_heads, std::size_t n_blocks, std::size_t max_len,
          std::optional<std::size_t> d_ff, float dropout, bool remat, std::uint64_t seed) {
  Gpt2Config config;
  config.vocab = vocab;
  config.d_model = d_model;
  config.n_heads = n_heads;
  config.n_blocks = n_blocks;
  config.max_len = max_len;
  config.d_ff = d_ff;
  config.dropout = dropout;
  config.remat = remat;
  config.seed = seed;
  return Gpt2(config);
}

}  // namespace tapegrad::nn
