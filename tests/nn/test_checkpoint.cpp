// Checkpoints of every architecture: round trips, training extras, older files' names and the
// errors for damaged or foreign files.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "io/safetensors.h"
#include "nn/checkpoint.h"
#include "nn/generate.h"
#include "nn/language_model.h"
#include "nn/models/gpt2.h"
#include "nn/models/rotary_decoder.h"
#include "support/helpers.h"

using namespace tapegrad;
using namespace tapegrad::nn;

namespace {
std::string temp_path(const std::string& name) { return test::process_path("checkpoint_" + name); }

// Rewrites a checkpoint with one change, to forge a consistent file with bad content.
void rewrite(const std::string& from, const std::string& to,
             const std::function<void(std::map<std::string, Tensor>&, std::map<std::string, std::string>&)>& edit) {
  SafetensorsFile f = read_safetensors(from);
  edit(f.tensors, f.metadata);
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (auto& [name, t] : f.tensors) tensors.emplace_back(name, &t);
  write_safetensors(to, tensors, f.metadata);
}
}  // namespace

TEST_CASE("a checkpoint round-trips the model, its vocabulary and its hyperparameters") {
  tokenizers::CharTokenizer tok = tokenizers::CharTokenizer::from_text("hello wörld");
  RotaryDecoder model = rotary_decoder(tok.size(), 16, 2, 2, 24, 40, false, 3);
  std::string path = temp_path("round_trip.safetensors");
  save_model_checkpoint(path, LanguageModel(model), tok);
  LoadedModelCheckpoint loaded = load_model_checkpoint(path);
  CHECK(loaded.char_tokenizer().vocab() == tok.vocab());
  REQUIRE(loaded.model.as<RotaryDecoder>() != nullptr);
  CHECK(loaded.model.as<RotaryDecoder>()->config().ffn_dim() == 40);
  CHECK(loaded.model.config().max_len == 24);
  CHECK(loaded.metadata.at("arch") == "rotary");
  auto a = model.params(), b = loaded.model.params();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(max_abs_diff(a[i].var.value(), b[i].var.value()) == 0.0f);
  CHECK(loaded.metadata.at("format_version") == "1");
  CHECK(loaded.metadata.at("vocab") == tok.vocab());
  CHECK(loaded.metadata.at("norm_eps") == "1e-05");
  std::vector<std::int32_t> prompt = tok.encode("he");
  GenerateOptions options{.max_new = 10, .seed = 4};
  CHECK(generate(model, prompt, options).tokens == generate(loaded.model, prompt, options).tokens);
  CHECK(load_model_checkpoint(path, /*remat=*/true).model.as<RotaryDecoder>()->config().remat);
}

TEST_CASE("a gpt2 checkpoint of 0.2, its blocks' members named ln1, ln2 and mlp, loads under today's names") {
  tokenizers::CharTokenizer tok = tokenizers::CharTokenizer::from_text("abcdef");
  Gpt2 model = gpt2(tok.size(), 8, 2, 2, 8, std::nullopt, 0, false, 5);
  Tensor moment({8}, 0.25f);
  const std::string today = temp_path("gpt2_today.safetensors"), of_0_2 = temp_path("gpt2_0_2.safetensors");
  save_model_checkpoint(today, LanguageModel(model), tok, {{{"optim.blocks.1.ffn_norm.bias.m", &moment}}, {}});
  // The names Gpt2Block::members gave before 0.3.
  auto name_of_0_2 = [](std::string name) {
    for (auto [now, then] : {std::pair{".attn_norm.", ".ln1."}, {".ffn_norm.", ".ln2."}, {".ffn.", ".mlp."}})
      if (std::size_t at = name.find(now); at != std::string::npos) name.replace(at, std::string(now).size(), then);
    return name;
  };
  rewrite(today, of_0_2, [&](std::map<std::string, Tensor>& tensors, std::map<std::string, std::string>&) {
    std::map<std::string, Tensor> renamed;
    for (auto& [name, tensor] : tensors) renamed.emplace(name_of_0_2(name), std::move(tensor));
    tensors = std::move(renamed);
  });
  const SafetensorsFile file = read_safetensors(of_0_2);
  REQUIRE(file.tensors.count("blocks.0.ln1.weight") == 1);
  REQUIRE(file.tensors.count("blocks.1.mlp.w2.bias") == 1);
  REQUIRE(file.tensors.count("optim.blocks.1.ln2.bias.m") == 1);

  LoadedModelCheckpoint loaded = load_model_checkpoint(of_0_2);
  auto a = model.params(), b = loaded.model.params();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].name == b[i].name);
    CHECK(max_abs_diff(a[i].var.value(), b[i].var.value()) == 0.0f);
  }
  CHECK(loaded.extra_tensors.at("optim.blocks.1.ffn_norm.bias.m").at({3}) == 0.25f);
  std::vector<std::int32_t> ids = tok.encode("abcfed");
  CHECK(max_abs_diff(model.forward(ids, 1, ids.size()).value(), loaded.model.forward(ids, 1, ids.size()).value()) == 0.0f);

  const std::string both = temp_path("gpt2_both_names.safetensors");
  rewrite(today, both, [](std::map<std::string, Tensor>& tensors, std::map<std::string, std::string>&) {
    tensors.emplace("blocks.0.ln1.weight", tensors.at("blocks.0.attn_norm.weight"));
  });
  CHECK(test::contains(test::error_of([&] { load_model_checkpoint(both); }),
                       "two tensors read as 'blocks.0.attn_norm.weight' (one of them under a former name)"));
}

