// Strict UTF-8 decoding and encoding (RFC 3629).
#include "tokenizers/utf8.h"

#include <fmt/format.h>

#include <stdexcept>

namespace tapegrad::tokenizers {

Utf8Char next_utf8_char(std::string_view text, std::size_t at) {
  unsigned char b = static_cast<unsigned char>(text[at]);
  if (b < 0x80) return {b, 1};
  std::size_t length;
  char32_t c, min;
  if ((b & 0xE0) == 0xC0) length = 2, c = b & 0x1F, min = 0x80;
  else if ((b & 0xF0) == 0xE0) length = 3, c = b & 0x0F, min = 0x800;
  else if ((b & 0xF8) == 0xF0) length = 4, c = b & 0x07, min = 0x10000;
  else return {0, 0, (b & 0xC0) == 0x80 ? "unexpected continuation byte" : "invalid lead byte"};
  if (length > text.size() - at) return {0, 0, "truncated sequence"};
  for (std::size_t k = 1; k < length; ++k) {
    unsigned char cont = static_cast<unsigned char>(text[at + k]);
    if ((cont & 0xC0) != 0x80) return {0, 0, "missing continuation byte"};
    c = (c << 6) | (cont & 0x3F);
  }
  if (c < min) return {0, 0, "overlong encoding"};
  if (c >= 0xD800 && c <= 0xDFFF) return {0, 0, "UTF-16 surrogate"};
  if (c > 0x10FFFF) return {0, 0, "code point beyond U+10FFFF"};
  return {c, length};
}

namespace {

std::invalid_argument invalid_utf8(std::size_t at, const char* why) {
  return std::invalid_argument(fmt::format("invalid UTF-8 at byte offset {}: {}", at, why));
}

}  // namespace

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    Utf8Char next = next_utf8_char(text, i);
    if (next.error) throw invalid_utf8(i, next.error);
    out.push_back(next.code_point);
    i += next.length;
  }
  return out;
}

void validate_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    Utf8Char next = next_utf8_char(text, i);
    if (next.error) throw invalid_utf8(i, next.error);
    i += next.length;
  }
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

}  // namespace tapegrad::tokenizers
