// Exports read back: the tiny Llamas and GPT-2 (tests/data/models) exported to a Hugging Face folder
// and to GGUF f32 reproduce the committed files' tensors bit for bit and reload to bit-identical logits,
// bf16 and q8_0 within their rounding; tokenizer and chat template carried over; failures leave
// nothing damaged. Where bench/.venv exists, transformers and the gguf package read the exports
// (scripts/check_export.py).
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "io/hf_folder.h"
#include "io/safetensors.h"
#include "nn/export.h"
#include "nn/models/gpt2.h"
#include "nn/models/rotary_decoder.h"
#include "nn/pretrained.h"
#include "support/helpers.h"
#include "tokenizers/byte_level_bpe.h"
#include "tokenizers/char_tokenizer.h"

using namespace tapegrad;
namespace fs = std::filesystem;
using test::contains;
using test::error_of;

namespace {

const fs::path models_dir = fs::path(TAPEGRAD_SOURCE_DIR) / "tests" / "data" / "models";
const std::string kText = "Hello world, the 2 cats sat. <|im_end|>";

std::vector<std::int32_t> probe_ids(const nn::PretrainedModel& m) { return m.tokenizer->encode(kText); }

Tensor logits_of(const nn::PretrainedModel& m, std::span<const std::int32_t> ids) {
  return m.model.forward(ids, 1, ids.size()).value();
}

float max_abs_difference(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  float worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a.data()[i] - b.data()[i]));
  return worst;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

void check_same_tokenizer(const nn::PretrainedModel& a, const nn::PretrainedModel& b) {
  CHECK(a.tokenizer->encode(kText) == b.tokenizer->encode(kText));
  CHECK(a.tokenizer->bos_id() == b.tokenizer->bos_id());
  CHECK(a.tokenizer->add_bos() == b.tokenizer->add_bos());
  REQUIRE(!a.tokenizer->end_ids().empty());
  CHECK(b.tokenizer->end_ids().front() == a.tokenizer->end_ids().front());
  CHECK(a.chat_template == b.chat_template);
}

}  // namespace

