// gpt2, the pre-LN GPT-2 decoder: the parameter count and names, causality (the no-cache path's
// logits equal the full forward's at every position), remat, dropout's train/eval switch and
// streams, and overfitting one batch.
#include <doctest/doctest.h>

#include <cmath>

#include "core/ops.h"
#include "nn/generate.h"
#include "nn/models/gpt2.h"
#include "nn/models/rotary_decoder.h"
#include "optim/adamw.h"
#include "support/checks.h"

using namespace tapegrad;

TEST_CASE("gpt2(65, 64, 4, 2, 256) has exactly 120,640 parameters with the tensor names of the checkpoint format") {
  nn::Gpt2 model = nn::gpt2(65, 64, 4, 2, 256);
  CHECK(model.num_params() == 120640);
  std::vector<std::string> names;
  for (const auto& p : model.params()) names.push_back(p.name);
  std::vector<std::string> expected = {"embed.weight", "pos.weight"};
  for (int i = 0; i < 2; ++i)
    for (const char* n : {"attn_norm.weight", "attn_norm.bias", "attn.wq.weight", "attn.wq.bias", "attn.wk.weight",
                          "attn.wk.bias", "attn.wv.weight", "attn.wv.bias", "attn.wo.weight", "attn.wo.bias",
                          "ffn_norm.weight", "ffn_norm.bias", "ffn.w1.weight", "ffn.w1.bias", "ffn.w2.weight", "ffn.w2.bias"})
      expected.push_back(fmt::format("blocks.{}.{}", i, n));
  expected.push_back("norm.weight");
  expected.push_back("norm.bias");
  CHECK(names == expected);
  CHECK(fmt::format("{}", model) == "Gpt2(vocab=65, d_model=64, n_heads=4, n_blocks=2, max_len=256, d_ff=256, dropout=0, remat=false)");
  CHECK(test::contains(test::error_of([] { nn::gpt2(65, 63, 4, 2, 256); }), "d_model 63 is not divisible by n_heads 4"));
}

TEST_CASE("gpt2's initial loss is close to log(vocab), and logits are causal") {
  nn::Gpt2 model = nn::gpt2(11, 16, 2, 2, 12, std::nullopt, 0, false, 3);
  std::vector<std::int32_t> ids = test::random_ids(2 * 12, 11, 4), targets = test::random_ids(2 * 12, 11, 5);
  NoGradScope no_grad;
  Var logits = model.forward(ids, 2, 12);
  CHECK(logits.shape() == Shape{2, 12, 11});
  CHECK(model.loss(ids, targets, 2, 12).value().item() == doctest::Approx(std::log(11.0)).epsilon(0.05));
  // The no-cache path generates from forward over each prefix: the logits of the prefix's last
  // position equal the full forward's at that position.
  std::vector<std::int32_t> first(ids.begin(), ids.begin() + 12);
  Tensor full = model.forward(first, 1, 12).value();
  for (std::size_t t = 1; t <= 12; ++t) {
    Tensor prefix = model.forward(std::span(first.data(), t), 1, t).value();
    for (std::size_t v = 0; v < 11; ++v)
      CHECK(std::fabs(prefix[(t - 1) * 11 + v] - full[(t - 1) * 11 + v]) <= 1e-5f);
  }
  nn::GenerateOptions options;
  options.max_new = 5;
  options.use_cache = false;
  CHECK(nn::generate(model, std::span(first.data(), 3), options).tokens.size() == 5);
}

TEST_CASE("gpt2 with remat gives the plain path's loss and gradients bit for bit, dropout on") {
  std::vector<std::int32_t> ids = test::random_ids(2 * 8, 13, 6), targets = test::random_ids(2 * 8, 13, 7);
  auto run = [&](bool remat) {
    nn::Gpt2 model = nn::gpt2(13, 16, 2, 2, 8, std::nullopt, 0.2f, remat, 8);
    model.dropout_step = 5;
    Tape tape;
    Var loss = model.loss(ids, targets, 2, 8);
    tape.backward(loss);
    std::vector<Tensor> out = {loss.value()};
    for (const auto& p : model.params()) out.push_back(p.var.grad());
    return out;
  };
  std::vector<Tensor> plain = run(false), remat = run(true);
  for (std::size_t k = 0; k < plain.size(); ++k) CHECK(max_abs_diff(plain[k], remat[k]) == 0.0f);
}