TEST_CASE("training extras travel under optim. names and in the metadata") {
  tokenizers::CharTokenizer tok = tokenizers::CharTokenizer::from_text("abc");
  RotaryDecoder model = rotary_decoder(3, 8, 2, 1, 8);
  Tensor m({8, 8}, 0.5f);
  std::string path = temp_path("extras.safetensors");
  save_model_checkpoint(path, LanguageModel(model), tok, {{{"optim.embed.weight.m", &m}}, {{"step", "12"}}});
  LoadedModelCheckpoint loaded = load_model_checkpoint(path);
  CHECK(loaded.metadata.at("step") == "12");
  CHECK(loaded.extra_tensors.at("optim.embed.weight.m").at({1, 1}) == 0.5f);
  const LanguageModel held(model);
  CHECK(test::error_of([&] { save_model_checkpoint(path, held, tok, {{{"embed.m", &m}}, {}}); }) ==
        path + ": extra tensor 'embed.m' must be named optim.*");
  CHECK(test::error_of([&] { save_model_checkpoint(path, held, tok, {{}, {{"d_model", "9"}}}); }) ==
        path + ": metadata key 'd_model' is reserved");
}

TEST_CASE("checkpoints whose content disagrees with their metadata are refused, naming the file") {
  tokenizers::CharTokenizer tok = tokenizers::CharTokenizer::from_text("abcd");
  RotaryDecoder model = rotary_decoder(4, 8, 2, 1, 8);
  std::string good = temp_path("good.safetensors"), bad = temp_path("bad.safetensors");
  save_model_checkpoint(good, LanguageModel(model), tok);
  auto refused = [&](auto edit) {
    rewrite(good, bad, edit);
    return test::error_of([&] { load_model_checkpoint(bad); });
  };
  using T = std::map<std::string, Tensor>;
  using M = std::map<std::string, std::string>;
  CHECK(refused([](T&, M& m) { m.erase("n_heads"); }) == bad + ": metadata key 'n_heads' is missing");
  CHECK(refused([](T&, M& m) { m["d_model"] = "8x"; }) == bad + ": metadata 'd_model' = '8x' is not an integer in [0, 2147483648]");
  CHECK(refused([](T&, M& m) { m["d_model"] = "16"; }) ==
        bad + ": the metadata describes 2740 parameters but the file holds 1116 values");
  // Sizes far past the file's tensors fail as the model is built, before a large allocation
  // (d_model 10^6 would ask for 4 TB per projection).
  CHECK(test::contains(refused([](T&, M& m) { m["d_model"] = "1000000"; }),
                       "the sizes in the metadata describe a model larger than the file's tensors"));
  CHECK(test::contains(refused([](T&, M& m) { m["n_heads"] = "3"; }), "d_model 8 is not divisible by n_heads 3"));
  // Found by fuzzing: a forged max_len would size the RoPE table in gigabytes.
  CHECK(test::contains(refused([](T&, M& m) { m["max_len"] = "2147483648"; }), "max_len 2147483648 exceeds the supported"));
  CHECK(refused([](T&, M& m) { m["vocab"] = "abc"; }) == bad + ": the vocabulary has 3 characters but vocab_size is 4");
  CHECK(refused([](T&, M& m) { m["norm_eps"] = "-1"; }) == bad + ": metadata 'norm_eps' = '-1' is not a positive number");
  CHECK(refused([](T&, M& m) { m["format_version"] = "7"; }) ==
        bad + ": format_version '7' is not supported (this build reads '1')");
  CHECK(refused([](T& t, M&) { t.erase("head.bias"); t["optim.pad"] = Tensor({4}); }) == bad + ": tensor 'head.bias' is missing");
  CHECK(refused([](T& t, M&) { t["head.bias"] = Tensor({2, 2}); }) ==
        bad + ": tensor 'head.bias' has shape [2, 2] but the metadata implies [4]");
  CHECK(refused([](T& t, M&) { t["extra.weight"] = Tensor({1}); }) == bad + ": tensor 'extra.weight' is not a parameter of this model");
}

