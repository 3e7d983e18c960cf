// The character tokenizer: ids are ranks in the sorted distinct code points.
#include "tokenizers/char_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "tokenizers/utf8.h"

namespace tapegrad::tokenizers {

CharTokenizer::CharTokenizer(std::u32string chars) : chars_(std::move(chars)) {}

CharTokenizer CharTokenizer::from_text(std::string_view text) {
  std::u32string chars = decode_utf8(text);
  if (chars.empty()) throw std::invalid_argument("CharTokenizer: the text is empty");
  std::sort(chars.begin(), chars.end());
  chars.erase(std::unique(chars.begin(), chars.end()), chars.end());
  return CharTokenizer(std::move(chars));
}

CharTokenizer CharTokenizer::from_vocab(std::string_view vocab) {
  std::u32string chars = decode_utf8(vocab);
  if (chars.empty()) throw std::invalid_argument("CharTokenizer: the vocabulary is empty");
  if (!std::is_sorted(chars.begin(), chars.end()) || std::adjacent_find(chars.begin(), chars.end()) != chars.end())
    throw std::invalid_argument("CharTokenizer: the vocabulary is not a sorted list of distinct characters");
  return CharTokenizer(std::move(chars));
}

std::vector<std::int32_t> CharTokenizer::encode(std::string_view text) const {
  std::u32string chars = decode_utf8(text);
  std::vector<std::int32_t> ids(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) {
    auto it = std::lower_bound(chars_.begin(), chars_.end(), chars[i]);
    if (it == chars_.end() || *it != chars[i])
      throw std::invalid_argument(fmt::format("character {} at position {} is not in the vocabulary of {} characters",
                                              describe_char(chars[i]), i, chars_.size()));
    ids[i] = std::int32_t(it - chars_.begin());
  }
  return ids;
}

std::string CharTokenizer::token_bytes(std::int32_t id) const {
  if (id < 0 || std::size_t(id) >= chars_.size())
    throw std::out_of_range(fmt::format("CharTokenizer: id {} is outside the vocabulary of size {}", id, chars_.size()));
  std::string out;
  append_utf8(out, chars_[std::size_t(id)]);
  return out;
}

std::map<std::string, std::string> CharTokenizer::to_metadata() const {
  return {{"tokenizer", "char"}, {"vocab", vocab()}};
}

std::string CharTokenizer::vocab() const {
  std::string out;
  for (char32_t c : chars_) append_utf8(out, c);
  return out;
}

}  // namespace tapegrad::tokenizers
