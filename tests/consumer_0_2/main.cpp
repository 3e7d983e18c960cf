// A program written against tapegrad 0.2, unchanged: what a user of 0.2 wrote with its API (an op
// of one's own through core/op_recording.h, a module naming its members, an architecture of one's
// own with a tied head, registered and saved in a checkpoint, the character tokenizer and UTF-8
// functions of tokenizers/, LanguageModel::Sizes). Deprecation warnings are expected (names 0.3
// renamed); if it stops compiling, a forwarder was removed before its time (README.md,
// "Versions"). Prints "ok" and exits 0 when every result is what 0.2 gave.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/op_recording.h"
#include "core/ops.h"
#include "core/tape.h"
#include "io/safetensors.h"
#include "nn/architecture.h"
#include "nn/checkpoint.h"
#include "nn/checkpoint_metadata.h"
#include "nn/generate.h"
#include "nn/language_model.h"
#include "nn/models/gpt2.h"
#include "nn/models/rotary_decoder.h"
#include "optim/adamw.h"
#include "tokenizers/char_tokenizer.h"
#include "tokenizers/utf8.h"

using namespace tapegrad;

namespace {

std::vector<std::string> failures;

void expect(bool ok, const std::string& what) {
  if (!ok) failures.push_back(what);
}

std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("tapegrad_consumer_0_2_" + std::to_string(::getpid()) + "_" + name + ".safetensors"))
      .string();
}

// An op of one's own as 0.2's docs/custom-ops.md wrote one: y = 2 x.
Var twice(const Var& x) {
  Op op("twice", {x});
  Tensor y(x.shape());
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = 2 * x.value()[i];
  return op.finish(std::move(y), [x](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x))
      for (std::size_t i = 0; i < dy.size(); ++i) dx[i] += 2 * dy[i];
  });
}

// A module as 0.2's README wrote one: its parameters and children named in members().
struct Mlp : nn::Module {
  nn::Linear l1, l2;
  explicit Mlp(Rng& rng) : l1(2, 8, true, 0.5f, rng), l2(8, 2, true, 0.5f, rng) {}
  Var forward(const Var& x) const { return l2.forward(tanh(l1.forward(x))); }
  void members(nn::Members& m) override {
    m("l1", l1);
    m("l2", l2);
  }
};

// An architecture of one's own: one attention block, the head tied to the embedding.
struct TiedConfig {
  std::size_t vocab = 0, d_model = 0, n_heads = 1, n_blocks = 1, max_len = 0;
  std::optional<std::size_t> d_ff;
  float dropout = 0;
  bool remat = false;
  std::uint64_t seed = 0;
  std::size_t ffn_dim() const { return d_ff.value_or(d_model); }  // no feed-forward: not used
};

class TiedDecoder : public nn::Module, public nn::DecoderModel<TiedDecoder> {
 public:
  explicit TiedDecoder(const TiedConfig& config) : TiedDecoder(config, Rng(config.seed)) {}
  template <nn::ModelPass P>
  typename P::Value run(P& p) const {
    typename P::Value x = p.embed(embed);
    typename P::Value h = p.rms_norm(x, norm);
    typename P::Value v = p.linear(h, wv);
    typename P::Value a = p.attention(h, h, v, config_.n_heads, drop);
    return p.tied_head(p.add(x, a), embed);
  }
  void members(nn::Members& m) override {
    m("embed", embed);
    m("norm", norm);
    m("wv", wv);
    m("drop", drop);
  }
  const TiedConfig& config() const { return config_; }
  std::uint64_t dropout_step = 0;

 private:
  TiedDecoder(const TiedConfig& config, Rng&& rng)
      : config_(config), embed(config.vocab, config.d_model, 0.5f, rng), norm(config.d_model),
        wv(config.d_model, config.d_model, false, 0.3f, rng) {}
  TiedConfig config_;
  nn::Embedding embed;
  nn::RMSNorm norm;
  nn::Linear wv;
  nn::Dropout drop;
};

TiedConfig tied_config(const nn::Metadata& metadata) {
  TiedConfig c;
  nn::read_model_sizes(metadata, c);
  return c;
}

nn::Metadata tied_metadata(const TiedConfig& c) {
  nn::Metadata metadata;
  nn::write_model_sizes(c, metadata);
  return metadata;
}

void check_op_of_op_recording() {
  Var x(Tensor({3}, {1.0f, -2.0f, 0.5f}), /*requires_grad=*/true);
  {
    Tape tape;
    tape.backward(sum(twice(x)));
  }
  expect(x.grad()[0] == 2.0f && x.grad()[2] == 2.0f, "an op recorded through core/op_recording.h");
}

