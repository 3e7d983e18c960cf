// End-to-end tests of LoRA in the programs: generate and evaluate with --lora DIR on top of the
// committed tiny Llama (tests/data/models/tiny_llama), and the server's loader with an adapter.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/random.h"
#include "core/tape.h"
#include "io/safetensors.h"
#include "nn/checkpoint.h"
#include "nn/generate.h"
#include "nn/lora.h"
#include "nn/pretrained.h"
#include "serve/weights.h"
#include "support/helpers.h"
#include "support/programs.h"

using namespace tapegrad;
using namespace tapegrad::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const fs::path tiny_llama_dir = fs::path(TAPEGRAD_SOURCE_DIR) / "tests" / "data" / "models" / "tiny_llama";

/// An adapter folder for the tiny Llama whose adapters change its output (B given values).
fs::path write_adapter(const std::string& name) {
  nn::PretrainedModel tuned = nn::load_pretrained(tiny_llama_dir.string());
  nn::add_lora(tuned.model, {.rank = 4, .alpha = 8, .targets = {"q", "v", "up"}, .seed = 3});
  Rng rng(4);
  for (auto& p : tuned.model.params())
    if (p.name.ends_with(".lora_b")) rng.fill_normal(p.var.mutable_value(), 0.5f);
  const fs::path folder = work_dir(name) / "adapter";
  nn::save_peft_adapter(folder.string(), tuned.model, tiny_llama_dir.string());
  return folder;
}

}  // namespace

TEST_CASE("generate and evaluate --lora DIR apply a PEFT adapter on top of --model as the library does") {
  const fs::path adapter = write_adapter("lora_programs");
  nn::PretrainedModel model = nn::load_pretrained(tiny_llama_dir.string());
  nn::load_peft_adapter(adapter.string(), model.model);
  model.model.set_training(false);
  const std::string prompt = "The cat";
  nn::GenerateOptions options{.max_new = 16, .sampling = {.temperature = 1.0f}, .seed = 5};
  const nn::Generation expected = nn::generate(model.model, model.tokenizer->encode(prompt), options);
  const std::vector<std::string> args = {"--model", tiny_llama_dir.string(), "--prompt", prompt, "--max-new", "16",
                                         "--temperature", "1", "--seed", "5", "--ignore-eos", "--jsonl"};
  Result adapted = run("generate", args + std::vector<std::string>{"--lora", adapter.string()});
  REQUIRE_MESSAGE(adapted.status == 0, adapted.err);
  CHECK(json::parse(adapted.out)["ids"].get<std::vector<std::int32_t>>() == expected.tokens);
  Result plain = run("generate", args);
  REQUIRE_MESSAGE(plain.status == 0, plain.err);
  CHECK(json::parse(plain.out)["ids"] != json::parse(adapted.out)["ids"]);  // the adapter changes the model

  const fs::path text = adapter.parent_path() / "text.txt";
  std::ofstream(text) << "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!\n";
  std::vector<std::int32_t> ids = model.tokenizer->encode(read_bytes(text));
  ids.resize(17);
  double loss = 0;
  {
    NoGradScope no_grad;
    const std::vector<std::int32_t> inputs(ids.begin(), ids.end() - 1), targets(ids.begin() + 1, ids.end());
    loss = model.model.loss(inputs, targets, 1, 16).value().item();
  }
  Result evaluated = run("evaluate", {"--model", tiny_llama_dir.string(), "--lora", adapter.string(), "--data",
                                      text.string(), "--limit", "17", "--window", "16"});
  REQUIRE_MESSAGE(evaluated.status == 0, evaluated.err);
  CHECK(json::parse(evaluated.out)["loss"].get<double>() == doctest::Approx(loss).epsilon(1e-5));

  Result missing = run("generate", {"--model", tiny_llama_dir.string(), "--lora", "no_such_adapter", "--prompt", "a"});
  CHECK(missing.status != 0);
  CHECK(one_error_line(missing, "generate"));
  CHECK(contains(missing.err, "no_such_adapter/adapter_config.json: cannot open the file"));
}