TEST_CASE("the tiny Llamas and GPT-2 exported to Hugging Face folders give back the committed tensors and logits bit for bit") {
  for (const char* name : {"tiny_llama", "tiny_llama_tied", "tiny_gpt2"}) {
    CAPTURE(name);
    const nn::PretrainedModel original = nn::load_pretrained((models_dir / name).string());
    const std::string dir = test::process_path(std::string(name) + "_hf");
    nn::export_hf({original.model, *original.tokenizer, original.chat_template}, dir);
    for (const char* file : {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"})
      CHECK_MESSAGE(fs::is_regular_file(fs::path(dir) / file), file);
    // Every tensor of the published folder, unpermuted and transposed back, bit for bit.
    const io::HfFolder published = io::read_hf_folder((models_dir / name).string());
    const SafetensorsFile exported = read_safetensors(dir + "/model.safetensors");
    CHECK(exported.tensors.size() == published.tensors.size());
    for (const auto& [tensor_name, tensor] : published.tensors) {
      CAPTURE(tensor_name);
      auto it = exported.tensors.find(tensor_name);
      REQUIRE(it != exported.tensors.end());
      CHECK(same_bits(it->second, tensor));
    }
    const nn::PretrainedModel reloaded = nn::load_pretrained(dir);
    const std::vector<std::int32_t> ids = probe_ids(original);
    CHECK(same_bits(logits_of(reloaded, ids), logits_of(original, ids)));
    check_same_tokenizer(original, reloaded);
    CHECK(reloaded.model.describe() == original.model.describe());
  }
}

// What the GGUF test checks of each tiny model: its committed f32 file, a matrix and a vector
// tensor, and the size keys llama.cpp reads.
struct GgufCase {
  std::string model, arch, matrix, vector;
  std::vector<std::string> keys;
};

TEST_CASE("the tiny Llama and GPT-2 exported to GGUF: f32 gives back the committed file's tensors and logits bit for bit, bf16 and q8_0 within their rounding") {
  const std::vector<GgufCase> cases = {
      {"tiny_llama", "llama", "blk.0.attn_q.weight", "blk.0.attn_norm.weight",
       {"llama.context_length", "llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
        "llama.rope.dimension_count", "llama.attention.head_count", "llama.attention.head_count_kv"}},
      {"tiny_gpt2", "gpt2", "blk.0.attn_qkv.weight", "blk.0.attn_qkv.bias",
       {"gpt2.context_length", "gpt2.embedding_length", "gpt2.block_count", "gpt2.feed_forward_length",
        "gpt2.attention.head_count"}}};
  for (const GgufCase& c : cases) {
    CAPTURE(c.model);
    const nn::PretrainedModel original = nn::load_pretrained((models_dir / c.model).string());
    const std::vector<std::int32_t> ids = probe_ids(original);
    const Tensor want = logits_of(original, ids);
    float logit_scale = 0;
    for (std::size_t i = 0; i < want.size(); ++i) logit_scale = std::max(logit_scale, std::fabs(want.data()[i]));
    // The worst logit error, relative to the largest logit: bf16 keeps 8 bits of each weight (0.4%
    // at most), q8_0 rounds each to 1/254 of its block's largest. The tiny random models (width 32)
    // measure 1.2% (bf16) and 1.9% (q8_0) for the Llama, 0.8% and 2.0% for GPT-2; bounded at 5%,
    // while a wrong tensor layout or scale errs by the logits' whole size.
    for (const auto& [type_name, tolerance] : std::vector<std::pair<std::string, float>>{{"f32", 0.0f}, {"bf16", 0.05f}, {"q8_0", 0.05f}}) {
      CAPTURE(type_name);
      const std::string path = test::process_path(c.model + "." + type_name + ".gguf");
      nn::export_gguf({original.model, *original.tokenizer, original.chat_template}, path,
                      nn::parse_gguf_export_type(type_name));
      const io::GgufFile file = io::GgufFile::open(path);
      CHECK(file.at("general.architecture").as_string() == c.arch);
      if (type_name == "f32") {
        const io::GgufFile published = io::GgufFile::open((models_dir / c.model / (c.model + ".f32.gguf")).string());
        CHECK(file.tensors().size() == published.tensors().size());
        for (const io::GgufTensor& t : published.tensors()) {
          CAPTURE(t.name);
          const io::GgufTensor* ours = file.find_tensor(t.name);
          REQUIRE(ours != nullptr);
          CHECK(ours->shape == t.shape);
          CHECK(std::equal(t.data.begin(), t.data.end(), ours->data.begin(), ours->data.end()));
        }
        std::vector<std::string> keys = c.keys;
        keys.insert(keys.end(), {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"});
        for (const std::string& key : keys) CHECK_MESSAGE(file.at(key).as_int() == published.at(key).as_int(), key);
        CHECK(file.at("tokenizer.ggml.tokens").as_strings() == published.at("tokenizer.ggml.tokens").as_strings());
        CHECK(file.at("tokenizer.ggml.merges").as_strings() == published.at("tokenizer.ggml.merges").as_strings());
        CHECK(file.at("tokenizer.ggml.token_type").as_ints() == published.at("tokenizer.ggml.token_type").as_ints());
      } else {
        const quant::TensorType matrices = type_name == "bf16" ? quant::TensorType::BF16 : quant::TensorType::Q8_0;
        CHECK(file.find_tensor(c.matrix)->type == matrices);
        CHECK(file.find_tensor(c.vector)->type == quant::TensorType::F32);  // vectors stay f32
      }
      const nn::PretrainedModel reloaded = nn::load_pretrained(path);
      const Tensor got = logits_of(reloaded, ids);
      const float error = max_abs_difference(got, want) / logit_scale;
      MESSAGE(c.model, " ", type_name, ": worst logit error ", error, " of the largest logit ", logit_scale);
      CHECK(error <= tolerance);
      if (type_name == "f32") CHECK(same_bits(got, want));
      if (type_name != "f32") CHECK(error > 0);  // the rounding did happen
      check_same_tokenizer(original, reloaded);
    }
  }
}

TEST_CASE("a GGUF export pads the token list up to the model's vocabulary, and the padded file loads") {
  nn::PretrainedModel original = nn::load_pretrained((models_dir / "tiny_llama").string());
  // A tokenizer of fewer tokens than the model's 320 rows: its first 300 tokens, merges among them.
  tokenizers::BpeVocab vocab = dynamic_cast<const tokenizers::ByteLevelBpe&>(*original.tokenizer).vocab();
  vocab.tokens.resize(300);
  if (!vocab.token_types.empty()) vocab.token_types.resize(300);
  std::erase_if(vocab.merges, [&](const std::string& merge) {
    const std::string merged = merge.substr(0, merge.find(' ')) + merge.substr(merge.find(' ') + 1);
    return std::find(vocab.tokens.begin(), vocab.tokens.end(), merged) == vocab.tokens.end() ||
           std::find(vocab.tokens.begin(), vocab.tokens.end(), merge.substr(0, merge.find(' '))) == vocab.tokens.end() ||
           std::find(vocab.tokens.begin(), vocab.tokens.end(), merge.substr(merge.find(' ') + 1)) == vocab.tokens.end();
  });
  const auto smaller = tokenizers::ByteLevelBpe::from_vocab(vocab);
  const std::string path = test::process_path("padded.gguf");
  nn::export_gguf({original.model, smaller, original.chat_template}, path, nn::GgufExportType::F32);
  const io::GgufFile file = io::GgufFile::open(path);
  const auto& tokens = file.at("tokenizer.ggml.tokens").as_strings();
  REQUIRE(tokens.size() == 320);
  CHECK(tokens[300] == "[PAD300]");
  CHECK(file.at("tokenizer.ggml.token_type").as_ints()[319] == 5);  // unused
  CHECK(nn::load_pretrained(path).model.config().vocab == 320);
}

TEST_CASE("exports refuse what they cannot write and leave no damaged or temporary files") {
  const nn::PretrainedModel tiny = nn::load_pretrained((models_dir / "tiny_llama").string());
  const nn::LanguageModel rotary(nn::rotary_decoder(320, 16, 2, 1, 8));
  const std::string dir = test::process_path("refused_hf");
  CHECK(contains(error_of<std::invalid_argument>([&] { nn::export_hf({rotary, *tiny.tokenizer, std::nullopt}, dir); }),
                 dir + ": only Llama and GPT-2 models export (this model is 'rotary')"));
  const auto chars = tokenizers::CharTokenizer::from_text("abc");
  CHECK(contains(error_of<std::invalid_argument>([&] { nn::export_gguf({tiny.model, chars, std::nullopt}, dir + ".gguf", nn::GgufExportType::F32); }),
                 ": only a byte-level BPE tokenizer exports (this one is 'char')"));
  CHECK(contains(error_of<std::invalid_argument>([] { nn::parse_gguf_export_type("q4_0"); }),
                 "export type 'q4_0' is not one of f32, bf16, q8_0"));
  CHECK(!fs::exists(dir));

  // A folder export that fails part-way (a full disk in model.safetensors) leaves the previous
  // export as it was and no temporary folder; a later export replaces it whole.
  nn::export_hf({tiny.model, *tiny.tokenizer, std::nullopt}, dir);
  const std::string before = test::slurp(fs::path(dir) / "tokenizer_config.json");
  detail::safetensors_fail_after_bytes = 100;
  CHECK(contains(error_of<std::runtime_error>([&] { nn::export_hf({tiny.model, *tiny.tokenizer, tiny.chat_template}, dir); }),
                 "model.safetensors: write failed after 100 bytes"));
  CHECK(test::slurp(fs::path(dir) / "tokenizer_config.json") == before);
  CHECK(!fs::exists(dir + ".tmp." + std::to_string(::getpid())));
  nn::export_hf({tiny.model, *tiny.tokenizer, tiny.chat_template}, dir);
  CHECK(nn::load_pretrained(dir).chat_template == tiny.chat_template);
  CHECK(!fs::exists(dir + ".old." + std::to_string(::getpid())));

  // q8_0 refuses a non-finite weight, naming it; the file is not written.
  nn::PretrainedModel broken = nn::load_pretrained((models_dir / "tiny_llama").string());
  broken.model.params().front().var.mutable_value().data()[5] = std::nanf("");
  const std::string q8 = test::process_path("broken.q8_0.gguf");
  CHECK(contains(error_of<std::invalid_argument>([&] { nn::export_gguf({broken.model, *broken.tokenizer, std::nullopt}, q8, nn::GgufExportType::Q8_0); }),
                 "parameter 'embed.weight' holds nan at element 5"));
  CHECK(!fs::exists(q8));
}

TEST_CASE("transformers loads the Hugging Face exports (Llama, GPT-2) to tapegrad's logits within 1e-5 and the gguf package reads the GGUF export (bench/.venv)") {
  const std::string python = test::bench_python("transformers, gguf");
  if (python.empty()) return;  // the exports are read back by tapegrad's readers above
  for (const auto& [model, arch] : {std::pair<std::string, std::string>{"tiny_llama", "llama"}, {"tiny_gpt2", "gpt2"}}) {
    CAPTURE(model);
    const nn::PretrainedModel original = nn::load_pretrained((models_dir / model).string());
    const std::string dir = test::process_path(model + "_python_hf"),
                      gguf = test::process_path(model + "_python.q8_0.gguf");
    nn::export_hf({original.model, *original.tokenizer, original.chat_template}, dir);
    nn::export_gguf({original.model, *original.tokenizer, original.chat_template}, gguf, nn::GgufExportType::Q8_0);
    const std::vector<std::int32_t> ids = probe_ids(original);
    const Tensor logits = logits_of(original, ids);
    nlohmann::json expected = {{"text", kText}, {"ids", ids}, {"logits", std::vector<float>(logits.data(), logits.data() + logits.size())},
                               {"chat_template", *original.chat_template}, {"gguf_arch", arch}};
    const std::string expected_path = test::process_path("expected.json"), out = test::process_path("check_export.out");
    std::ofstream(expected_path) << expected.dump();
    const std::string command = fmt::format("OMP_NUM_THREADS=1 HF_HUB_DISABLE_PROGRESS_BARS=1 '{}' '{}/scripts/check_export.py' '{}' '{}' '{}' > '{}' 2>&1",
                                            python, TAPEGRAD_SOURCE_DIR, dir, gguf, expected_path, out);
    const int status = std::system(command.c_str());
    const std::string output = test::slurp(out);
    MESSAGE(output);
    CHECK(status == 0);
    CHECK(contains(output, "transformers: logits within 1e-5"));
    CHECK(contains(output, "gguf: read"));
  }
}
