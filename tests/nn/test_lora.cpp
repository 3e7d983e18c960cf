// LoRA adapters: the frozen base, gradients by finite differences, merging and their files.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/ops.h"
#include "distributed/data_parallel.h"
#include "io/safetensors.h"
#include "nn/checkpoint.h"
#include "nn/language_model.h"
#include "nn/lora.h"
#include "nn/models/llama.h"
#include "nn/pretrained.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "support/checks.h"
#include "support/small_llama.h"
#include "tokenizers/char_tokenizer.h"

using namespace tapegrad;
using namespace tapegrad::nn;
using test::random_ids;
using test::values;

namespace {

const std::string tiny_llama_folder = std::string(TAPEGRAD_SOURCE_DIR) + "/tests/data/models/tiny_llama";

LanguageModel small_llama(std::uint64_t seed = 3) {
  return LanguageModel(Llama(test::small_llama_config(false, 2, seed)));
}

Tensor logits_of(const LanguageModel& model, std::span<const std::int32_t> ids) {
  NoGradScope no_grad;
  return model.forward(ids, 1, ids.size()).value();
}

// B is zero after add_lora: gives every adapter matrix values, so that the adapters change the output.
void randomise_adapters(LanguageModel& model, float stddev, std::uint64_t seed) {
  Rng rng(seed);
  for (auto& p : model.params())
    if (p.name.find(".lora_") != std::string::npos) rng.fill_normal(p.var.mutable_value(), stddev);
}

std::set<std::string> names_of(const ParameterList& params) {
  std::set<std::string> out;
  for (const auto& p : params) out.insert(p.name);
  return out;
}

// A few AdamW steps on the trainable parameters of model (one fixed batch).
void train_steps(LanguageModel& model, int steps, optim::AdamW& optimizer) {
  const auto ids = random_ids(2 * 12, 11, 1), targets = random_ids(2 * 12, 11, 2);
  for (int step = 0; step < steps; ++step) {
    Tape tape;
    tape.backward(model.loss(ids, targets, 2, 12));
    optim::clip_grad_norm(optimizer.params(), 1.0f);
    optimizer.step();
    optimizer.zero_grad();
  }
}

}  // namespace

TEST_CASE("add_lora freezes the base, adds A and B beside each targeted projection, and leaves the logits as they were") {
  LanguageModel model = small_llama();
  const auto ids = random_ids(10, 11, 4);
  const Tensor before = logits_of(model, ids);
  add_lora(model, {.rank = 2, .alpha = 4, .targets = {"q", "v", "down"}, .seed = 1});
  const ParameterList trainable_params = trainable(model.params());
  CHECK(names_of(trainable_params) ==
        std::set<std::string>{"blocks.0.attn.wq.lora_a", "blocks.0.attn.wq.lora_b", "blocks.0.attn.wv.lora_a",
                              "blocks.0.attn.wv.lora_b", "blocks.0.ffn.w2.lora_a", "blocks.0.ffn.w2.lora_b",
                              "blocks.1.attn.wq.lora_a", "blocks.1.attn.wq.lora_b", "blocks.1.attn.wv.lora_a",
                              "blocks.1.attn.wv.lora_b", "blocks.1.ffn.w2.lora_a", "blocks.1.ffn.w2.lora_b"});
  Llama& llama = *model.as<Llama>();
  const LoraAdapter& q = *llama.blocks[0].wq.adapter;
  CHECK(q.a.shape() == Shape{16, 2});
  CHECK(q.b.shape() == Shape{2, 16});
  CHECK(q.scale() == 2.0f);
  CHECK(llama.blocks[0].w2.adapter->a.shape() == Shape{24, 2});
  CHECK(!llama.blocks[0].wk.adapter);
  // A ~ U(-1/sqrt(in), 1/sqrt(in)) as PEFT's kaiming_uniform_(a = sqrt(5)); B zero.
  float largest = 0, sum = 0;
  for (float a : values(q.a.value())) largest = std::max(largest, std::fabs(a)), sum += std::fabs(a);
  CHECK(largest <= 0.25f);
  CHECK(sum / 32 > 0.05f);  // not all zero: about 0.125 on average
  for (float b : values(q.b.value())) CHECK(b == 0.0f);
  CHECK(values(logits_of(model, ids)) == values(before));
  const auto options = lora_of(model);
  REQUIRE(options);
  CHECK(options->rank == 2);
  CHECK(options->alpha == 4.0f);
  CHECK(options->targets == std::vector<std::string>{"q", "v", "down"});
}

