// gpt2: validation, construction, and the one description of the model and its block; no
// backward of its own.
#include "nn/models/gpt2.h"

#include <cmath>
#include <stdexcept>

#include "core/ops.h"
#include "core/random.h"
#include "nn/architecture.h"

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

Gpt2Block::Gpt2Block(const Gpt2Config& c, float init_std, float out_std, Rng& rng)
    : n_heads(c.n_heads),
      attn_norm(c.d_model, c.norm_eps),
      wq(c.d_model, c.d_model, true, init_std, rng),
      wk(c.d_model, c.d_model, true, init_std, rng),
      wv(c.d_model, c.d_model, true, init_std, rng),
      wo(c.d_model, c.d_model, true, out_std, rng),
      ffn_norm(c.d_model, c.norm_eps),
      w1(c.d_model, c.ffn_dim(), true, init_std, rng),
      w2(c.ffn_dim(), c.d_model, true, out_std, rng),
      drop(c.dropout) {}

// Dropout masks, when active, in a fixed order: probabilities, attention branch, FFN branch.
template <ModelPass P>
typename P::Value Gpt2Block::run(P& p, const typename P::Value& x) const {
  auto a = p.layer_norm(x, attn_norm);
  auto q = p.linear(a, wq);
  auto k = p.linear(a, wk);
  auto v = p.linear(a, wv);
  auto h = p.residual(x, p.attention(q, k, v, n_heads, drop), wo, drop);
  auto f = p.gelu_tanh(p.linear(p.layer_norm(h, ffn_norm), w1));
  return p.output_residual(h, f, w2, drop);
}

// Llama's block's scheme of names (LlamaBlock::members); gpt2_architecture() maps the former ones.
void Gpt2Block::members(Members& m) {
  m("attn_norm", attn_norm);
  m("attn.wq", wq);
  m("attn.wk", wk);
  m("attn.wv", wv);
  m("attn.wo", wo);
  m("ffn_norm", ffn_norm);
  m("ffn.w1", w1);
  m("ffn.w2", w2);
  m("drop", drop);
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

template <ModelPass P>
typename P::Value Gpt2::run(P& p) const {
  auto tokens = p.embed(embed);
  auto x = p.dropout(p.add(tokens, p.positions(pos)), embed_drop);
  x = run_blocks(p, x, blocks, config_.remat, config_.seed, dropout_step);
  return p.tied_head(p.layer_norm(x, norm), embed);  // x E^T
}
template Var Gpt2::run<TapePass>(TapePass&) const;
template Rows Gpt2::run<CachePass>(CachePass&) const;
template ModelPassArchetype::Value Gpt2::run<ModelPassArchetype>(ModelPassArchetype&) const;

void Gpt2::members(Members& m) {
  m("embed", embed);
  m("pos", pos);
  m("embed_drop", embed_drop);
  m("blocks", blocks);
  m("norm", norm);
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

Metadata gpt2_config_metadata(const Gpt2Config& c) {
  Metadata metadata = {{"norm_eps", fmt::format("{}", c.norm_eps)}, {"dropout", fmt::format("{}", c.dropout)}};
  write_model_sizes(c, metadata);
  write_dropout_seed(c, metadata);
  return metadata;
}

Gpt2Config gpt2_config_from_metadata(const Metadata& metadata) {
  Gpt2Config config;
  read_model_sizes(metadata, config);
  config.norm_eps = float(metadata_positive(metadata, "norm_eps"));
  config.dropout = metadata.count("dropout") ? float(metadata_probability(metadata, "dropout")) : 0.0f;
  read_dropout_seed(metadata, config);
  return config;
}

std::vector<ForeignTensor> gpt2_foreign_tensors(const Gpt2Config& c) {
  std::vector<ForeignTensor> map{{"embed.weight", "transformer.wte.weight", "token_embd.weight"},
                                 {"pos.weight", "transformer.wpe.weight", "position_embd.weight"}};
  for (std::size_t i = 0; i < c.n_blocks; ++i) {
    const std::string ours = fmt::format("blocks.{}.", i), hf = fmt::format("transformer.h.{}.", i),
                      gguf = fmt::format("blk.{}.", i);
    auto norm = [&](const char* param, const char* hf_name, const char* gguf_name) {
      for (const char* part : {"weight", "bias"})
        map.push_back({fmt::format("{}{}.{}", ours, param, part), fmt::format("{}{}.{}", hf, hf_name, part),
                       fmt::format("{}{}.{}", gguf, gguf_name, part)});
    };
    auto linear = [&](const char* param, const char* hf_name, const char* gguf_name, const char* split = "") {
      for (const char* part : {"weight", "bias"}) {
        ForeignTensor t{fmt::format("{}{}.{}", ours, param, part), fmt::format("{}{}.{}", hf, hf_name, part),
                        fmt::format("{}{}.{}", gguf, gguf_name, part)};
        t.linear_weight = std::string(part) == "weight";
        t.hf_conv1d = t.linear_weight;
        t.split = split;
        map.push_back(std::move(t));
      }
    };
    norm("attn_norm", "ln_1", "attn_norm");
    linear("attn.wq", "attn.c_attn", "attn_qkv", "q");
    linear("attn.wk", "attn.c_attn", "attn_qkv", "k");
    linear("attn.wv", "attn.c_attn", "attn_qkv", "v");
    linear("attn.wo", "attn.c_proj", "attn_output");
    norm("ffn_norm", "ln_2", "ffn_norm");
    linear("ffn.w1", "mlp.c_fc", "ffn_up");
    linear("ffn.w2", "mlp.c_proj", "ffn_down");
  }
  for (const char* part : {"weight", "bias"})
    map.push_back({fmt::format("norm.{}", part), fmt::format("transformer.ln_f.{}", part),
                   fmt::format("output_norm.{}", part)});
  return map;
}

// Listed in nn/architecture.cpp. Checkpoints of 0.2 and before named the block's members ln1, ln2
// and mlp.w1/w2 (tests/nn/test_gpt2.cpp reads such a file).
Architecture gpt2_architecture() {
  Architecture gpt2 = make_architecture<Gpt2>("gpt2", &gpt2_config_from_metadata, &gpt2_config_metadata);
  gpt2.former_names = {{"ln1", "attn_norm"}, {"ln2", "ffn_norm"}, {"mlp", "ffn"}};
  return gpt2;
}

}  // namespace tapegrad::nn
