// train_char --arch gpt2 end to end: resume bit-identical with dropout on, remat, the NaN seam,
// and generate / evaluate reading arch from the checkpoint.
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "nn/checkpoint.h"
#include "nn/language_model.h"
#include "support/helpers.h"
#include "support/programs.h"
#include "tokenizers/char_tokenizer.h"
#include "tokenizers/utf8.h"

using namespace tapegrad;
using namespace tapegrad::test;
namespace fs = std::filesystem;

namespace {
const std::vector<std::string> kGpt2 = {"--arch", "gpt2", "--dropout", "0.1"};
}

TEST_CASE("train_char --arch gpt2 --dropout resumes bit-identically and matches its remat run") {
  fs::path dir = work_dir("gpt2"), data = write_corpus(dir);
  fs::path straight = dir / "straight.safetensors", halves = dir / "halves.safetensors", remat = dir / "remat.safetensors";
  const std::vector<std::string> common = kGpt2 + std::vector<std::string>{"--eval-every", "4"};
  Result r = run("train_char", tiny(data, straight, 10) + common);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(contains(r.out, "model: Gpt2(vocab="));
  CHECK(contains(r.out, "dropout=0.1"));
  nn::LoadedModelCheckpoint loaded = nn::load_model_checkpoint(straight.string());
  CHECK(loaded.model.arch() == "gpt2");
  CHECK(loaded.metadata.at("arch") == "gpt2");
  CHECK(loaded.metadata.count("rope_theta") == 0);
  CHECK(read_safetensors(straight.string()).tensors.count("blocks.0.ffn.w1.bias") == 1);

  REQUIRE(run("train_char", tiny(data, halves, 5) + common + std::vector<std::string>{"--decay-steps", "10"}).status == 0);
  Result resumed = run("train_char", tiny(data, halves, 10) + std::vector<std::string>{"--eval-every", "4", "--resume", halves.string()});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  check_same_tensors(straight, halves);

  REQUIRE(run("train_char", tiny(data, remat, 10) + common + std::vector<std::string>{"--remat"}).status == 0);
  check_same_tensors(straight, remat);

  Result wrong = run("train_char", tiny(data, halves, 12) + std::vector<std::string>{"--arch", "rotary", "--resume", halves.string()});
  CHECK(wrong.status == 2);
  CHECK(contains(wrong.err, "--arch rotary disagrees with --resume"));

  Result unknown = run("train_char", tiny(data, dir / "unknown.safetensors", 2) + std::vector<std::string>{"--arch", "mamba"});
  CHECK(unknown.status == 2);
  CHECK(contains(unknown.err, "--arch 'mamba' is not a registered architecture (registered: rotary, gpt2, llama)"));
}

TEST_CASE("generate (cached, uncached, batched) and evaluate read a gpt2 checkpoint by its arch") {
  fs::path dir = work_dir("gpt2_use"), data = write_corpus(dir), ckpt = dir / "g.safetensors";
  REQUIRE(run("train_char", tiny(data, ckpt, 6) + kGpt2).status == 0);
  const std::vector<std::string> args = {"--checkpoint", ckpt.string(), "--prompt", "The", "--max-new", "10", "--seed", "3"};
  Result g = run("generate", args);
  REQUIRE_MESSAGE(g.status == 0, g.err);
  CHECK(g.out.starts_with("The"));
  CHECK(tokenizers::decode_utf8(g.out).size() == 13);
  CHECK(run("generate", args).out == g.out);  // dropout is off in generation: the same text
  CHECK(run("generate", args + std::vector<std::string>{"--no-cache"}).out == g.out);  // the cache gives the same text
  Result two = run("generate", args + std::vector<std::string>{"--num-samples", "2"});
  REQUIRE(two.status == 0);
  CHECK(two.out.starts_with(g.out + "\n---\n"));  // sample 0 has seed 3
  Result e = run("evaluate", {"--checkpoint", ckpt.string(), "--data", data.string(), "--limit", "500"});
  REQUIRE_MESSAGE(e.status == 0, e.err);
  double loss = nlohmann::json::parse(e.out).at("loss").get<double>();
  CHECK(loss > 0);
  CHECK(loss < 5);
}

TEST_CASE("train_char --dropout on the rotary decoder resumes bit-identically; a NaN in gpt2 stops the run") {
  fs::path dir = work_dir("rotary_dropout"), data = write_corpus(dir);
  fs::path straight = dir / "straight.safetensors", halves = dir / "halves.safetensors", ckpt = dir / "b.safetensors";
  const std::vector<std::string> drop = {"--dropout", "0.2", "--eval-every", "3"};
  Result r = run("train_char", tiny(data, straight, 6) + drop);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(read_safetensors(straight.string()).metadata.at("dropout") == "0.2");
  REQUIRE(run("train_char", tiny(data, halves, 3) + drop + std::vector<std::string>{"--decay-steps", "6"}).status == 0);
  Result resumed = run("train_char", tiny(data, halves, 6) + std::vector<std::string>{"--eval-every", "3", "--resume", halves.string()});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  check_same_tensors(straight, halves);
  Result nan = run("train_char", tiny(data, ckpt, 4) + kGpt2, {"TAPEGRAD_TEST_INJECT_NAN_AT_STEP=2"});
  CHECK(nan.status == 1);
  CHECK(contains(nan.err, "at step 2"));
}

TEST_CASE("generate --num-samples 5 --jsonl equals five single runs at sizes no SIMD width divides") {
  // d_model 30 with 3 heads and d_ff 102: every row ends in a partial vector at every width, where
  // batched rows once met a different formula than a sample alone.
  fs::path dir = work_dir("odd_sizes"), data = write_corpus(dir);
  for (const char* arch : {"gpt2", "rotary"}) {
    CAPTURE(arch);
    fs::path ckpt = dir / (std::string(arch) + ".safetensors");
    Result trained = run("train_char", {"--data", data.string(), "--out", ckpt.string(), "--arch", arch, "--d-model", "30",
                                        "--heads", "3", "--d-ff", "102", "--blocks", "2", "--max-len", "48", "--seq",
                                        "16", "--batch", "4", "--threads", "1", "--eval-batches", "1", "--steps", "6"});
    REQUIRE_MESSAGE(trained.status == 0, trained.err);
    const std::vector<std::string> args = {"--checkpoint", ckpt.string(), "--prompt", "Th", "--max-new", "30",
                                           "--temperature", "1.1"};
    std::string expected;
    for (int i = 0; i < 5; ++i) {
      Result alone = run("generate", args + std::vector<std::string>{"--seed", std::to_string(7 + i)});
      REQUIRE_MESSAGE(alone.status == 0, alone.err);
      // The line one sample prints with --jsonl (its ids too), whose text is what it streams.
      Result line = run("generate", args + std::vector<std::string>{"--seed", std::to_string(7 + i), "--jsonl"});
      REQUIRE_MESSAGE(line.status == 0, line.err);
      nlohmann::json object = nlohmann::json::parse(line.out);
      CHECK(object["text"] == alone.out);
      CHECK(object["ids"].size() == 30);
      object["sample"] = i;
      expected += object.dump() + "\n";
    }
    Result batch = run("generate", args + std::vector<std::string>{"--seed", "7", "--num-samples", "5", "--jsonl"});
    REQUIRE_MESSAGE(batch.status == 0, batch.err);
    CHECK(batch.out == expected);
  }
}
