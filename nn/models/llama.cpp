// Llama: validation, construction, the one description of the model and its block, its
// checkpoint metadata, its registry entry and its foreign tensor names.
#include "nn/models/llama.h"

#include <cmath>
#include <stdexcept>

#include "core/ops.h"
#include "core/random.h"
#include "nn/architecture.h"

namespace tapegrad::nn {

void LlamaConfig::validate() const {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(fmt::format("llama(vocab={}, d_model={}, n_heads={}, n_kv_heads={}, head_dim={}, "
                                            "n_blocks={}, max_len={}, d_ff={}): {}",
                                            vocab, d_model, n_heads, kv_heads(), head_size(), n_blocks, max_len,
                                            ffn_dim(), why));
  };
  if (vocab == 0 || d_model == 0 || n_heads == 0 || kv_heads() == 0 || head_size() == 0 || n_blocks == 0 ||
      max_len == 0 || ffn_dim() == 0)
    fail("every size must be positive");
  if (vocab > std::size_t(INT32_MAX)) fail("vocab must fit in int32 token ids");
  // Bounds on the buffers that scale with max_len (RoPE table, KV cache: max_len x the KV width
  // per block), so that no configuration, e.g. one read from a forged checkpoint, asks for gigabytes.
  constexpr std::size_t max_positions = 1 << 20, max_cache_floats = std::size_t(1) << 28, max_width = 1 << 20;
  if (max_len > max_positions) fail(fmt::format("max_len {} exceeds the supported {}", max_len, max_positions));
  if (d_model > max_width || head_size() > max_width || n_heads > max_width || ffn_dim() > max_width)
    fail(fmt::format("d_model, head_dim, n_heads and d_ff must be at most {}", max_width));
  if (max_len * kv_width() > max_cache_floats)
    fail(fmt::format("max_len x n_kv_heads x head_dim = {} exceeds the supported {} (a 1 GiB cache per block)",
                     max_len * kv_width(), max_cache_floats));
  if (!head_dim && d_model % n_heads != 0)
    fail(fmt::format("d_model {} is not divisible by n_heads {} (give head_dim)", d_model, n_heads));
  if (n_heads % kv_heads() != 0) fail(fmt::format("n_kv_heads {} does not divide n_heads {}", kv_heads(), n_heads));
  if (head_size() % 2 != 0) fail(fmt::format("head_dim {} must be even for RoPE", head_size()));
  if (!(dropout >= 0 && dropout < 1)) fail(fmt::format("dropout {} must be in [0, 1)", dropout));
  if (!(norm_eps > 0) || !(rope_theta > 0))
    fail(fmt::format("norm_eps {} and rope_theta {} must be positive", norm_eps, rope_theta));
}

// Validation runs before any parameter is allocated.
static Rng validated_init_rng(const LlamaConfig& config) {
  config.validate();
  return Rng(config.seed);
}

LlamaBlock::LlamaBlock(const LlamaConfig& c, std::shared_ptr<const kernels::RopeTable<float>> rope_table,
                       float init_std, float out_std, Rng& rng)
    : heads(c.n_heads, c.kv_heads()),
      rope(std::move(rope_table)),
      attn_norm(c.d_model, c.norm_eps),
      wq(c.d_model, c.q_width(), false, init_std, rng),
      wk(c.d_model, c.kv_width(), false, init_std, rng),
      wv(c.d_model, c.kv_width(), false, init_std, rng),
      wo(c.q_width(), c.d_model, false, out_std, rng),
      ffn_norm(c.d_model, c.norm_eps),
      w1(c.d_model, c.ffn_dim(), false, init_std, rng),
      w3(c.d_model, c.ffn_dim(), false, init_std, rng),
      w2(c.ffn_dim(), c.d_model, false, out_std, rng),
      drop(c.dropout) {}

// Dropout masks, when active, in a fixed order: probabilities, attention branch, FFN branch.
template <ModelPass P>
typename P::Value LlamaBlock::run(P& p, const typename P::Value& x) const {
  auto a = p.rms_norm(x, attn_norm);
  auto q = p.rope(p.linear(a, wq), rope, heads.n_heads);
  auto k = p.rope(p.linear(a, wk), rope, heads.n_kv_heads);
  auto v = p.linear(a, wv);
  auto h = p.residual(x, p.attention(q, k, v, heads, drop), wo, drop);
  auto f = p.rms_norm(h, ffn_norm);
  auto gate = p.linear(f, w1);
  auto up = p.linear(f, w3);
  return p.output_residual(h, p.swiglu(gate, up), w2, drop);
}

// The rotary decoder's blocks are these too (RotaryDecoderBlock): one internal scheme of names.
void LlamaBlock::members(Members& m) {
  m("attn_norm", attn_norm);
  m("attn.wq", wq);
  m("attn.wk", wk);
  m("attn.wv", wv);
  m("attn.wo", wo);
  m("ffn_norm", ffn_norm);
  m("ffn.w1", w1);
  m("ffn.w3", w3);
  m("ffn.w2", w2);
  m("drop", drop);
}

Llama::Llama(const LlamaConfig& config) : Llama(config, validated_init_rng(config)) {}