TEST_CASE("a LoRA adapter's gradients pass a finite-difference check, on a Linear and through the whole model") {
  // The layer: y = x W + (alpha / r) (x A) B, W frozen; x, A and B checked, the loss in double.
  test::check_float_op(
      "lora linear",
      [](const std::vector<Var>& in) {
        Rng rng(2);
        Linear layer(5, 4, /*bias=*/true, 0.5f, rng);
        layer.freeze();
        layer.adapter = LoraAdapter{in[1], in[2], 3.0f};
        return layer.forward(in[0]);
      },
      {test::random_tensor({3, 5}, 1), test::random_tensor({5, 2}, 2, 0.5f), test::random_tensor({2, 4}, 3, 0.5f)});
  // The model: every adapter of every target, on a frozen Llama.
  LanguageModel model(Llama(test::gradcheck_llama_config(1)));
  Rng rng(3);
  for (auto& p : model.params())
    if (p.var.shape().size() == 2) rng.fill_normal(p.var.mutable_value(), 0.5f);
  add_lora(model, {.rank = 2, .alpha = 2, .targets = {"q", "k", "v", "o", "gate", "up", "down"}, .seed = 4});
  randomise_adapters(model, 0.5f, 5);
  const auto ids = random_ids(2 * 5, 7, 4), targets = random_ids(2 * 5, 7, 5);
  {
    Tape tape;
    tape.backward(model.loss(ids, targets, 2, 5));
  }
  for (NamedParameter& p : model.params()) {
    Var& var = p.var;
    if (!var.requires_grad()) {
      CHECK_MESSAGE(!var.has_grad(), p.name, " is frozen but got a gradient");
      continue;
    }
    std::vector<float> x = values(var.value());
    std::vector<float> analytic(var.grad().data(), var.grad().data() + x.size());
    auto forward = [&] {
      std::copy(x.begin(), x.end(), var.node().value.data());
      NoGradScope no_grad;
      return std::vector<float>{model.loss(ids, targets, 2, 5).value().item()};
    };
    GradcheckReport r = check_kernel_gradient<float>(p.name, x, forward, {1.0f}, analytic, test::kFloatEps,
                                                     test::kFloatAtol, test::kFloatRtol);
    std::copy(x.begin(), x.end(), var.node().value.data());
    CHECK_MESSAGE(r.ok, r.message);
  }
}

TEST_CASE("training a LoRA model leaves the frozen base bit for bit as it was, with no gradient and no optimizer state") {
  LanguageModel model = small_llama();
  add_lora(model, {.rank = 2, .alpha = 4, .targets = {"q", "k", "v", "o", "gate", "up", "down"}, .seed = 1});
  std::map<std::string, std::vector<float>> base;
  for (const auto& p : model.params())
    if (!p.var.requires_grad()) base[p.name] = values(p.var.value());
  CHECK(base.size() == 2 * 9 + 3);  // per block 2 norms + 7 projections; embedding, final norm, head
  optim::AdamW optimizer(trainable(model.params()), {.lr = 1e-2f});
  train_steps(model, 5, optimizer);
  for (const auto& p : model.params()) {
    if (p.var.requires_grad()) continue;
    CHECK_MESSAGE(values(p.var.value()) == base.at(p.name), p.name, " changed");
    CHECK_MESSAGE(!p.var.has_grad(), p.name, " has a gradient buffer");
  }
  std::size_t lora_b_moved = 0;
  for (const auto& p : model.params())
    if (p.name.ends_with("lora_b"))
      for (float b : values(p.var.value())) lora_b_moved += b != 0.0f;
  CHECK(lora_b_moved > 0);
  const optim::OptimizerState state = optimizer.state();
  CHECK(state.tensors.size() == 2 * 2 * 7 * 2);  // m and v of A and B of 7 projections in 2 blocks
  for (const auto& t : state.tensors) CHECK_MESSAGE(t.name.find(".lora_") != std::string::npos, t.name);
  // What sees the parameters refuses the frozen ones rather than keep state for them.
  CHECK(test::contains(test::error_of([&] { optim::AdamW all(model.params()); }),
                       "AdamW: parameter 'embed.weight' (index 0) is frozen (requires_grad false)"));
  CHECK(test::contains(test::error_of([&] { distributed::GradientBuckets buckets(model.params()); }),
                       "GradientBuckets: parameter 'embed.weight' is frozen"));
}

