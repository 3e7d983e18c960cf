// CharTokenizer: one id per Unicode code point of the text, ids in code-point order.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizers/tokenizer.h"

namespace tapegrad::tokenizers {

/// One token per character: ids are the ranks of the code points in the sorted vocabulary.
class CharTokenizer : public Tokenizer {
 public:
  /// The sorted distinct code points of text; throws on invalid UTF-8 or an empty text.
  static CharTokenizer from_text(std::string_view text);
  /// The vocabulary as stored in checkpoints: the characters concatenated in id order.
  static CharTokenizer from_vocab(std::string_view vocab);

  std::string kind() const override { return "char"; }
  /// Throws std::invalid_argument naming the first character outside the vocabulary and its position.
  std::vector<std::int32_t> encode(std::string_view text) const override;
  /// Throws std::out_of_range naming an id >= size().
  std::string token_bytes(std::int32_t id) const override;
  std::size_t vocab_size() const override { return chars_.size(); }
  /// {"tokenizer": "char", "vocab": vocab()}.
  std::map<std::string, std::string> to_metadata() const override;

  std::size_t size() const { return chars_.size(); }  ///< The number of characters (ids).
  std::string vocab() const;  ///< The characters concatenated in id order, as UTF-8.

 private:
  explicit CharTokenizer(std::u32string chars);
  std::u32string chars_;  // sorted, distinct
};

}  // namespace tapegrad::tokenizers
