// End-to-end tests of the programs on published models (--model): tokenize, generate (plain,
// --chat, --jsonl, --ignore-eos) and evaluate, run as built on the committed tiny Llama
// (tests/data/models/tiny_llama, a Hugging Face folder and GGUF files of the same weights).
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/tape.h"
#include "nn/checkpoint.h"
#include "nn/generate.h"
#include "nn/pretrained.h"
#include "support/helpers.h"
#include "support/programs.h"
#include "tokenizers/chat_template.h"
#include "tokenizers/utf8_stream.h"

using namespace tapegrad;
using namespace tapegrad::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const fs::path tiny_llama_dir = fs::path(TAPEGRAD_SOURCE_DIR) / "tests" / "data" / "models" / "tiny_llama";

json golden_tokenizer_cases() {
  std::ifstream in(fs::path(TAPEGRAD_SOURCE_DIR) / "tests" / "data" / "tokenizer_golden.json");
  return json::parse(in)["tiny"]["cases"];
}

}  // namespace

TEST_CASE("tokenize prints tokenizers' ids for a Hugging Face folder and a GGUF file, and --decode inverts it") {
  const json cases = golden_tokenizer_cases();
  REQUIRE(cases.size() > 10);
  for (const fs::path& model : {tiny_llama_dir, tiny_llama_dir / "tiny_llama.f32.gguf"}) {
    CAPTURE(model.string());
    for (std::size_t i = 0; i < cases.size(); i += 5) {
      const std::string text = cases[i]["text"];
      if (text.empty()) continue;
      CAPTURE(text);
      Result r = run("tokenize", {"--model", model.string(), "--text", text});
      REQUIRE_MESSAGE(r.status == 0, r.err);
      CHECK(json::parse(r.out) == cases[i]["ids"]);
    }
  }
  const fs::path ids = process_dir() / "tokenize_ids.json";
  std::ofstream(ids) << cases[1]["ids"].dump();
  const fs::path text = process_dir() / "tokenize_text.txt";
  const std::string command = fmt::format("'{}' --model '{}' --decode < '{}' > '{}'",
                                          (fs::path(TAPEGRAD_BINARY_DIR) / "tokenize").string(), tiny_llama_dir.string(),
                                          ids.string(), text.string());
  REQUIRE(std::system(command.c_str()) == 0);
  CHECK(read_bytes(text) == cases[1]["text"].get<std::string>());
  Result bad = run("tokenize", {"--model", tiny_llama_dir.string(), "--text", std::string("ok \xff")});
  CHECK(bad.status == 2);
  CHECK(one_error_line(bad, "tokenize"));
  CHECK(contains(bad.err, "byte offset 3"));
  Result neither = run("tokenize", {"--model", tiny_llama_dir.string()});
  CHECK(neither.status == 2);
  CHECK(one_error_line(neither, "tokenize"));
}

