// Published models from the files they come in: a GGUF file or a Hugging Face folder becomes a
// LanguageModel of a registered architecture (llama, gpt2), its tokenizer and its chat template.
// The formats are read by io/, the tokenizers built by tokenizers/; what ties a file's names and
// config keys to an architecture is listed here once per architecture.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "nn/language_model.h"
#include "tokenizers/tokenizer.h"

namespace tapegrad::nn {

/// A model read from a published file.
struct PretrainedModel {
  LanguageModel model;                              ///< float32 weights, as the file's dequantized
  std::unique_ptr<tokenizers::Tokenizer> tokenizer;  ///< the file's own tokenizer
  /// The chat template's Jinja source (GGUF tokenizer.chat_template, tokenizer_config.json's
  /// chat_template or chat_template.jinja), when the file has one.
  std::optional<std::string> chat_template;
  std::string format;  ///< "gguf" or "hf"
};

/// How load_pretrained keeps a model's matrices (Linear weights, token embeddings).
struct LoadOptions {
  /// "f32": dequantized to float32, trainable (the default). "file": inference only (decoding
  /// through a KVCache), each matrix kept in the file's format where packed_matmul has kernels for
  /// it (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, BF16, F16, F32; interleaved at load), float32 otherwise. "bf16",
  /// "f16", "q8_0", "q4_0", "q4_1": inference only, every matrix converted (nn/packed_weights.h).
  /// The float32 copies of packed matrices are freed once loaded.
  std::string weights = "f32";
  /// Rematerialise each block in backward (Note [Remat]), as the config's remat: set here, a
  /// model for training with remat is built once, not rebuilt beside the loaded copy.
  bool remat = false;
};

/// Whether path names something load_pretrained reads: a folder, or a file that starts with GGUF's magic.
bool is_pretrained_path(const std::string& path);

/// Reads a GGUF file (any listed tensor type, dequantized to float32) or a Hugging Face folder
/// (config.json, safetensors, tokenizer.json) of a LlamaForCausalLM or GPT2LMHeadModel. Errors
/// name the file and the key or tensor at fault.
PretrainedModel load_pretrained(const std::string& path, const LoadOptions& options = {});

/// The tokenizer of a GGUF file or a Hugging Face folder alone, without reading the weights.
std::unique_ptr<tokenizers::Tokenizer> load_pretrained_tokenizer(const std::string& path);

}  // namespace tapegrad::nn
