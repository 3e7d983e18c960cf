// train --init end to end on the committed tiny Llama (a Hugging Face folder and its GGUF files):
// training with the model's BPE, remat and resume bit for bit, a checkpoint as the start, the
// errors of bad --init paths and shape flags, and serve picking up the checkpoints it writes.
#include <doctest/doctest.h>
#include <signal.h>

#include "../serve/serve_helpers.h"
#include "nn/checkpoint.h"
#include "nn/language_model.h"
#include "support/helpers.h"
#include "support/programs.h"

using namespace tapegrad;
using namespace tapegrad::test;
using nlohmann::json;

namespace {

const fs::path kTinyLlama = fs::path(TAPEGRAD_SOURCE_DIR) / "tests/data/models/tiny_llama";

/// A few steps of the tiny Llama from `init` on the made-up corpus (about 2,000 BPE tokens).
std::vector<std::string> from_init(const fs::path& init, const fs::path& data, const fs::path& out, int steps,
                                   int seq = 16) {
  return {"--init",  init.string(),         "--data",    data.string(), "--out",          out.string(),
          "--seq",   std::to_string(seq),   "--batch",   "4",           "--eval-batches", "2",
          "--steps", std::to_string(steps), "--threads", "1"};
}

/// Every tensor of two checkpoints bit for bit (their metadata may differ: a GGUF's tokenizer
/// lists its end ids otherwise).
void check_same_weights(const fs::path& a, const fs::path& b) {
  SafetensorsFile fa = read_safetensors(a.string()), fb = read_safetensors(b.string());
  REQUIRE(fa.tensors.size() == fb.tensors.size());
  for (const auto& [name, ta] : fa.tensors) {
    REQUIRE_MESSAGE(fb.tensors.count(name), name);
    CHECK_MESSAGE(std::memcmp(ta.data(), fb.tensors.at(name).data(), ta.bytes()) == 0, name << " differs");
  }
}

}  // namespace

TEST_CASE("train --init trains the tiny Llama with its BPE: folder and f32 GGUF alike, remat changing no bit") {
  fs::path dir = work_dir("train_init"), data = write_corpus(dir);
  const fs::path folder = dir / "folder.safetensors", gguf = dir / "gguf.safetensors";
  const fs::path remat = dir / "remat.safetensors";
  Result r = run("train", from_init(kTinyLlama, data, folder, 8));
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(contains(r.out, "tokens, vocabulary of 320; train "));
  CHECK(contains(r.out, "init: " + kTinyLlama.string() + " (a Hugging Face folder, float32 weights; its bpe"));
  CHECK(contains(r.out, "bits/token)"));
  CHECK(!contains(r.out, "never train positions"));  // the note is for new models
  nn::LoadedModelCheckpoint saved = nn::load_model_checkpoint(folder.string());
  CHECK(saved.model.arch() == "llama");
  CHECK(saved.tokenizer->kind() == "bpe");
  CHECK(saved.metadata.at("step") == "8");
  CHECK(saved.metadata.count("data_tokens") == 1);
  CHECK(fs::file_size(dir / "folder.metrics.csv") > 0);
  CHECK(fs::file_size(dir / "folder.loss.svg") > 0);

  Result from_gguf = run("train", from_init(kTinyLlama / "tiny_llama.f32.gguf", data, gguf, 8));
  REQUIRE_MESSAGE(from_gguf.status == 0, from_gguf.err);
  CHECK(contains(from_gguf.out, "(a GGUF file, float32 weights; its bpe tokenizer of 320 tokens)"));
  check_same_weights(folder, gguf);  // the same floats, the Q/K rows permuted back: the same training

  REQUIRE(run("train", from_init(kTinyLlama, data, remat, 8) + std::vector<std::string>{"--remat"}).status == 0);
  check_same_tensors(folder, remat);
  CHECK(read_bytes(folder) == read_bytes(remat));

  // A quantized file starts from its dequantized weights (float32 masters from there on).
  Result quantized = run("train", from_init(kTinyLlama / "tiny_llama.q8_0.gguf", data, dir / "q8.safetensors", 2));
  CHECK_MESSAGE(quantized.status == 0, quantized.err);
  // train_char is the same program under its old name.
  Result old_name = run("train_char", from_init(kTinyLlama, data, dir / "old_name.safetensors", 8));
  CHECK(old_name.status == 0);
  CHECK(read_bytes(folder) == read_bytes(dir / "old_name.safetensors"));
}

