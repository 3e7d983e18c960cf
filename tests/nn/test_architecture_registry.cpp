// The architecture registry (nn/architecture.h) is open: a third architecture, defined and
// registered in this file alone, trains, saves, loads by its name and decodes like the built-in ones.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/ops.h"
#include "io/safetensors.h"
#include "nn/architecture.h"
#include "nn/checkpoint.h"
#include "nn/generate.h"
#include "nn/models/gpt2.h"
#include "nn/models/rotary_decoder.h"
#include "optim/adamw.h"
#include "support/helpers.h"

using namespace tapegrad;
using namespace tapegrad::nn;

using test::values;

namespace {

/// The sizes of a OneBlock decoder (the fields of ModelShape, so the default shape conversions apply).
struct OneBlockConfig {
  std::size_t vocab = 0, d_model = 0, n_heads = 0, n_blocks = 1, max_len = 0;
  std::optional<std::size_t> d_ff;
  float dropout = 0;
  bool remat = false;
  std::uint64_t seed = 0;
  std::size_t ffn_dim() const { return d_ff.value_or(2 * d_model); }
};

/// A decoder of one block and no positions: x = E[ids]; h = x + Attn(RMSNorm(x));
/// out = h + gelu(RMSNorm(h) W1) W2; logits = out W_head.
class OneBlock : public Module, public DecoderModel<OneBlock> {
 public:
  explicit OneBlock(const OneBlockConfig& config) : OneBlock(config, Rng(config.seed)) {}

  template <ModelPass P> typename P::Value run(P& p) const {
    auto x = p.embed(embed);
    auto out = p.block(x, config_.remat, dropout_seed(config_.seed, dropout_step, 1), [this](auto& bp, const auto& h0) {
      auto a = bp.rms_norm(h0, attn_norm);
      auto q = bp.linear(a, wq);
      auto k = bp.linear(a, wk);
      auto v = bp.linear(a, wv);
      auto h = bp.residual(h0, bp.attention(q, k, v, config_.n_heads, drop), wo, drop);
      auto f = bp.gelu_tanh(bp.linear(bp.rms_norm(h, ffn_norm), w1));
      return bp.output_residual(h, f, w2, drop);
    });
    return p.linear(out, head);
  }
  void members(Members& m) override {
    m("embed", embed);
    m("attn_norm", attn_norm);
    m("wq", wq);
    m("wk", wk);
    m("wv", wv);
    m("wo", wo);
    m("ffn_norm", ffn_norm);
    m("w1", w1);
    m("w2", w2);
    m("head", head);
    m("drop", drop);
  }
  const OneBlockConfig& config() const { return config_; }
  std::uint64_t dropout_step = 0;