TEST_CASE("a file without the arch key (0.1's) is refused naming the file and how to convert it; an unknown arch too") {
  tokenizers::CharTokenizer tok = tokenizers::CharTokenizer::from_text("abcd");
  RotaryDecoder model = rotary_decoder(4, 8, 2, 1, 8);
  std::string with_arch = temp_path("with_arch.safetensors"), without = temp_path("without_arch.safetensors");
  save_model_checkpoint(with_arch, LanguageModel(model), tok);
  CHECK(read_safetensors(with_arch).metadata.at("arch") == "rotary");
  rewrite(with_arch, without, [](std::map<std::string, Tensor>&, std::map<std::string, std::string>& m) { m.erase("arch"); });
  CHECK(test::error_of([&] { load_model_checkpoint(without); }) ==
        without + ": metadata has no 'arch': a checkpoint of tapegrad 0.1, which 0.3 no longer reads; load it with "
                  "tapegrad 0.2 (load_model_checkpoint, or generate/train --resume) and save it again "
                  "(save_model_checkpoint, train), which writes 'arch'");
  rewrite(with_arch, without, [](std::map<std::string, Tensor>&, std::map<std::string, std::string>& m) { m["arch"] = "mamba"; });
  CHECK(test::contains(test::error_of([&] { load_model_checkpoint(without); }),
                       without + ": metadata arch 'mamba' is not a registered architecture (registered: rotary, gpt2, llama"));
}

// What 0.1's rotary-only load_checkpoint gave, through the general API that replaced it in 0.3.
TEST_CASE("a rotary decoder's checkpoint loads as one with its character vocabulary; another arch is no rotary decoder") {
  tokenizers::CharTokenizer tok = tokenizers::CharTokenizer::from_text("abcd");
  RotaryDecoder model = rotary_decoder(4, 8, 2, 1, 8);
  const std::string rotary_file = temp_path("rotary_api.safetensors"), gpt2_file = temp_path("gpt2_api.safetensors");
  save_model_checkpoint(rotary_file, LanguageModel(model), tok);
  LoadedModelCheckpoint loaded = load_model_checkpoint(rotary_file);
  REQUIRE(loaded.model.as<RotaryDecoder>() != nullptr);
  CHECK(loaded.char_tokenizer().vocab() == tok.vocab());
  auto a = model.params(), b = loaded.model.as<RotaryDecoder>()->params();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(max_abs_diff(a[i].var.value(), b[i].var.value()) == 0.0f);
  save_model_checkpoint(gpt2_file, LanguageModel(gpt2(4, 8, 2, 1, 8)), tok);
  CHECK(load_model_checkpoint(gpt2_file).model.as<RotaryDecoder>() == nullptr);
}

