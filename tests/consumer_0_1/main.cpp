// A program written against tapegrad 0.1, unchanged: every spelling that 0.2 renamed or moved, as
// a user of 0.1 wrote it (old header paths, core/op.h, nn::CharTokenizer, a module that lists its
// parameters in collect_params, an architecture whose tied head is p.matmul_transposed,
// save_checkpoint and load_checkpoint). Its deprecation warnings are expected; if it stops
// compiling, a forwarder was removed before its time (README.md, "Versions"). Prints "ok" and exits
// 0 when every result is what 0.1 gave.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/op.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "core/tape.h"
#include "nn/checkpoint.h"
#include "nn/generate.h"
#include "nn/gpt2.h"
#include "nn/module_io.h"
#include "nn/rotary_decoder.h"
#include "nn/tokenizer.h"
#include "optim/adamw.h"

using namespace tapegrad;

namespace {

std::vector<std::string> failures;

void expect(bool ok, const std::string& what) {
  if (!ok) failures.push_back(what);
}

// An op of one's own as 0.1's docs/custom-ops.md wrote one, with core/op.h: y = 2 x.
Var twice(const Var& x) {
  Op op("twice", {x});
  Tensor y(x.shape());
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = 2 * x.value()[i];
  return op.finish(std::move(y), [x](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x))
      for (std::size_t i = 0; i < dy.size(); ++i) dx[i] += 2 * dy[i];
  });
}

// A module as 0.1's README wrote one: its parameters listed in collect_params.
struct Mlp : nn::Module {
  nn::Linear l1, l2;
  explicit Mlp(Rng& rng) : l1(2, 8, true, 0.5f, rng), l2(8, 2, true, 0.5f, rng) {}
  Var forward(const Var& x) const { return l2.forward(tanh(l1.forward(x))); }
  void collect_params(const std::string& prefix, ParameterList& out) const override {
    l1.collect_params(prefix + "l1.", out);
    l2.collect_params(prefix + "l2.", out);
  }
};

// An architecture as 0.1 described one: one attention block, the head tied to the embedding by
// p.matmul_transposed.
struct TiedConfig {
  std::size_t vocab = 0, d_model = 0, n_blocks = 1, max_len = 0;
  std::uint64_t seed = 0;
};

class TiedDecoder : public nn::Module, public nn::DecoderModel<TiedDecoder> {
 public:
  TiedDecoder(const TiedConfig& config, Rng&& rng)
      : config_(config), embed(config.vocab, config.d_model, 0.5f, rng), norm(config.d_model),
        wv(config.d_model, config.d_model, false, 0.3f, rng) {}
  template <nn::ModelPass P>
  typename P::Value run(P& p) const {
    typename P::Value x = p.embed(embed);
    typename P::Value h = p.rms_norm(x, norm);
    typename P::Value v = p.linear(h, wv);
    typename P::Value a = p.attention(h, h, v, 1, drop);
    typename P::Value y = p.add(x, a);
    return p.matmul_transposed(y, embed.weight);
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
  TiedConfig config_;
  nn::Embedding embed;
  nn::RMSNorm norm;
  nn::Linear wv;
  nn::Dropout drop;
};

void check_op_of_core_op_h() {
  Var x(Tensor({3}, {1.0f, -2.0f, 0.5f}), /*requires_grad=*/true);
  {
    Tape tape;
    tape.backward(sum(twice(x)));
  }
  expect(x.grad()[0] == 2.0f && x.grad()[2] == 2.0f, "an op recorded through core/op.h");
}

void check_module_listed_in_collect_params() {
  Rng rng(1);
  Mlp model(rng);
  ParameterList params = model.params();
  expect(params.size() == 4 && params[0].name == "l1.weight" && params[3].name == "l2.bias",
         "collect_params names the parameters as 0.1 did");
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
  expect(last < first, "AdamW trains a module listed in collect_params");
}

void check_tied_head_through_matmul_transposed() {
  nn::CharTokenizer tokenizer = nn::CharTokenizer::from_text("abcdefgh");
  TiedDecoder model({.vocab = tokenizer.size(), .d_model = 8, .n_blocks = 1, .max_len = 16}, Rng(2));
  std::vector<std::int32_t> ids = tokenizer.encode("abcdefg");
  std::vector<std::int32_t> inputs(ids.begin(), ids.end() - 1), targets(ids.begin() + 1, ids.end());
  Var logits = model.forward(inputs, 1, inputs.size());
  float by_hand = cross_entropy(logits, targets).value().item();
  float loss = model.loss(inputs, targets, 1, inputs.size()).value().item();
  expect(std::fabs(loss - by_hand) < 1e-6f, "loss() of a description ending in matmul_transposed");
  nn::KVCache cache = model.make_cache();
  Tensor prefilled = model.prefill(inputs, cache);
  expect(max_abs_diff(prefilled.reshaped({1, inputs.size(), tokenizer.size()}), logits.value()) < 1e-5f,
         "prefill through matmul_transposed gives forward's logits");
  nn::GenerateOptions greedy{.max_new = 4, .sampling = {.temperature = 0.0f}};
  nn::GenerateOptions uncached = greedy;
  uncached.use_cache = false;
  expect(nn::generate(model, inputs, greedy).tokens == nn::generate(model, inputs, uncached).tokens,
         "generate decodes an architecture of 0.1 through the cache as without it");
}

void check_rotary_decoder_and_char_tokenizer() {
  nn::CharTokenizer tokenizer = nn::CharTokenizer::from_text("hello, old spellings");
  nn::RotaryDecoder model = nn::rotary_decoder(tokenizer.size(), 16, 2, 1, 16);
  nn::Generation out = nn::generate(model, tokenizer.encode("he"), {.max_new = 4, .sampling = {.temperature = 0.0f}});
  expect(out.tokens.size() == 4, "generate from a rotary decoder of nn/rotary_decoder.h");
  std::string text;
  for (char32_t c : nn::decode_utf8("h\xC3\xA9")) nn::append_utf8(text, c);
  expect(text == "h\xC3\xA9", "nn::decode_utf8 and nn::append_utf8 round trip");
  nn::Gpt2 gpt2({.vocab = tokenizer.size(), .d_model = 16, .n_heads = 2, .n_blocks = 1, .max_len = 16});
  expect(gpt2.num_params() > 0, "a GPT-2 of nn/gpt2.h");

  // 0.1's rotary-only checkpoint functions.
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tapegrad_consumer_0_1_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  nn::save_checkpoint(path, model, tokenizer);
  nn::LoadedCheckpoint loaded = nn::load_checkpoint(path);
  std::filesystem::remove(path);
  expect(loaded.tokenizer.decode(loaded.tokenizer.encode("hello")) == "hello", "load_checkpoint's vocabulary");
  expect(max_abs_diff(loaded.model.params()[0].var.value(), model.params()[0].var.value()) == 0.0f,
         "load_checkpoint gives the saved weights");
}

}  // namespace

int main() {
  check_op_of_core_op_h();
  check_module_listed_in_collect_params();
  check_tied_head_through_matmul_transposed();
  check_rotary_decoder_and_char_tokenizer();
  for (const std::string& failure : failures) std::printf("consumer_0_1: %s\n", failure.c_str());
  std::printf("%s\n", failures.empty() ? "ok" : "FAILED");
  return failures.empty() ? 0 : 1;
}
