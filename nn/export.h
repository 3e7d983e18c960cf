// Exporting a model to the files other tools read: a Hugging Face folder (model.safetensors,
// config.json, tokenizer.json, tokenizer_config.json with the chat template) that transformers
// loads, and a GGUF file (f32, bf16 or q8_0) that llama.cpp and the gguf package read, each with
// the model's tokenizer and chat template. The inverse of load_pretrained (nn/pretrained.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "nn/language_model.h"
#include "tokenizers/tokenizer.h"

namespace tapegrad::nn {

/// What to export: the model (a Llama or a Gpt2), its byte-level BPE tokenizer, and its chat template.
struct ExportSource {
  const LanguageModel& model;                        ///< a Llama or a Gpt2
  const tokenizers::Tokenizer& tokenizer;            ///< its byte-level BPE
  const std::optional<std::string>& chat_template;  ///< the template text, if the model has one
};

/// Throws what export_hf and export_gguf would for a model that is neither a Llama nor a Gpt2, or a
/// tokenizer that is not a byte-level BPE, naming `target`; lets a program refuse an export before
/// it trains.
void check_exportable(const ExportSource& source, const std::string& target);

/// The tensor type of a GGUF export's matrices; vectors (the norms) stay f32, and a matrix whose
/// rows are not a whole number of q8_0 blocks (32) stays f32 too.
enum class GgufExportType { F32, BF16, Q8_0 };

/// "f32", "bf16" or "q8_0"; anything else throws std::invalid_argument listing them.
GgufExportType parse_gguf_export_type(std::string_view name);

/// Writes the folder `dir` atomically (it replaces an existing folder only once complete): float32
/// model.safetensors in LlamaForCausalLM's names and layout (q_proj and k_proj rows back in
/// rotate-half order) or GPT2LMHeadModel's (Conv1D weights (in, out), q, k and v fused in c_attn),
/// config.json, tokenizer.json and tokenizer_config.json (bos and eos tokens, add_bos_token,
/// chat_template). Throws naming dir, or the parameter or tokenizer that cannot go.
void export_hf(const ExportSource& source, const std::string& dir);

/// Writes the GGUF file `path` atomically: llama.* or gpt2.* sizes, tokenizer.ggml.* (model "gpt2", the
/// pre-tokenizer, tokens padded with "[PAD<id>]" up to the model's vocabulary, token types, merges,
/// bos/eos/unknown ids, add_bos_token), tokenizer.chat_template, and the tensors in llama.cpp's
/// names and layout (GPT-2's q, k, v fused in attn_qkv) as `type`. q8_0 refuses a parameter
/// holding a NaN or an infinity.
void export_gguf(const ExportSource& source, const std::string& path, GgufExportType type);

}  // namespace tapegrad::nn
