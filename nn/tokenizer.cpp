// UTF-8 decoding (RFC 3629) and the character tokenizer.
#include "nn/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace tapegrad::nn {

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  std::size_t i = 0;
  auto fail = [&](const char* why) {
    return std::invalid_argument(fmt::format("invalid UTF-8 at byte offset {}: {}", i, why));
  };
  while (i < text.size()) {
    unsigned char b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    std::size_t length;
    char32_t c, min;
    if ((b & 0xE0) == 0xC0) length = 2, c = b & 0x1F, min = 0x80;
    else if ((b & 0xF0) == 0xE0) length = 3, c = b & 0x0F, min = 0x800;
    else if ((b & 0xF8) == 0xF0) length = 4, c = b & 0x07, min = 0x10000;
    else throw fail((b & 0xC0) == 0x80 ? "unexpected continuation byte" : "invalid lead byte");
    if (i + length > text.size()) throw fail("truncated sequence");
    for (std::size_t k = 1; k < length; ++k) {
      unsigned char cont = static_cast<unsigned char>(text[i + k]);
      if ((cont & 0xC0) != 0x80) throw fail("missing continuation byte");
      c = (c << 6) | (cont & 0x3F);
    }
    if (c < min) throw fail("overlong encoding");
    if (c >= 0xD800 && c <= 0xDFFF) throw fail("UTF-16 surrogate");
    if (c > 0x10FFFF) throw fail("code point beyond U+10FFFF");
    out.push_back(c);
    i += length;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xC0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(char(0xE0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  }
}

std::string describe_char(char32_t c) {
  if (c >= 0x20 && c < 0x7F && c != '\'') return fmt::format("'{}'", char(c));
  std::string printable;
  if (c >= 0xA0) append_utf8(printable, c);
  return printable.empty() ? fmt::format("U+{:04X}", std::uint32_t(c)) : fmt::format("'{}' (U+{:04X})", printable, std::uint32_t(c));
}

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

std::string CharTokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  for (std::int32_t id : ids) {
    if (id < 0 || std::size_t(id) >= chars_.size())
      throw std::out_of_range(fmt::format("CharTokenizer: id {} is outside the vocabulary of size {}", id, chars_.size()));
    append_utf8(out, chars_[std::size_t(id)]);
  }
  return out;
}

std::string CharTokenizer::vocab() const {
  std::string out;
  for (char32_t c : chars_) append_utf8(out, c);
  return out;
}

}  // namespace tapegrad::nn