void check_module_of_members() {
  Rng rng(1);
  Mlp model(rng);
  ParameterList params = model.params();
  expect(params.size() == 4 && params[0].name == "l1.weight" && params[3].name == "l2.bias",
         "members() names the parameters");
  optim::AdamW optimizer(model.params(), {.lr = 1e-2f});
  Tensor x({4, 2}, {0.1f, 0.2f, -0.3f, 0.4f, 0.5f, -0.6f, 0.7f, 0.8f});
  std::vector<std::int32_t> labels{0, 1, 0, 1};
  float first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    optimizer.zero_grad();
    Tape tape;
    Var loss = cross_entropy(model.forward(Var(x)), labels);
    tape.backward(loss);
    optimizer.step();
    (step == 0 ? first : last) = loss.value().item();
  }
  expect(last < first, "AdamW trains a module of members()");
}

void check_registered_tied_architecture() {
  nn::register_architecture(nn::make_architecture<TiedDecoder>("consumer_tied", &tied_config, &tied_metadata));
  tokenizers::CharTokenizer tokenizer = tokenizers::CharTokenizer::from_text("abcdefgh");
  TiedDecoder model({.vocab = tokenizer.size(), .d_model = 8, .n_heads = 2, .max_len = 16, .d_ff = 8, .seed = 2});
  std::vector<std::int32_t> ids = tokenizer.encode("abcdefg");
  std::vector<std::int32_t> inputs(ids.begin(), ids.end() - 1), targets(ids.begin() + 1, ids.end());
  Var logits = model.forward(inputs, 1, inputs.size());
  const float by_hand = cross_entropy(logits, targets).value().item();
  const float fused = model.loss(inputs, targets, 1, inputs.size()).value().item();
  expect(std::fabs(fused - by_hand) < 1e-5f, "loss() of a description ending in tied_head");
  nn::KVCache cache = model.make_cache();
  Tensor prefilled = model.prefill(inputs, cache);
  expect(max_abs_diff(prefilled.reshaped({1, inputs.size(), tokenizer.size()}), logits.value()) < 1e-5f,
         "prefill through tied_head gives forward's logits");
  nn::GenerateOptions greedy{.max_new = 4, .sampling = {.temperature = 0.0f}};
  nn::GenerateOptions uncached = greedy;
  uncached.use_cache = false;
  expect(nn::generate(model, inputs, greedy).tokens == nn::generate(model, inputs, uncached).tokens,
         "generate decodes the architecture through the cache as without it");

  const nn::LanguageModel held(model);
  const nn::LanguageModel::Sizes sizes = held.config();
  expect(sizes.vocab == tokenizer.size() && sizes.max_len == 16, "LanguageModel::Sizes of config()");
  const std::string path = temp_file("tied");
  nn::save_model_checkpoint(path, held, tokenizer);
  expect(read_safetensors(path).metadata.at("arch") == "consumer_tied", "the checkpoint names the architecture");
  nn::LoadedModelCheckpoint loaded = nn::load_model_checkpoint(path);
  std::filesystem::remove(path);
  expect(loaded.model.arch() == "consumer_tied" && loaded.model.as<TiedDecoder>() != nullptr,
         "load_model_checkpoint builds the registered architecture");
  expect(loaded.char_tokenizer().decode(loaded.char_tokenizer().encode("bad")) == "bad", "the checkpoint's vocabulary");
  expect(max_abs_diff(loaded.model.forward(inputs, 1, inputs.size()).value(), logits.value()) == 0.0f,
         "the loaded model gives the saved one's logits");
}

void check_built_in_models_and_tokenizers() {
  tokenizers::CharTokenizer tokenizer = tokenizers::CharTokenizer::from_text("hello, 0.2 spellings");
  nn::RotaryDecoder model = nn::rotary_decoder(tokenizer.size(), 16, 2, 1, 16);
  nn::Generation out = nn::generate(model, tokenizer.encode("he"), {.max_new = 4, .sampling = {.temperature = 0.0f}});
  expect(out.tokens.size() == 4, "generate from a rotary decoder");
  std::string text;
  for (char32_t c : tokenizers::decode_utf8("h\xC3\xA9")) tokenizers::append_utf8(text, c);
  expect(text == "h\xC3\xA9", "tokenizers::decode_utf8 and append_utf8 round trip");
  nn::Gpt2 gpt2({.vocab = tokenizer.size(), .d_model = 16, .n_heads = 2, .n_blocks = 1, .max_len = 16});
  const std::string path = temp_file("gpt2");
  nn::save_model_checkpoint(path, nn::LanguageModel(gpt2), tokenizer);
  nn::LoadedModelCheckpoint loaded = nn::load_model_checkpoint(path);
  std::filesystem::remove(path);
  expect(loaded.model.as<nn::Gpt2>() != nullptr && loaded.model.num_params() == gpt2.num_params(),
         "a GPT-2 saved and loaded by its registered name");
}

}  // namespace

int main() {
  check_op_of_op_recording();
  check_module_of_members();
  check_registered_tied_architecture();
  check_built_in_models_and_tokenizers();
  for (const std::string& failure : failures) std::printf("consumer_0_2: %s\n", failure.c_str());
  std::printf("%s\n", failures.empty() ? "ok" : "FAILED");
  return failures.empty() ? 0 : 1;
}