TEST_CASE("decoding through the KV cache applies the adapters as the tape's forward does, remat included") {
  LanguageModel model = small_llama();
  add_lora(model, {.rank = 3, .alpha = 6, .targets = {"q", "k", "v", "o", "gate", "up", "down"}, .seed = 1});
  randomise_adapters(model, 0.3f, 2);
  const auto ids = random_ids(12, 11, 7);
  const Tensor full = logits_of(model, ids);
  KVCache cache = model.make_cache();
  const Tensor prefilled = model.prefill(std::span(ids).first(8), cache);
  for (std::size_t i = 0; i < prefilled.size(); ++i)
    CHECK(std::fabs(prefilled[i] - full[i]) <= 1e-5f * std::max(1.0f, std::fabs(full[i])));
  for (std::size_t t = 8; t < ids.size(); ++t) {
    std::span<const float> row = model.step(ids[t], cache);
    for (std::size_t v = 0; v < 11; ++v)
      CHECK(std::fabs(row[v] - full[t * 11 + v]) <= 1e-5f * std::max(1.0f, std::fabs(full[t * 11 + v])));
  }
  // Remat re-runs each block, the adapters with it: the same gradients, bit for bit.
  LlamaConfig c = model.as<Llama>()->config();
  c.remat = true;
  LanguageModel remat((Llama(c)));
  add_lora(remat, {.rank = 3, .alpha = 6, .targets = {"q", "k", "v", "o", "gate", "up", "down"}, .seed = 1});
  randomise_adapters(remat, 0.3f, 2);
  const auto targets = random_ids(12, 11, 8);
  for (LanguageModel* m : {&model, &remat}) {
    Tape tape;
    tape.backward(m->loss(ids, targets, 1, 12));
  }
  const ParameterList a = trainable(model.params()), b = trainable(remat.params());
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK_MESSAGE(values(a[i].var.grad()) == values(b[i].var.grad()), a[i].name);
}

TEST_CASE("merge_lora folds the adapters into the weights: the logits equal the adapted model's within rounding") {
  LanguageModel model = small_llama();
  add_lora(model, {.rank = 2, .alpha = 4, .targets = {"q", "k", "v", "o", "gate", "up", "down"}, .seed = 1});
  randomise_adapters(model, 0.3f, 2);
  const auto ids = random_ids(12, 11, 7);
  const Tensor adapted = logits_of(model, ids), base_logits = logits_of(small_llama(), ids);
  CHECK(merge_lora(model) == 14);
  CHECK(!lora_of(model));
  CHECK(trainable(model.params()).empty());  // the merged weights stay frozen
  const Tensor merged = logits_of(model, ids);
  CHECK(max_abs_diff(merged, adapted) <= 1e-5f);
  CHECK(max_abs_diff(merged, base_logits) > 1e-2f);  // the adapters did change the model
}

TEST_CASE("a checkpoint of a LoRA model holds the base and the adapters and loads to bit-identical logits") {
  LanguageModel model = small_llama();
  add_lora(model, {.rank = 2, .alpha = 3, .targets = {"v", "up"}, .seed = 1});
  randomise_adapters(model, 0.3f, 2);
  const std::string path = test::process_path("lora_checkpoint.safetensors");
  save_model_checkpoint(path, model, tokenizers::CharTokenizer::from_vocab("abcdefghijk"));
  const SafetensorsFile file = read_safetensors(path);
  CHECK(file.metadata.at("lora.rank") == "2");
  CHECK(file.metadata.at("lora.alpha") == "3");
  CHECK(file.metadata.at("lora.targets") == "v,up");
  CHECK(file.tensors.count("blocks.1.ffn.w3.lora_b") == 1);
  LoadedModelCheckpoint loaded = load_model_checkpoint(path);
  CHECK(names_of(trainable(loaded.model.params())) == names_of(trainable(model.params())));
  const auto ids = random_ids(9, 11, 3);
  CHECK(values(logits_of(loaded.model, ids)) == values(logits_of(model, ids)));
  std::filesystem::remove(path);
}

TEST_CASE("a PEFT adapter folder written and read back gives bit-identical logits on the tiny Hugging Face Llama") {
  PretrainedModel tuned = load_pretrained(tiny_llama_folder);
  add_lora(tuned.model, {.rank = 4, .alpha = 8, .targets = {"q", "k", "o", "down"}, .seed = 7});
  randomise_adapters(tuned.model, 0.2f, 8);
  const std::string folder = test::process_path("lora_peft_adapter");
  save_peft_adapter(folder, tuned.model, "tests/data/models/tiny_llama");
  const SafetensorsFile file = read_safetensors(folder + "/adapter_model.safetensors");
  CHECK(file.tensors.size() == 2 * 4 * 2);
  CHECK(file.tensors.at("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight").shape() == Shape{16, 4});
  CHECK(file.tensors.at("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight").shape() == Shape{4, 64});
  PretrainedModel reloaded = load_pretrained(tiny_llama_folder);
  const LoraOptions options = load_peft_adapter(folder, reloaded.model);
  CHECK(options.rank == 4);
  CHECK(options.alpha == 8.0f);
  CHECK(options.targets == std::vector<std::string>{"q", "k", "o", "down"});
  const auto ids = random_ids(10, 320, 3);
  CHECK(values(logits_of(reloaded.model, ids)) == values(logits_of(tuned.model, ids)));
  std::filesystem::remove_all(folder);
}