TEST_CASE("the server's loader applies --lora on top of a model, and the adapter is part of the fingerprint") {
  const fs::path adapter = write_adapter("lora_serve");
  auto plain = serve::load_pretrained_weights(tiny_llama_dir.string());
  auto adapted = serve::load_pretrained_weights(tiny_llama_dir.string(), "", adapter.string());
  CHECK(plain->fingerprint != adapted->fingerprint);
  nn::PretrainedModel model = nn::load_pretrained(tiny_llama_dir.string());
  nn::load_peft_adapter(adapter.string(), model.model);
  const std::vector<std::int32_t> ids = {1, 40, 7, 99};
  NoGradScope no_grad;
  const Tensor expected = model.model.forward(ids, 1, ids.size()).value();
  const Tensor got = adapted->model.forward(ids, 1, ids.size()).value();
  CHECK(std::vector<float>(got.data(), got.data() + got.size()) ==
        std::vector<float>(expected.data(), expected.data() + expected.size()));
}

TEST_CASE("train --init --lora trains adapters on a frozen base, resumes bit-identically and writes PEFT's files") {
  const fs::path dir = work_dir("lora_train"), data = write_corpus(dir);
  auto args = [&](const fs::path& out, int steps) {
    return std::vector<std::string>{"--init", tiny_llama_dir.string(), "--data", data.string(), "--out", out.string(),
                                    "--seq", "16", "--batch", "2", "--threads", "1", "--eval-batches", "1",
                                    "--eval-every", "2", "--save-every", "2", "--lr", "1e-2", "--decay-steps", "4",
                                    "--steps", std::to_string(steps), "--lora", "2", "--lora-alpha", "4",
                                    "--lora-targets", "q,v,down"};
  };
  const fs::path straight = dir / "straight.safetensors", halves = dir / "halves.safetensors";
  Result first = run("train", args(straight, 4));
  REQUIRE_MESSAGE(first.status == 0, first.err);
  CHECK(contains(first.out, "LoRA: rank 2, alpha 4 on q,v,down of every block"));
  REQUIRE(run("train", args(halves, 2)).status == 0);
  std::vector<std::string> resume = args(halves, 4);
  resume.erase(resume.begin(), resume.begin() + 2);  // --resume holds the model: no --init
  Result resumed = run("train", resume + std::vector<std::string>{"--resume", halves.string()});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  check_same_tensors(straight, halves);

  // The base is the published model bit for bit; the optimizer state is the adapters' alone.
  const SafetensorsFile file = read_safetensors(straight.string());
  nn::PretrainedModel base = nn::load_pretrained(tiny_llama_dir.string());
  for (const auto& p : base.model.params()) {
    const Tensor& saved = file.tensors.at(p.name);
    CHECK_MESSAGE(std::memcmp(saved.data(), p.var.value().data(), saved.bytes()) == 0, p.name, " changed");
  }
  for (const auto& [name, tensor] : file.tensors)
    if (name.starts_with("optim.")) CHECK_MESSAGE(contains(name, ".lora_"), name);
  CHECK(file.metadata.at("lora.targets") == "q,v,down");

  // <out>.lora/ loads with PEFT's names onto the base to the checkpoint's logits.
  nn::load_peft_adapter((dir / "straight.lora").string(), base.model);
  nn::LoadedModelCheckpoint trained = nn::load_model_checkpoint(straight.string());
  const std::vector<std::int32_t> ids = {1, 40, 7, 99, 3};
  NoGradScope no_grad;
  const Tensor a = base.model.forward(ids, 1, ids.size()).value(), b = trained.model.forward(ids, 1, ids.size()).value();
  CHECK(std::memcmp(a.data(), b.data(), a.bytes()) == 0);

  Result no_init = run("train", {"--data", data.string(), "--out", (dir / "x.safetensors").string(), "--lora", "2"});
  CHECK(no_init.status == 2);
  CHECK(contains(no_init.err, "--lora adapts a model: give --init"));
  std::vector<std::string> bad_targets = args(dir / "y.safetensors", 1);
  bad_targets.back() = "q,qkv";  // the value of --lora-targets
  Result bad_target = run("train", bad_targets);
  CHECK(bad_target.status == 2);
  CHECK(contains(bad_target.err, "unknown target 'qkv'"));
}