TEST_CASE("a checkpoint holding NaN or infinity, in a weight or the optimizer state, is refused naming the tensor and element") {
  tokenizers::CharTokenizer tok = tokenizers::CharTokenizer::from_text("abcd");
  RotaryDecoder model = rotary_decoder(4, 8, 2, 1, 8);
  std::string good = temp_path("finite.safetensors"), bad = temp_path("nonfinite.safetensors");
  Tensor moment({4}, 0.5f);
  save_model_checkpoint(good, LanguageModel(model), tok, {.tensors = {{"optim.head.bias.m", &moment}}});
  auto refused = [&](auto edit) {
    rewrite(good, bad, edit);
    return test::error_of([&] { load_model_checkpoint(bad); });
  };
  using T = std::map<std::string, Tensor>;
  using M = std::map<std::string, std::string>;
  const std::string why = " (weights and optimizer state must be finite numbers)";
  CHECK(refused([](T& t, M&) { t["blocks.0.attn.wq.weight"][5] = std::nanf(""); }) ==
        bad + ": tensor 'blocks.0.attn.wq.weight' holds nan at element 5" + why);
  CHECK(refused([](T& t, M&) { t["head.bias"][3] = -INFINITY; }) == bad + ": tensor 'head.bias' holds -inf at element 3" + why);
  CHECK(refused([](T& t, M&) { t["optim.head.bias.m"][0] = INFINITY; }) ==
        bad + ": tensor 'optim.head.bias.m' holds inf at element 0" + why);
  CHECK(load_model_checkpoint(good).extra_tensors.count("optim.head.bias.m") == 1);
}

TEST_CASE("a gpt2 checkpoint round-trips through load_model_checkpoint, and its bad metadata is refused naming the file") {
  tokenizers::CharTokenizer tok = tokenizers::CharTokenizer::from_text("abcd");
  std::string good = temp_path("gpt2.safetensors"), bad = temp_path("gpt2_bad.safetensors");
  save_model_checkpoint(good, LanguageModel(gpt2(4, 8, 2, 1, 8)), tok);  // dropout 0 is written as "0"
  LoadedModelCheckpoint loaded = load_model_checkpoint(good);
  REQUIRE(loaded.model.as<Gpt2>() != nullptr);
  CHECK(loaded.model.as<Gpt2>()->config().dropout == 0.0f);
  auto refused = [&](auto edit) {
    rewrite(good, bad, edit);
    return test::error_of([&] { load_model_checkpoint(bad); });
  };
  using T = std::map<std::string, Tensor>;
  using M = std::map<std::string, std::string>;
  CHECK(refused([](T&, M& m) { m.erase("n_heads"); }) == bad + ": metadata key 'n_heads' is missing");
  CHECK(refused([](T&, M& m) { m["d_model"] = "8x"; }) == bad + ": metadata 'd_model' = '8x' is not an integer in [0, 2147483648]");
  CHECK(refused([](T&, M& m) { m["norm_eps"] = "0"; }) == bad + ": metadata 'norm_eps' = '0' is not a positive number");
  CHECK(refused([](T&, M& m) { m["dropout"] = "1"; }) == bad + ": metadata 'dropout' = '1' is not a number in [0, 1)");
  rewrite(good, bad, [](T&, M& m) { m["dropout"] = "0.25"; });
  CHECK(load_model_checkpoint(bad).model.as<Gpt2>()->config().dropout == 0.25f);
}

TEST_CASE("a model with dropout keeps its seed, the root of its dropout streams, through a checkpoint") {
  tokenizers::CharTokenizer tok = tokenizers::CharTokenizer::from_text("abcd");
  const std::string path = temp_path("dropout_seed.safetensors"), bad = temp_path("dropout_seed_bad.safetensors");
  Gpt2Config config{.vocab = 4, .d_model = 8, .n_heads = 2, .n_blocks = 1, .max_len = 8};
  config.dropout = 0.1f;
  config.seed = 0xfedcba9876543210;  // above 2^63: the whole range of a seed
  save_model_checkpoint(path, LanguageModel(Gpt2(config)), tok);
  CHECK(load_model_checkpoint(path).model.as<Gpt2>()->config().seed == 0xfedcba9876543210);
  // Without dropout the seed drew only the initial weights, which the file holds: not recorded.
  config.dropout = 0;
  save_model_checkpoint(path, LanguageModel(Gpt2(config)), tok);
  CHECK(read_safetensors(path).metadata.count("dropout_seed") == 0);
  config.dropout = 0.1f;
  save_model_checkpoint(path, LanguageModel(Gpt2(config)), tok);
  rewrite(path, bad, [](std::map<std::string, Tensor>&, std::map<std::string, std::string>& m) { m["dropout_seed"] = "-1"; });
  CHECK(test::error_of([&] { load_model_checkpoint(bad); }) ==
        bad + ": metadata 'dropout_seed' = '-1' is not an unsigned 64-bit integer");
}
