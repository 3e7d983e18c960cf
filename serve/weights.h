// What the server decodes with: a model, its tokenizer and chat template, read from a tapegrad
// checkpoint (reloaded when the file changes) or from a published model (.gguf or a Hugging Face
// folder, loaded once).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/language_model.h"
#include "tokenizers/chat_template.h"
#include "tokenizers/tokenizer.h"

namespace tapegrad::serve {

/// One loaded model: its weights, vocabulary, chat template, and the fingerprint that names them.
struct Weights {
  nn::LanguageModel model;                                ///< in evaluation mode
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;  ///< the file's tokenizer
  std::vector<std::int32_t> end_ids;                      ///< tokenizer->end_ids(): a sample ends at one
  /// The template /v1/chat/completions renders, if the file has one the server recognises or
  /// --chat-template gave one.
  std::optional<tokenizers::ChatTemplate> chat_template;
  /// Why there is no chat template (the file has none, or one not recognised): a chat request's
  /// error says it, and how to give one with --chat-template.
  std::string no_chat_template;
  std::map<std::string, std::string> metadata;  ///< a checkpoint's metadata (empty for --model)
  std::string format;                           ///< "checkpoint", or load_pretrained's format
  std::uint64_t step = 0;                       ///< the training step that wrote it (0 if absent)
  std::string fingerprint;                      ///< "fp_<step>_<hash of the file's bytes>"
};

/// Reads a tapegrad checkpoint of any architecture; throws (naming the file) like
/// load_model_checkpoint. chat_template, if not empty, is --chat-template's "chatml", "llama3" or
/// file (ChatTemplate::named; one not recognised throws). lora, if not empty, is a PEFT LoRA
/// folder applied on top (nn::load_peft_adapter), its files part of the fingerprint.
std::shared_ptr<const Weights> load_weights(const std::string& path, const std::string& chat_template = "",
                                            const std::string& lora = "");

/// Reads a published model, a .gguf file or a Hugging Face folder (nn::load_pretrained), with its
/// own chat template when it has one the server recognises, or chat_template as load_weights; lora
/// as load_weights; its matrices held as `weights` says (nn::LoadOptions::weights: f32, file, bf16,
/// f16, q8_0, q4_0, q4_1).
std::shared_ptr<const Weights> load_pretrained_weights(const std::string& path, const std::string& chat_template = "",
                                                       const std::string& lora = "", const std::string& weights = "f32");

}  // namespace tapegrad::serve
