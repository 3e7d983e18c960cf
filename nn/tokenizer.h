// CharTokenizer: one id per Unicode code point of the text, ids in code-point order, and
// the strict UTF-8 decoding it stands on.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad::nn {

/// Code points of UTF-8 text. Throws std::invalid_argument naming the byte offset of the first
/// invalid sequence (stray continuation, truncation, overlong form, surrogate, > U+10FFFF).
std::u32string decode_utf8(std::string_view text);
/// Appends the UTF-8 form of one code point.
void append_utf8(std::string& out, char32_t c);
/// A printable description of a character for error messages: 'a', U+000A.
std::string describe_char(char32_t c);

/// One token per character: ids are the ranks of the code points in the sorted vocabulary.
class CharTokenizer {
 public:
  /// The sorted distinct code points of text; throws on invalid UTF-8 or an empty text.
  static CharTokenizer from_text(std::string_view text);
  /// The vocabulary as stored in checkpoints: the characters concatenated in id order.
  static CharTokenizer from_vocab(std::string_view vocab);

  /// Throws std::invalid_argument naming the first character outside the vocabulary and its position.
  std::vector<std::int32_t> encode(std::string_view text) const;
  /// Throws std::out_of_range naming an id >= size().
  std::string decode(std::span<const std::int32_t> ids) const;
  std::size_t size() const { return chars_.size(); }  ///< The number of characters (ids).
  std::string vocab() const;  ///< The characters concatenated in id order, as UTF-8.

 private:
  explicit CharTokenizer(std::u32string chars);
  std::u32string chars_;  // sorted, distinct
};

}  // namespace tapegrad::nn
