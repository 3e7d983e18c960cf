// Strict UTF-8 (RFC 3629): decoding that names the byte offset of the first invalid sequence,
// encoding of one code point, and a printable description of a character for error messages.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tapegrad::tokenizers {

/// One character of UTF-8 text: its code point and length in bytes, or why the bytes are invalid.
struct Utf8Char {
  char32_t code_point = 0;
  std::size_t length = 0;
  const char* error = nullptr;  ///< null when the bytes are a valid character
};
/// The character starting at byte `at` (< text.size()) of text.
Utf8Char next_utf8_char(std::string_view text, std::size_t at);

/// Code points of UTF-8 text. Throws std::invalid_argument naming the byte offset of the first
/// invalid sequence (stray continuation, truncation, overlong form, surrogate, > U+10FFFF).
std::u32string decode_utf8(std::string_view text);
/// Throws what decode_utf8 throws on invalid text, without building the code points.
void validate_utf8(std::string_view text);
/// Appends the UTF-8 form of one code point.
void append_utf8(std::string& out, char32_t c);
/// A printable description of a character for error messages: 'a', U+000A.
std::string describe_char(char32_t c);

}  // namespace tapegrad::tokenizers