TEST_CASE("gpt2's dropout follows train/eval and draws its masks from (seed, step)") {
  nn::Gpt2 model = nn::gpt2(13, 16, 2, 1, 8, std::nullopt, 0.3f, false, 9);
  nn::Gpt2 plain = nn::gpt2(13, 16, 2, 1, 8, std::nullopt, 0.0f, false, 9);  // same weights, no dropout
  std::vector<std::int32_t> ids = test::random_ids(8, 13, 10);
  NoGradScope no_grad;
  auto logits = [&](const nn::Gpt2& m) { return m.forward(ids, 1, 8).value(); };
  CHECK(model.training());
  Tensor step0 = logits(model), again = logits(model);
  CHECK(max_abs_diff(step0, again) == 0.0f);  // the same step draws the same masks
  model.dropout_step = 1;
  CHECK(max_abs_diff(step0, logits(model)) > 0.0f);
  CHECK(max_abs_diff(step0, logits(plain)) > 0.0f);
  model.eval();
  CHECK_FALSE(model.blocks[0].drop.training());
  CHECK(max_abs_diff(logits(model), logits(plain)) < 1e-6f);  // eval: the identity (fused attention path)
  model.train();
  CHECK(model.blocks[0].drop.training());
}

TEST_CASE("gpt2 overfits one batch") {
  nn::Gpt2 model = nn::gpt2(16, 32, 4, 2, 16, std::nullopt, 0, false, 11);
  std::vector<std::int32_t> ids = test::random_ids(2 * 16, 16, 12), targets = test::random_ids(2 * 16, 16, 13);
  optim::AdamWOptions options;
  options.lr = 1e-2f;
  options.weight_decay = 0;
  optim::AdamW opt(model.params(), options);
  float first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    opt.zero_grad();
    Tape tape;
    Var loss = model.loss(ids, targets, 2, 16);
    if (step == 0) first = loss.value().item();
    last = loss.value().item();
    tape.backward(loss);
    opt.step();
  }
  MESSAGE("gpt2 one-batch loss: " << first << " -> " << last);
  CHECK(first > 2.5f);
  CHECK(last < 0.1f);
}

TEST_CASE("the rotary decoder's dropout: remat bit-identical, and the identity in eval mode") {
  std::vector<std::int32_t> ids = test::random_ids(2 * 8, 13, 14), targets = test::random_ids(2 * 8, 13, 15);
  auto make = [](bool remat, float p) {
    nn::RotaryDecoderConfig c{.vocab = 13, .d_model = 16, .n_heads = 2, .n_blocks = 2, .max_len = 8, .remat = remat, .seed = 16, .dropout = p};
    return nn::RotaryDecoder(c);
  };
  auto run = [&](bool remat) {
    nn::RotaryDecoder model = make(remat, 0.2f);
    model.dropout_step = 3;
    Tape tape;
    Var loss = model.loss(ids, targets, 2, 8);
    tape.backward(loss);
    std::vector<Tensor> out = {loss.value()};
    for (const auto& p : model.params()) out.push_back(p.var.grad());
    return out;
  };
  std::vector<Tensor> plain = run(false), remat = run(true);
  for (std::size_t k = 0; k < plain.size(); ++k) CHECK(max_abs_diff(plain[k], remat[k]) == 0.0f);
  nn::RotaryDecoder dropped = make(false, 0.2f), none = make(false, 0.0f);
  NoGradScope no_grad;
  CHECK(max_abs_diff(dropped.forward(ids, 2, 8).value(), none.forward(ids, 2, 8).value()) > 0.0f);
  dropped.eval();
  CHECK(max_abs_diff(dropped.forward(ids, 2, 8).value(), none.forward(ids, 2, 8).value()) == 0.0f);
}
