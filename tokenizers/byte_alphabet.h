// GPT-2's byte-to-unicode alphabet (openai/gpt-2 encoder.py, bytes_to_unicode): byte-level BPE
// vocabularies spell every byte as one printable character, so that tokens are readable strings.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tapegrad::tokenizers {

/// The character that stands for byte b: '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF stand for
/// themselves; the other 68 bytes, in increasing order, are U+0100, U+0101, ... (space is 'Ġ').
char32_t byte_to_alphabet(unsigned char b);
/// Every byte of bytes spelled in the alphabet, as UTF-8.
std::string bytes_to_alphabet(std::string_view bytes);
/// The bytes a token's text (UTF-8 in the alphabet) stands for; nullopt when the text is not valid
/// UTF-8 or holds a character outside the alphabet.
std::optional<std::string> alphabet_to_bytes(std::string_view text);

}  // namespace tapegrad::tokenizers
