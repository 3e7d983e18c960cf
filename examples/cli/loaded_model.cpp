// LoadedModel from a checkpoint or a published model.
#include "cli/loaded_model.h"

#include <fmt/format.h>

#include "cli/program.h"
#include "nn/checkpoint.h"
#include "nn/lora.h"
#include "nn/pretrained.h"
#include "tokenizers/char_tokenizer.h"

namespace tapegrad::examples {

void ModelSource::add_options(CLI::App& app) {
  app.add_option("--checkpoint", checkpoint, "A checkpoint written by train (this or --model)");
  app.add_option("--model", model,
                 "A published model: a GGUF file or a Hugging Face folder (config.json, safetensors, tokenizer.json)");
}

void ModelSource::add_weights_option(CLI::App& app) {
  app.add_option("--weights", weights,
                 "How --model's matrices are held: f32 (dequantized), file (the file's blocks, interleaved), or "
                 "converted to bf16, f16, q8_0, q4_0 or q4_1 (docs/quantization.md)")
      ->check(CLI::IsMember({"f32", "file", "bf16", "f16", "q8_0", "q4_0", "q4_1"}));
}

void ModelSource::add_cache_option(CLI::App& app) {
  app.add_option("--kv-cache", kv_cache,
                 "What the KV cache holds each key and value as: f32, or f16 (half the cache's memory and of the "
                 "bytes attention reads, as llama.cpp's default; the results move a little: docs/quantization.md)")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
}

void ModelSource::add_lora_option(CLI::App& app) {
  app.add_option("--lora", lora,
                 "A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) applied on top of the "
                 "model");
}

LoadedModel ModelSource::load() const {
  if (checkpoint.empty() == model.empty())
    throw UsageError(checkpoint.empty() ? "give --checkpoint FILE or --model PATH"
                                        : "give --checkpoint or --model, not both");
  LoadedModel loaded = [&]() -> LoadedModel {
    if (!model.empty()) {
      nn::PretrainedModel pretrained = nn::load_pretrained(model, {.weights = weights});
      return {std::move(pretrained.model), std::move(pretrained.tokenizer), std::move(pretrained.chat_template), model};
    }
    if (weights != "f32") throw UsageError("--weights applies to a published model (--model), not to --checkpoint");
    nn::LoadedModelCheckpoint checkpoint_file = nn::load_model_checkpoint(checkpoint);  // any registered arch
    std::optional<std::string> chat_template = checkpoint_file.chat_template();
    return {std::move(checkpoint_file.model), std::move(checkpoint_file.tokenizer), std::move(chat_template),
            checkpoint};
  }();
  if (!lora.empty()) nn::load_peft_adapter(lora, loaded.model);
  return loaded;
}

tokenizers::ChatTemplate chat_template_of(const LoadedModel& loaded, const std::string& override_name) {
  if (!override_name.empty()) return tokenizers::ChatTemplate::named(override_name);
  if (!loaded.chat_template)
    throw UsageError(fmt::format("{} has no chat template; name one with --chat-template chatml|llama3|FILE",
                                 loaded.path));
  return tokenizers::ChatTemplate::recognise(*loaded.chat_template, loaded.path);
}

std::vector<std::int32_t> encode_prompt(const tokenizers::Tokenizer& tokenizer, std::string_view text) {
  std::vector<std::int32_t> ids;
  if (tokenizer.add_bos() && tokenizer.bos_id()) ids.push_back(*tokenizer.bos_id());
  std::vector<std::int32_t> body = tokenizer.encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

}  // namespace tapegrad::examples
