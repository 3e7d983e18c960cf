// The interface every tokenizer implements (characters, byte-level BPE): text to ids and back,
// its special tokens, and the metadata a checkpoint records to rebuild it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad::tokenizers {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  ///< "char" or "bpe"
  /// Special tokens in the text are matched whole (BPE); invalid UTF-8 -> std::invalid_argument
  /// naming the byte offset.
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  /// The bytes one token stands for; std::out_of_range for a bad id.
  virtual std::string token_bytes(std::int32_t id) const = 0;
  /// The concatenated token_bytes (may end mid-character: see utf8_stream.h for generation).
  std::string decode(std::span<const std::int32_t> ids) const;
  virtual std::size_t vocab_size() const = 0;
  virtual std::optional<std::int32_t> bos_id() const { return {}; }
  virtual bool add_bos() const { return false; }  ///< prepend bos_id() when encoding a prompt
  /// The end-of-text / end-of-turn ids that stop generation.
  virtual std::vector<std::int32_t> end_ids() const { return {}; }
  /// The id of a special token given by its text, e.g. "<|im_end|>".
  virtual std::optional<std::int32_t> special_id(std::string_view /*text*/) const { return {}; }
  /// What a checkpoint records to rebuild it: {"tokenizer": kind(), ...}; tokenizer_from_metadata
  /// reads it back.
  virtual std::map<std::string, std::string> to_metadata() const = 0;
};

/// The tokenizer a checkpoint's metadata describes; metadata without "tokenizer" is a character
/// tokenizer (every checkpoint written before BPE). Throws std::invalid_argument on an unknown kind
/// or a missing field.
std::unique_ptr<Tokenizer> tokenizer_from_metadata(const std::map<std::string, std::string>& metadata);

}  // namespace tapegrad::tokenizers