TEST_CASE("train --init resumes bit-identically, and a checkpoint as --init starts from its weights") {
  fs::path dir = work_dir("train_init_resume"), data = write_corpus(dir);
  const fs::path straight = dir / "straight.safetensors", halves = dir / "halves.safetensors";
  Result whole = run("train", from_init(kTinyLlama, data, straight, 8));
  REQUIRE_MESSAGE(whole.status == 0, whole.err);
  const std::vector<std::string> decay = {"--decay-steps", "8"};
  REQUIRE(run("train", from_init(kTinyLlama, data, halves, 4) + decay).status == 0);
  // The resume takes model and tokenizer from the checkpoint: no --init.
  Result resumed = run("train", {"--data", data.string(), "--out", halves.string(), "--resume", halves.string(),
                                 "--seq", "16", "--batch", "4", "--steps", "8", "--threads", "1", "--eval-batches",
                                 "2"});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  CHECK(contains(resumed.out, "resumed from " + halves.string() + " at step 4"));
  check_same_tensors(straight, halves);
  CHECK(read_bytes(straight) == read_bytes(halves));

  // The straight run's checkpoint as the start: the first validation (same windows) sees its weights.
  Result next = run("train", from_init(straight, data, dir / "next.safetensors", 2));
  REQUIRE_MESSAGE(next.status == 0, next.err);
  CHECK(contains(next.out, "init: " + straight.string() + " (a checkpoint of step 8; its bpe tokenizer of 320 tokens"));
  const std::size_t final_at = whole.out.find("final val loss ");
  REQUIRE(final_at != std::string::npos);
  const std::string final_loss = whole.out.substr(final_at + 15, 6);
  CHECK_MESSAGE(contains(next.out, "step 0/2: val loss " + final_loss + " ("), next.out);
}

TEST_CASE("train refuses a bad --init path, and shape flags or --resume beside --init, in one line") {
  fs::path dir = work_dir("train_init_errors"), data = write_corpus(dir);
  const fs::path out = dir / "out.safetensors";
  fs::create_directories(dir / "empty_folder");
  const struct {
    fs::path init;
    int status;
    std::string message;
  } bad_paths[] = {
      {dir / "missing.gguf", 1, "--init " + (dir / "missing.gguf").string() + ": no such file or folder"},
      {data, 1, "--init: " + data.string() + " is not a GGUF file (no GGUF magic) and does not read as a checkpoint"},
      {dir / "empty_folder", 1, "config.json: missing"},
  };
  for (const auto& bad : bad_paths) {
    CAPTURE(bad.init);
    Result r = run("train", from_init(bad.init, data, out, 2));
    CHECK(r.status == bad.status);
    CHECK(one_error_line(r, "train"));
    CHECK_MESSAGE(contains(r.err, bad.message), r.err);
  }
  const std::pair<std::vector<std::string>, std::string> bad_flags[] = {
      {{"--d-model", "64"}, "--d-model cannot be given with --init: the model's shape comes from "},
      {{"--max-len", "64"}, "--max-len cannot be given with --init"},
      {{"--arch", "llama"}, "--arch cannot be given with --init"},
      {{"--resume", out.string()}, "give --init or --resume, not both"},
  };
  for (const auto& [flags, message] : bad_flags) {
    CAPTURE(flags[0]);
    Result r = run("train", from_init(kTinyLlama, data, out, 2) + flags);
    CHECK(r.status == 2);
    CHECK(one_error_line(r, "train"));
    CHECK_MESSAGE(contains(r.err, message), r.err);
  }
  Result too_long = run("train", from_init(kTinyLlama, data, out, 2, 200));
  CHECK(too_long.status == 2);
  CHECK(contains(too_long.err, "--seq 200 is longer than the model's max_len 128"));
  CHECK(!fs::exists(out));
}

TEST_CASE("serve answers from the Llama checkpoint of train --init and picks up the next one live") {
  fs::path dir = work_dir("train_init_serve"), data = write_corpus(dir), ckpt = dir / "llama.safetensors";
  REQUIRE(run("train", from_init(kTinyLlama, data, ckpt, 2)).status == 0);
  const fs::path out = dir / "serve.out", err = dir / "serve.err";
  const pid_t server = start("serve", {"--checkpoint", ckpt.string(), "--port", "0", "--threads", "1"}, out, err);
  const int port = port_of(err);
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(20);
  auto first = client.Post("/v1/completions", R"({"prompt": "The ", "max_tokens": 8, "seed": 1})", "application/json");
  REQUIRE(first);
  CHECK(first->status == 200);
  CHECK(json::parse(first->body)["system_fingerprint"].get<std::string>().starts_with("fp_2_"));
  // The run continues to step 6 and replaces the checkpoint under the server.
  Result resumed = run("train", {"--data", data.string(), "--out", ckpt.string(), "--resume", ckpt.string(), "--seq",
                                 "16", "--batch", "4", "--steps", "6", "--threads", "1", "--eval-batches", "2"});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  CHECK(eventually([&] {
    auto models = client.Get("/v1/models");
    return models && json::parse(models->body)["data"][0]["step"] == 6;
  }));
  auto r = client.Post("/v1/completions", R"({"prompt": "The ", "max_tokens": 8, "seed": 1})", "application/json");
  REQUIRE(r);
  const json body = json::parse(r->body);
  CHECK(body["system_fingerprint"].get<std::string>().starts_with("fp_6_"));
  // The untrained tiny model's tokens are stray bytes: JSON carries them as U+FFFD.
  const json expected = reference_texts(ckpt, "The ", {}, 8, 1)[0];
  CHECK(body["choices"][0]["text"] == json::parse(expected.dump(-1, ' ', false, json::error_handler_t::replace)));
  REQUIRE(::kill(server, SIGTERM) == 0);
  CHECK(wait_for(server) == 0);
}
