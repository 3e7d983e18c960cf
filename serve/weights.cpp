// Loading the server's weights: tapegrad checkpoints, published models, and a chat template given
// on the command line.
#include "serve/weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/fnv1a.h"
#include "nn/checkpoint.h"
#include "nn/lora.h"
#include "nn/pretrained.h"
#include "tokenizers/char_tokenizer.h"

namespace tapegrad::serve {

namespace {

// FNV-1a over a file's bytes, or over a folder's files in name order: enough to tell two models
// apart in a fingerprint.
std::uint64_t content_hash(const std::filesystem::path& path, std::uint64_t hash = kFnv1a64Start) {
  if (std::filesystem::is_directory(path)) {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(path))
      if (entry.is_regular_file()) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const auto& file : files) hash = content_hash(file, hash);
    return hash;
  }
  std::ifstream in(path, std::ios::binary);
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    hash = fnv1a64(buffer, std::size_t(in.gcount()), hash);
    if (!in) break;
  }
  return hash;
}

std::string fingerprint(std::uint64_t step, std::uint64_t hash) {
  return fmt::format("fp_{}_{:012x}", step, hash & 0xffffffffffffull);
}

// --chat-template's template, when given, in place of the file's own.
void use_chat_template(Weights& weights, const std::string& name) {
  if (name.empty()) return;
  weights.chat_template = tokenizers::ChatTemplate::named(name);
  weights.no_chat_template.clear();
}

// --lora's adapter on top of the model, its files folded into the fingerprint's hash.
void apply_lora(nn::LanguageModel& model, const std::string& lora, std::uint64_t& hash) {
  if (lora.empty()) return;
  nn::load_peft_adapter(lora, model);
  hash = content_hash(lora, hash);
}

}  // namespace

std::shared_ptr<const Weights> load_weights(const std::string& path, const std::string& chat_template,
                                            const std::string& lora) {
  std::uint64_t hash = content_hash(path);
  nn::LoadedModelCheckpoint loaded = nn::load_model_checkpoint(path);
  apply_lora(loaded.model, lora, hash);
  loaded.model.set_training(false);
  std::uint64_t step = 0;
  if (auto it = loaded.metadata.find("step"); it != loaded.metadata.end()) {
    try {
      step = std::stoull(it->second);
    } catch (const std::exception&) {
      step = 0;  // a checkpoint not written by training: its step is unknown
    }
  }
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer = std::move(loaded.tokenizer);
  Weights weights{.model = std::move(loaded.model),
                  .tokenizer = tokenizer,
                  .end_ids = tokenizer->end_ids(),
                  .no_chat_template = fmt::format("the checkpoint {} has no chat template", path),
                  .metadata = std::move(loaded.metadata),
                  .format = "checkpoint",
                  .step = step,
                  .fingerprint = fingerprint(step, hash)};
  use_chat_template(weights, chat_template);
  return std::make_shared<const Weights>(std::move(weights));
}

std::shared_ptr<const Weights> load_pretrained_weights(const std::string& path, const std::string& chat_template,
                                                       const std::string& lora, const std::string& weights_format) {
  std::uint64_t hash = content_hash(path);
  nn::PretrainedModel loaded = nn::load_pretrained(path, {.weights = weights_format});
  apply_lora(loaded.model, lora, hash);
  loaded.model.set_training(false);
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer = std::move(loaded.tokenizer);
  Weights weights{.model = std::move(loaded.model),
                  .tokenizer = tokenizer,
                  .end_ids = tokenizer->end_ids(),
                  .format = loaded.format,
                  .fingerprint = fingerprint(0, hash)};
  if (!loaded.chat_template) {
    weights.no_chat_template = fmt::format("the model {} has no chat template", path);
  } else {
    // A template the server does not recognise leaves completions working: only chat requests
    // are refused, with the reason.
    try {
      weights.chat_template = tokenizers::ChatTemplate::recognise(*loaded.chat_template, path);
    } catch (const std::invalid_argument& e) {
      weights.no_chat_template = e.what();
    }
  }
  use_chat_template(weights, chat_template);
  return std::make_shared<const Weights>(std::move(weights));
}

}  // namespace tapegrad::serve
