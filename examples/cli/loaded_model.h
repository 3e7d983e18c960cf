// The model a program runs: a tapegrad checkpoint (--checkpoint) or a published model (--model:
// a GGUF file or a Hugging Face folder), with its tokenizer and chat template, behind one type
// so that generate, evaluate and tokenize treat both alike.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "nn/language_model.h"
#include "tokenizers/chat_template.h"
#include "tokenizers/tokenizer.h"

namespace tapegrad::examples {

/// A model, its tokenizer and (published models) its chat template.
struct LoadedModel {
  nn::LanguageModel model;
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;
  std::optional<std::string> chat_template;  ///< the file's Jinja source, if it has one
  std::string path;                          ///< what was loaded, for messages
};

/// Where a program's model comes from: --checkpoint FILE or --model PATH, exactly one, and a
/// LoRA adapter on top (--lora DIR, when the program offers it).
struct ModelSource {
  std::string checkpoint, model, lora;
  std::string weights = "f32";  ///< --weights: nn::LoadOptions::weights, for --model
  std::string kv_cache = "f32";  ///< --kv-cache: what the KV cache holds each key and value as
  /// Adds --weights f32|file|bf16|f16|q8_0|q4_0|q4_1 (inference only past f32: programs that decode).
  void add_weights_option(CLI::App& app);
  /// Adds --kv-cache f32|f16 (programs that decode through the cache).
  void add_cache_option(CLI::App& app);
  nn::KVCacheType cache_type() const { return kv_cache == "f16" ? nn::KVCacheType::f16 : nn::KVCacheType::f32; }
  /// Adds --checkpoint and --model to app.
  void add_options(CLI::App& app);
  /// Adds --lora DIR: a PEFT adapter folder (nn/lora.h) applied on top of the model.
  void add_lora_option(CLI::App& app);
  /// Loads the one given, and the adapter; a UsageError when neither or both are.
  LoadedModel load() const;
};

/// The model's chat template: `override_name` (--chat-template: chatml, llama3 or a file) when
/// given, else the file's own, recognised; a UsageError naming --chat-template when there is none.
tokenizers::ChatTemplate chat_template_of(const LoadedModel& loaded, const std::string& override_name);

/// The ids of a prompt: the tokenizer's BOS first when it asks for one.
std::vector<std::int32_t> encode_prompt(const tokenizers::Tokenizer& tokenizer, std::string_view text);

}  // namespace tapegrad::examples