 private:
  OneBlock(const OneBlockConfig& c, Rng&& rng)
      : config_(c),
        embed(c.vocab, c.d_model, 0.1f, rng),
        attn_norm(c.d_model),
        wq(c.d_model, c.d_model, false, 0.1f, rng),
        wk(c.d_model, c.d_model, false, 0.1f, rng),
        wv(c.d_model, c.d_model, false, 0.1f, rng),
        wo(c.d_model, c.d_model, false, 0.1f, rng),
        ffn_norm(c.d_model),
        w1(c.d_model, c.ffn_dim(), true, 0.1f, rng),
        w2(c.ffn_dim(), c.d_model, true, 0.1f, rng),
        head(c.d_model, c.vocab, true, 0.1f, rng),
        drop(c.dropout) {}
  OneBlockConfig config_;
  Embedding embed;
  RMSNorm attn_norm;
  Linear wq, wk, wv, wo;
  RMSNorm ffn_norm;
  Linear w1, w2, head;
  Dropout drop;
};
// The description uses the ops of ModelPass and nothing else (nn/model_pass.h).
template ModelPassArchetype::Value OneBlock::run<ModelPassArchetype>(ModelPassArchetype&) const;

OneBlockConfig one_block_config(const Metadata& metadata) {
  OneBlockConfig c;
  c.vocab = metadata_size(metadata, "vocab_size");
  c.d_model = metadata_size(metadata, "d_model");
  c.n_heads = metadata_size(metadata, "n_heads");
  c.max_len = metadata_size(metadata, "max_len");
  c.d_ff = metadata_size(metadata, "d_ff");
  return c;
}

Metadata one_block_metadata(const OneBlockConfig& c) {
  return {{"vocab_size", std::to_string(c.vocab)},
          {"d_model", std::to_string(c.d_model)},
          {"n_heads", std::to_string(c.n_heads)},
          {"max_len", std::to_string(c.max_len)},
          {"d_ff", std::to_string(c.ffn_dim())}};
}

// The whole registration: a name, the model class, and its config to and from metadata.
const bool one_block_registered =
    (register_architecture(make_architecture<OneBlock>("one_block", &one_block_config, &one_block_metadata)), true);

std::string temp_path(const std::string& name) { return test::process_path("architecture_registry_" + name); }

std::vector<float> values(std::span<const float> s) { return {s.begin(), s.end()}; }
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("an architecture defined in a test trains, saves, loads by its name and decodes like the built-in ones") {
  REQUIRE(one_block_registered);
  const tokenizers::CharTokenizer tokenizer = tokenizers::CharTokenizer::from_text("abcabd dcba");
  LanguageModel model = find_architecture("one_block").make(
      {.vocab = tokenizer.size(), .d_model = 8, .n_heads = 2, .max_len = 16, .d_ff = 12, .seed = 7});
  CHECK(model.arch() == "one_block");
  CHECK(model.describe() == fmt::format("one_block({} parameters)", model.num_params()));
  CHECK(find_architecture("one_block").shape(model).d_ff == 12);

  // A few AdamW steps on one text: the loss goes down.
  const std::vector<std::int32_t> ids = tokenizer.encode("abcabd dcbaabcabd dcb");
  const std::span<const std::int32_t> inputs = std::span(ids).first(16), targets = std::span(ids).subspan(1, 16);
  ParameterList params = model.params();
  optim::AdamW optimizer(params, {.lr = 1e-2f});
  float first = 0, last = 0;
  for (int step = 0; step < 10; ++step) {
    Tape tape;
    Var loss = model.loss(inputs, targets, 1, 16);
    (step == 0 ? first : last) = loss.value().item();
    tape.backward(loss);
    optimizer.step();
    optimizer.zero_grad();
  }
  CHECK(last < first);

  // Saved and loaded through its name: the same weights, bit for bit, and the same file back.
  const std::string path = temp_path("one_block.safetensors"), again = temp_path("one_block_again.safetensors");
  save_model_checkpoint(path, model, tokenizer);
  CHECK(read_safetensors(path).metadata.at("arch") == "one_block");
  LoadedModelCheckpoint loaded = load_model_checkpoint(path);
  REQUIRE(loaded.model.as<OneBlock>() != nullptr);
  CHECK(loaded.model.as<Gpt2>() == nullptr);
  CHECK(loaded.char_tokenizer().vocab() == tokenizer.vocab());
  const ParameterList a = model.params(), b = loaded.model.params();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].name == b[i].name);
    CHECK(values(a[i].var.value()) == values(b[i].var.value()));
  }
  save_model_checkpoint(again, loaded.model, *loaded.tokenizer);
  CHECK(file_bytes(again) == file_bytes(path));

  // Decoding: the cached steps follow the uncached forward (to float rounding) and pick the very
  // same tokens, greedy and sampled; several sequences decode the bits each gets alone.
  LanguageModel& decoder = loaded.model;
  decoder.set_training(false);
  const std::vector<std::int32_t> prompt = tokenizer.encode("abc");
  for (float temperature : {0.0f, 1.0f}) {
    GenerateOptions cached{.max_new = 12, .sampling = {.temperature = temperature}, .seed = 3};
    GenerateOptions uncached = cached;
    uncached.use_cache = false;
    CHECK(generate(decoder, prompt, cached).tokens == generate(decoder, prompt, uncached).tokens);
  }
  std::vector<std::int32_t> text = tokenizer.encode("abd dcbaab");
  Tensor full;
  {
    NoGradScope no_grad;
    full = decoder.forward(text, 1, text.size()).value();
  }
  KVCache one = decoder.make_cache(), three = decoder.make_cache(3);
  decoder.prefill(std::span(text).first(1), one);
  decoder.prefill(std::vector<std::vector<std::int32_t>>(3, {text[0]}), three);
  const std::size_t vocab = tokenizer.size();
  for (std::size_t t = 1; t < text.size(); ++t) {
    const std::vector<float> alone = values(decoder.step(text[t], one));
    const std::vector<std::int32_t> same(3, text[t]);
    const std::vector<float> batched = values(decoder.step(same, three));
    for (std::size_t s = 0; s < 3; ++s)
      CHECK(std::vector<float>(batched.begin() + std::ptrdiff_t(s * vocab), batched.begin() + std::ptrdiff_t((s + 1) * vocab)) ==
            alone);  // bit for bit
    for (std::size_t i = 0; i < vocab; ++i) CHECK(alone[i] == doctest::Approx(full[t * vocab + i]).epsilon(1e-5));
  }
}

TEST_CASE("an unknown architecture, in a checkpoint or by name, is an error naming it and every registered name") {
  REQUIRE(one_block_registered);
  CHECK(test::error_of([] { find_architecture("mlp", "--arch"); }) ==
        "--arch 'mlp' is not a registered architecture (registered: rotary, gpt2, llama, one_block)");
  const tokenizers::CharTokenizer tokenizer = tokenizers::CharTokenizer::from_text("abcd");
  const std::string good = temp_path("rotary.safetensors"), bad = temp_path("unknown_arch.safetensors");
  save_model_checkpoint(good, rotary_decoder(4, 8, 2, 1, 8), tokenizer);
  SafetensorsFile file = read_safetensors(good);
  CHECK(file.metadata.at("arch") == "rotary");
  file.metadata["arch"] = "mamba";
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const auto& [name, t] : file.tensors) tensors.emplace_back(name, &t);
  write_safetensors(bad, tensors, file.metadata);
  CHECK(test::error_of([&] { load_model_checkpoint(bad); }) ==
        bad + ": metadata arch 'mamba' is not a registered architecture (registered: rotary, gpt2, llama, one_block)");
  CHECK(test::contains(test::error_of([] {
                         register_architecture(make_architecture<OneBlock>("other", &one_block_config, &one_block_metadata));
                       }),
                       "'other' clashes with the registered 'one_block' (same model class)"));
  CHECK(test::contains(test::error_of([] {
                         register_architecture(make_architecture<Gpt2>("rotary", &gpt2_config_from_metadata, &gpt2_config_metadata));
                       }),
                       "'rotary' clashes with the registered 'rotary' (same name)"));
}
