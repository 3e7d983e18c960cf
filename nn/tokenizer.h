// 0.1's names of the character tokenizer and the UTF-8 functions, which moved to tokenizers/
// (namespace tapegrad::tokenizers); kept in tapegrad::nn until 0.3 (README.md, "Versions").
#pragma once

#include <string>
#include <string_view>

#include "tokenizers/char_tokenizer.h"
#include "tokenizers/utf8.h"

namespace tapegrad::nn {

/// 0.1's name of tokenizers::CharTokenizer.
using CharTokenizer [[deprecated("use tokenizers::CharTokenizer (tokenizers/char_tokenizer.h)")]] =
    tokenizers::CharTokenizer;

/// 0.1's name of tokenizers::decode_utf8.
[[deprecated("use tokenizers::decode_utf8 (tokenizers/utf8.h)")]] inline std::u32string decode_utf8(
    std::string_view text) {
  return tokenizers::decode_utf8(text);
}

/// 0.1's name of tokenizers::append_utf8.
[[deprecated("use tokenizers::append_utf8 (tokenizers/utf8.h)")]] inline void append_utf8(std::string& out,
                                                                                            char32_t c) {
  tokenizers::append_utf8(out, c);
}

/// 0.1's name of tokenizers::describe_char.
[[deprecated("use tokenizers::describe_char (tokenizers/utf8.h)")]] inline std::string describe_char(char32_t c) {
  return tokenizers::describe_char(c);
}

}  // namespace tapegrad::nn