TEST_CASE("the peft package loads a saved adapter onto the tiny Hugging Face Llama to tapegrad's logits within 1e-5") {
  const std::string python = test::bench_python("peft, transformers");
  if (python.empty()) return;
  PretrainedModel tuned = load_pretrained(tiny_llama_folder);
  add_lora(tuned.model, {.rank = 4, .alpha = 8, .targets = {"q", "k", "v", "o", "gate", "up", "down"}, .seed = 7});
  randomise_adapters(tuned.model, 0.2f, 8);
  const std::string folder = test::process_path("lora_peft_check");
  save_peft_adapter(folder, tuned.model, tiny_llama_folder);
  const std::vector<std::int32_t> ids = {1, 57, 12, 300, 5, 88, 19, 240};
  Tensor logits = logits_of(tuned.model, ids);
  write_safetensors(folder + "/tapegrad_logits.safetensors", {{"logits", &logits}},
                    {{"ids", "1,57,12,300,5,88,19,240"}});
  const std::string out = folder + "/peft.txt";
  const std::string command = fmt::format("OMP_NUM_THREADS=1 '{}' '{}/tests/data/check_peft_adapter.py' '{}' '{}' '{}' > '{}' 2>&1",
                                          python, TAPEGRAD_SOURCE_DIR, tiny_llama_folder, folder,
                                          folder + "/tapegrad_logits.safetensors", out);
  const int status = std::system(command.c_str());
  const std::string report = test::slurp(out);
  CHECK_MESSAGE(status == 0, report);
  MESSAGE(report.substr(report.rfind("max |peft")));
  std::filesystem::remove_all(folder);
}

TEST_CASE("LoRA refuses bad options and PEFT configurations it does not apply, naming the value") {
  LanguageModel model = small_llama();
  CHECK(test::error_of([&] { add_lora(model, {.rank = 0}); }) == "LoRA: the rank must be at least 1");
  CHECK(test::error_of([&] { add_lora(model, {.rank = 2, .alpha = -1}); }) ==
        "LoRA: alpha must be a positive number, got -1");
  CHECK(test::error_of([&] { add_lora(model, {.targets = {"q", "qkv"}}); }) ==
        "LoRA: unknown target 'qkv'; the targets are q,k,v,o,gate,up,down");
  CHECK(test::error_of([&] { add_lora(model, {.targets = {"q", "q"}}); }) == "LoRA: target 'q' is given twice");
  CHECK(test::error_of([&] { add_lora(model, {.rank = 9, .targets = {"k"}}); }) ==
        "LoRA: rank 9 exceeds the smaller side of blocks.0.attn.wk (16 x 8)");
  CHECK(trainable(model.params()).size() == model.params().size());  // refused before anything changed
  add_lora(model, {.rank = 2});
  CHECK(test::error_of([&] { add_lora(model, {.rank = 2}); }) ==
        "LoRA: blocks.0.attn.wq has an adapter already (merge_lora it first)");

  PretrainedModel tuned = load_pretrained(tiny_llama_folder);
  add_lora(tuned.model, {.rank = 2});
  const std::string folder = test::process_path("lora_refused");
  save_peft_adapter(folder, tuned.model, "base");
  const std::string config_path = folder + "/adapter_config.json";
  const std::string config = test::slurp(config_path);
  auto refusal = [&](const std::string& from, const std::string& to) {
    std::string forged = config;
    REQUIRE(forged.find(from) != std::string::npos);
    forged.replace(forged.find(from), from.size(), to);
    std::ofstream(config_path, std::ios::binary | std::ios::trunc) << forged;
    PretrainedModel base = load_pretrained(tiny_llama_folder);
    std::string error = test::error_of([&] { load_peft_adapter(folder, base.model); });
    CHECK(trainable(base.model.params()).size() == base.model.params().size());  // left as it was
    return error;
  };
  CHECK(refusal("\"use_dora\": false", "\"use_dora\": true") ==
        config_path + ": 'use_dora' is true; DoRA is not applied by tapegrad");
  CHECK(refusal("\"peft_type\": \"LORA\"", "\"peft_type\": \"IA3\"") ==
        config_path + ": 'peft_type' is \"IA3\"; only LORA adapters are read");
  CHECK(refusal("\"q_proj\"", "\"lm_head\"") ==
        config_path +
            ": 'target_modules' names \"lm_head\"; the modules tapegrad adapts are q_proj, k_proj, v_proj, o_proj, "
            "gate_proj, up_proj, down_proj");
  CHECK(refusal("\"r\": 2", "\"r\": 3") ==
        folder + "/adapter_model.safetensors: tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' "
                 "has shape [2, 32]; r 3 and the base model make it [3, 32]");
  CHECK(refusal("\"v_proj\"", "\"k_proj\"") ==
        folder + "/adapter_model.safetensors: tensor 'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight' "
                 "is missing");
  std::filesystem::remove_all(folder);
}
