// Hugging Face tokenizer.json for byte-level BPE, read into a BpeVocab and written from one.
// Understood: model BPE (vocab, merges as "a b" or [a, b], ignore_merges), added_tokens (matched
// whole), no normalizer, the pre-tokenizers ByteLevel (gpt2), Sequence[Digits(individual_digits),
// ByteLevel] (smollm) and Sequence[Split(Llama 3's regex), ByteLevel(use_regex=false)] (llama3),
// and a TemplateProcessing post-processor that starts with a special token (bos added).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "tokenizers/byte_level_bpe.h"

namespace tapegrad::tokenizers {

/// The vocabulary of a tokenizer.json's text; source_name (a path) names it in errors, which are
/// std::invalid_argument naming the JSON path of the field. tokenizer_config.json's text, when
/// given, sets bos (bos_token), add_bos (add_bos_token) and end_ids (eos_token).
BpeVocab bpe_vocab_from_tokenizer_json(std::string_view json, std::string_view source_name,
                                       std::optional<std::string_view> config_json = std::nullopt,
                                       std::string_view config_name = "tokenizer_config.json");

/// A tokenizer.json Hugging Face tokenizers loads to the same ids (add_special_tokens adds bos when
/// add_bos is set). Throws std::invalid_argument when two ordinary tokens share a text (a JSON
/// vocabulary cannot hold both).
std::string bpe_vocab_to_tokenizer_json(const BpeVocab& vocab);

}  // namespace tapegrad::tokenizers