Llama::Llama(const LlamaConfig& config, Rng&& rng)
    : embed(config.vocab, config.d_model, 0.02f, rng),
      norm(config.d_model, config.norm_eps),
      embed_drop(config.dropout),
      config_(config) {
  if (!config.tied_head) head.emplace(config.d_model, config.vocab, false, 0.02f, rng);
  config_.n_kv_heads = config.kv_heads();
  config_.head_dim = config.head_size();
  config_.d_ff = config.ffn_dim();
  auto rope = std::make_shared<kernels::RopeTable<float>>(
      kernels::make_rope_table<float>(config.max_len, config.head_size(), config.rope_theta));
  float out_std = 0.02f / std::sqrt(2.0f * float(config.n_blocks));
  blocks.reserve(config.n_blocks);
  for (std::size_t i = 0; i < config.n_blocks; ++i) blocks.emplace_back(config_, rope, 0.02f, out_std, rng);
}

template <ModelPass P>
typename P::Value Llama::run(P& p) const {
  auto x = p.dropout(p.embed(embed), embed_drop);
  x = run_blocks(p, x, blocks, config_.remat, config_.seed, dropout_step);
  auto out = p.rms_norm(x, norm);
  return head ? p.head(out, *head) : p.tied_head(out, embed);  // tied: x E^T
}
template Var LlamaBlock::run<TapePass>(TapePass&, const Var&) const;
template Rows LlamaBlock::run<CachePass>(CachePass&, const Rows&) const;
template ModelPassArchetype::Value LlamaBlock::run<ModelPassArchetype>(ModelPassArchetype&,
                                                                       const ModelPassArchetype::Value&) const;
template Var Llama::run<TapePass>(TapePass&) const;
template Rows Llama::run<CachePass>(CachePass&) const;
template ModelPassArchetype::Value Llama::run<ModelPassArchetype>(ModelPassArchetype&) const;

void Llama::members(Members& m) {
  m("embed", embed);
  m("embed_drop", embed_drop);
  m("blocks", blocks);
  m("norm", norm);
  if (head) m("head", *head);
}

Metadata llama_config_metadata(const LlamaConfig& c) {
  Metadata metadata = {{"n_kv_heads", std::to_string(c.kv_heads())},
                       {"head_dim", std::to_string(c.head_size())},
                       {"norm_eps", fmt::format("{}", c.norm_eps)},
                       {"rope_theta", fmt::format("{}", c.rope_theta)},
                       {"tied_head", c.tied_head ? "true" : "false"}};
  write_model_sizes(c, metadata);
  if (c.dropout > 0) metadata["dropout"] = fmt::format("{}", c.dropout);
  write_dropout_seed(c, metadata);
  return metadata;
}

LlamaConfig llama_config_from_metadata(const Metadata& metadata) {
  LlamaConfig config;
  read_model_sizes(metadata, config);
  config.n_kv_heads = metadata_size(metadata, "n_kv_heads");
  config.head_dim = metadata_size(metadata, "head_dim");
  config.norm_eps = float(metadata_positive(metadata, "norm_eps"));
  config.rope_theta = metadata_positive(metadata, "rope_theta");
  const std::string& tied = metadata_text(metadata, "tied_head");
  if (tied != "true" && tied != "false")
    throw std::runtime_error(fmt::format("checkpoint metadata: tied_head must be true or false, got '{}'", tied));
  config.tied_head = tied == "true";
  if (metadata.count("dropout")) config.dropout = float(metadata_probability(metadata, "dropout"));
  read_dropout_seed(metadata, config);
  return config;
}

std::vector<ForeignTensor> llama_foreign_tensors(const LlamaConfig& c) {
  std::vector<ForeignTensor> map{{"embed.weight", "model.embed_tokens.weight", "token_embd.weight"}};
  for (std::size_t i = 0; i < c.n_blocks; ++i) {
    const std::string ours = fmt::format("blocks.{}.", i), hf = fmt::format("model.layers.{}.", i),
                      gguf = fmt::format("blk.{}.", i);
    auto entry = [&](const char* param, const char* hf_name, const char* gguf_name, bool linear,
                     std::size_t rope_heads = 0) {
      ForeignTensor t{ours + param, hf + hf_name, gguf + gguf_name};
      t.linear_weight = linear;
      t.hf_rope_heads = rope_heads;
      map.push_back(std::move(t));
    };
    entry("attn_norm.weight", "input_layernorm.weight", "attn_norm.weight", false);
    entry("attn.wq.weight", "self_attn.q_proj.weight", "attn_q.weight", true, c.n_heads);
    entry("attn.wk.weight", "self_attn.k_proj.weight", "attn_k.weight", true, c.kv_heads());
    entry("attn.wv.weight", "self_attn.v_proj.weight", "attn_v.weight", true);
    entry("attn.wo.weight", "self_attn.o_proj.weight", "attn_output.weight", true);
    entry("ffn_norm.weight", "post_attention_layernorm.weight", "ffn_norm.weight", false);
    entry("ffn.w1.weight", "mlp.gate_proj.weight", "ffn_gate.weight", true);
    entry("ffn.w3.weight", "mlp.up_proj.weight", "ffn_up.weight", true);
    entry("ffn.w2.weight", "mlp.down_proj.weight", "ffn_down.weight", true);
  }
  map.push_back({"norm.weight", "model.norm.weight", "output_norm.weight"});
  if (!c.tied_head) {
    ForeignTensor head{"head.weight", "lm_head.weight", "output.weight"};
    head.linear_weight = true;
    map.push_back(std::move(head));
  }
  return map;
}

// Listed in nn/architecture.cpp.
Architecture llama_architecture() {
  return make_architecture<Llama>("llama", &llama_config_from_metadata, &llama_config_metadata);
}

}  // namespace tapegrad::nn