TEST_CASE("generate --model streams what the library generates, stops at end ids unless --ignore-eos, and --chat prints the reply") {
  nn::PretrainedModel model = nn::load_pretrained(tiny_llama_dir.string());
  model.model.set_training(false);
  const std::string prompt = "The cat";
  const std::vector<std::int32_t> ids = model.tokenizer->encode(prompt);
  nn::GenerateOptions options{.max_new = 24, .sampling = {.temperature = 1.0f}, .seed = 5,
                              .stop_ids = model.tokenizer->end_ids()};
  const nn::Generation expected = nn::generate(model.model, ids, options);
  const std::vector<std::string> args = {"--model", tiny_llama_dir.string(), "--prompt", prompt, "--max-new", "24",
                                         "--temperature", "1", "--seed", "5"};
  Result r = run("generate", args);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  // Standard output carries whole characters: bytes that form none become U+FFFD.
  CHECK(r.out == prompt + tokenizers::replace_invalid_utf8(model.tokenizer->decode(expected.tokens)));

  Result jsonl = run("generate", args + std::vector<std::string>{"--jsonl", "--num-samples", "2"});
  REQUIRE_MESSAGE(jsonl.status == 0, jsonl.err);
  std::istringstream lines(jsonl.out);
  std::string first;
  REQUIRE(std::getline(lines, first));
  CHECK(json::parse(first)["ids"].get<std::vector<std::int32_t>>() == expected.tokens);

  Result all = run("generate", args + std::vector<std::string>{"--ignore-eos", "--jsonl"});
  REQUIRE_MESSAGE(all.status == 0, all.err);
  CHECK(json::parse(all.out)["ids"].size() == 24);

  // --kv-cache f16: the library's text over a 16-bit cache; not with --no-cache, nor another type.
  nn::GenerateOptions half_options = options;
  half_options.cache_type = nn::KVCacheType::f16;
  const nn::Generation half_expected = nn::generate(model.model, ids, half_options);
  Result half = run("generate", args + std::vector<std::string>{"--kv-cache", "f16", "--jsonl"});
  REQUIRE_MESSAGE(half.status == 0, half.err);
  CHECK(json::parse(half.out)["ids"].get<std::vector<std::int32_t>>() == half_expected.tokens);
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--kv-cache", "f16", "--no-cache"},
                                              std::vector<std::string>{"--kv-cache", "q8_0"}}) {
    Result refused = run("generate", args + bad);
    CHECK(refused.status == 2);
    CHECK(one_error_line(refused, "generate"));
    CHECK(contains(refused.err, "--kv-cache"));
  }

  // --chat: the reply alone, to the model's own template (ChatML) with a system message.
  const std::vector<tokenizers::ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hi there"}};
  const auto format = tokenizers::ChatTemplate::recognise(*model.chat_template, "tiny_llama");
  const nn::Generation reply =
      nn::generate(model.model, model.tokenizer->encode(format.render(messages, true)), options);
  Result chat = run("generate", {"--model", tiny_llama_dir.string(), "--chat", "--system", "Be brief.", "--prompt", "Hi there",
                                 "--max-new", "24", "--temperature", "1", "--seed", "5"});
  REQUIRE_MESSAGE(chat.status == 0, chat.err);
  CHECK(chat.out == tokenizers::replace_invalid_utf8(model.tokenizer->decode(reply.tokens)) + "\n");

  Result no_prompt = run("generate", {"--model", tiny_llama_dir.string()});
  CHECK(no_prompt.status == 2);
  CHECK(one_error_line(no_prompt, "generate"));
  CHECK(contains(no_prompt.err, "--prompt is required"));
  // The same model saved as a tapegrad checkpoint keeps its BPE: still no default prompt.
  const std::string checkpoint = process_path("tiny_llama_bpe.safetensors");
  nn::save_model_checkpoint(checkpoint, model.model, *model.tokenizer);
  Result checkpoint_no_prompt = run("generate", {"--checkpoint", checkpoint});
  CHECK(checkpoint_no_prompt.status == 2);
  CHECK(contains(checkpoint_no_prompt.err, "--prompt is required"));
  Result from_checkpoint = run("generate", {"--checkpoint", checkpoint, "--prompt", prompt, "--max-new", "24",
                                            "--temperature", "1", "--seed", "5"});
  REQUIRE_MESSAGE(from_checkpoint.status == 0, from_checkpoint.err);
  CHECK(from_checkpoint.out == r.out);
  Result both = run("generate", {"--model", tiny_llama_dir.string(), "--checkpoint", "x.safetensors", "--prompt", "a"});
  CHECK(both.status == 2);
  CHECK(contains(both.err, "not both"));
  Result unknown = run("generate", {"--model", tiny_llama_dir.string(), "--chat", "--chat-template", "alpaca", "--prompt", "a"});
  CHECK(unknown.status != 0);
  CHECK(one_error_line(unknown, "generate"));
  CHECK(contains(unknown.err, "--chat-template"));
}

TEST_CASE("evaluate --model prints the windowed loss the library computes, and the same from the GGUF file") {
  const fs::path text = process_dir() / "evaluate_text.txt";
  std::ofstream(text) << "The quick brown fox jumps over the lazy dog. 1234567890\n"
                         "Pack my box with five dozen liquor jugs! Sphinx of black quartz, judge my vow.\n";
  nn::PretrainedModel model = nn::load_pretrained(tiny_llama_dir.string());
  model.model.set_training(false);
  std::vector<std::int32_t> ids;
  {
    std::ifstream in(text);
    ids = model.tokenizer->encode(std::string(std::istreambuf_iterator<char>(in), {}));
  }
  ids.resize(40);
  NoGradScope no_grad;
  double sum = 0;  // windows of 16: 0..15 -> 1..16, 16..31 -> 17..32, 32..38 -> 33..39
  for (std::size_t s = 0; s + 1 < ids.size(); s += 16) {
    const std::size_t length = std::min<std::size_t>(16, ids.size() - 1 - s);
    std::vector<std::int32_t> inputs(ids.begin() + s, ids.begin() + s + length),
        targets(ids.begin() + s + 1, ids.begin() + s + 1 + length);
    sum += model.model.loss(inputs, targets, 1, length).value().item() * double(length);
  }
  for (const fs::path& path : {tiny_llama_dir, tiny_llama_dir / "tiny_llama.f32.gguf"}) {
    CAPTURE(path.string());
    Result r = run("evaluate", {"--model", path.string(), "--data", text.string(), "--limit", "40", "--window", "16"});
    REQUIRE_MESSAGE(r.status == 0, r.err);
    const json line = json::parse(r.out);
    CHECK(line["tokens"] == 39);
    CHECK(line["loss"].get<double>() == doctest::Approx(sum / 39).epsilon(1e-5));
    CHECK(line["perplexity"].get<double>() == doctest::Approx(std::exp(sum / 39)).epsilon(1e-5));
    CHECK(!line.contains("bits_per_char"));
  }
  Result too_wide = run("evaluate", {"--model", tiny_llama_dir.string(), "--data", text.string(), "--window", "4096"});
  CHECK(too_wide.status == 2);
  CHECK(contains(too_wide.err, "max_len 128"));
}
