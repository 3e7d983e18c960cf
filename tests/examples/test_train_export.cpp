// train --export-hf and --export-gguf end to end on the committed tiny Llama and GPT-2: the exports
// of a trained run hold the checkpoint's weights (bit for bit through Hugging Face and f32 GGUF), --steps
// 0 with --init converts a model unchanged, and a bad --export-type or a model that cannot be
// exported is refused before training; a checkpoint keeps the --init model's chat template.
#include <doctest/doctest.h>

#include "io/gguf.h"
#include "nn/checkpoint.h"
#include "nn/pretrained.h"
#include "support/helpers.h"
#include "support/programs.h"

using namespace tapegrad;
using namespace tapegrad::test;
namespace fs = std::filesystem;

namespace {

const fs::path kTinyLlama = fs::path(TAPEGRAD_SOURCE_DIR) / "tests/data/models/tiny_llama";
const fs::path kTinyGpt2 = fs::path(TAPEGRAD_SOURCE_DIR) / "tests/data/models/tiny_gpt2";

std::vector<std::string> train_args(const fs::path& init, const fs::path& data, const fs::path& out, int steps) {
  return {"--init", init.string(), "--data", data.string(), "--out", out.string(), "--seq", "16", "--batch", "4",
          "--eval-batches", "2", "--steps", std::to_string(steps), "--threads", "1"};
}

Tensor logits_of(const nn::LanguageModel& model, std::span<const std::int32_t> ids) {
  return model.forward(ids, 1, ids.size()).value();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

}  // namespace

TEST_CASE("train --export-hf and --export-gguf write the trained model, Llama or GPT-2: the checkpoint's logits bit for bit") {
  for (const fs::path& init : {kTinyLlama, kTinyGpt2}) {
    CAPTURE(init.string());
    fs::path dir = work_dir("train_export_" + init.filename().string()), data = write_corpus(dir);
    const fs::path out = dir / "run.safetensors", hf = dir / "hf", gguf = dir / "run.f32.gguf";
    std::vector<std::string> args = train_args(init, data, out, 3);
    args.insert(args.end(), {"--export-hf", hf.string(), "--export-gguf", gguf.string()});
    Result r = run("train", args);
    REQUIRE_MESSAGE(r.status == 0, r.err);
    CHECK(contains(r.out, "exported " + hf.string() + " (a Hugging Face folder, float32, with its chat template)"));
    CHECK(contains(r.out, "exported " + gguf.string() + " (GGUF, f32 matrices, with its chat template)"));
    const nn::LoadedModelCheckpoint trained = nn::load_model_checkpoint(out.string());
    const nn::PretrainedModel original = nn::load_pretrained(init.string());
    const std::vector<std::int32_t> ids = trained.tokenizer->encode("the cat sat on a mat");
    const Tensor want = logits_of(trained.model, ids);
    CHECK(!same_bits(want, logits_of(original.model, ids)));  // it did train
    for (const fs::path& exported : {hf, gguf}) {
      CAPTURE(exported.string());
      const nn::PretrainedModel reloaded = nn::load_pretrained(exported.string());
      CHECK(reloaded.model.arch() == original.model.arch());
      CHECK(same_bits(logits_of(reloaded.model, ids), want));
      CHECK(reloaded.chat_template == original.chat_template);
      CHECK(reloaded.tokenizer->encode("the cat sat on a mat") == ids);
    }
  }
}

TEST_CASE("train --init --steps 0 converts a model: a GGUF to a Hugging Face folder and q8_0, weights unchanged") {
  fs::path dir = work_dir("train_convert"), data = write_corpus(dir);
  const fs::path hf = dir / "hf", q8 = dir / "model.q8_0.gguf";
  std::vector<std::string> args = train_args(kTinyLlama / "tiny_llama.f32.gguf", data, dir / "ck.safetensors", 0);
  args.insert(args.end(), {"--export-hf", hf.string(), "--export-gguf", q8.string(), "--export-type", "q8_0"});
  Result r = run("train", args);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(contains(r.out, "--steps 0: no training"));
  const nn::PretrainedModel original = nn::load_pretrained(kTinyLlama.string());
  const std::vector<std::int32_t> ids = original.tokenizer->encode("the cat sat on a mat");
  CHECK(same_bits(logits_of(nn::load_pretrained(hf.string()).model, ids), logits_of(original.model, ids)));
  const io::GgufFile file = io::GgufFile::open(q8.string());
  CHECK(file.find_tensor("blk.0.ffn_up.weight")->type == quant::TensorType::Q8_0);
  CHECK(file.at("general.file_type").as_int() == 7);
}

TEST_CASE("train keeps --init's chat template in its checkpoints: generate --chat, a resume and an export read it") {
  fs::path dir = work_dir("train_chat_template"), data = write_corpus(dir);
  const fs::path out = dir / "run.safetensors", gguf = dir / "from_checkpoint.gguf";
  REQUIRE(run("train", train_args(kTinyLlama, data, out, 2)).status == 0);
  const std::optional<std::string> original = nn::load_pretrained(kTinyLlama.string()).chat_template;
  REQUIRE(original);
  CHECK(nn::load_model_checkpoint(out.string()).chat_template() == original);

  Result chat = run("generate", {"--checkpoint", out.string(), "--chat", "--prompt", "Hi there", "--max-new", "4"});
  CHECK_MESSAGE(chat.status == 0, chat.err);

  Result resumed = run("train", {"--resume", out.string(), "--data", data.string(), "--out", out.string(), "--seq",
                                 "16", "--batch", "4", "--eval-batches", "2", "--steps", "3", "--threads", "1"});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  CHECK(nn::load_model_checkpoint(out.string()).chat_template() == original);

  std::vector<std::string> convert = train_args(out, data, dir / "converted.safetensors", 0);
  convert.insert(convert.end(), {"--export-gguf", gguf.string()});
  Result converted = run("train", convert);
  REQUIRE_MESSAGE(converted.status == 0, converted.err);
  CHECK(contains(converted.out, "with its chat template"));
  CHECK(nn::load_pretrained(gguf.string()).chat_template == original);

  // A character model has none: the key is absent, not empty.
  const fs::path chars = dir / "chars.safetensors";
  REQUIRE(run("train", {"--data", data.string(), "--out", chars.string(), "--steps", "1", "--seq", "16", "--batch",
                        "2", "--d-model", "16", "--heads", "2", "--blocks", "1", "--eval-batches", "1", "--threads",
                        "1"}).status == 0);
  CHECK(!nn::load_model_checkpoint(chars.string()).chat_template());
}

TEST_CASE("train refuses --export-type q4_0, --steps 0 without --init, an export it cannot write, before training") {
  fs::path dir = work_dir("train_export_errors"), data = write_corpus(dir);
  std::vector<std::string> args = train_args(kTinyLlama, data, dir / "a.safetensors", 1);
  args.insert(args.end(), {"--export-gguf", (dir / "x.gguf").string(), "--export-type", "q4_0"});
  Result bad_type = run("train", args);
  CHECK(bad_type.status == 2);
  CHECK(contains(bad_type.err, "--export-type: export type 'q4_0' is not one of f32, bf16, q8_0"));
  Result no_init = run("train", {"--data", data.string(), "--out", (dir / "b.safetensors").string(), "--steps", "0"});
  CHECK(no_init.status == 2);
  CHECK(contains(no_init.err, "--steps must be at least 1 (0 only with --init, to convert a model), got 0"));
  // New character-level models: their exports refused before the first step, nothing written.
  const std::vector<std::string> char_model = {"--data", data.string(), "--steps", "1", "--seq", "16", "--batch", "2",
                                               "--d-model", "16", "--heads", "2", "--blocks", "1", "--eval-batches",
                                               "1", "--threads", "1"};
  std::vector<std::string> rotary = char_model;
  rotary.insert(rotary.end(), {"--out", (dir / "c.safetensors").string(), "--export-hf", (dir / "c_hf").string()});
  Result chars = run("train", rotary);
  CHECK(chars.status == 2);
  CHECK(contains(chars.err,
                 "--export-hf " + (dir / "c_hf").string() + ": only Llama and GPT-2 models export (this model is 'rotary')"));
  CHECK(!fs::exists(dir / "c.safetensors"));
  CHECK(!fs::exists(dir / "c_hf"));
  std::vector<std::string> llama = char_model;
  llama.insert(llama.end(), {"--arch", "llama", "--out", (dir / "d.safetensors").string(), "--export-gguf",
                             (dir / "d.gguf").string()});
  Result char_llama = run("train", llama);
  CHECK(char_llama.status == 2);
  CHECK(contains(char_llama.err,
                 "--export-gguf " + (dir / "d.gguf").string() + ": only a byte-level BPE tokenizer exports"));
  CHECK(!fs::exists(dir / "d.safetensors"));
  CHECK(!fs::exists(dir / "d.gguf"));
}
