// GPT-2's byte-to-unicode alphabet and its inverse.
#include "tokenizers/byte_alphabet.h"

#include <array>

#include "tokenizers/utf8.h"

namespace tapegrad::tokenizers {

namespace {

bool stands_for_itself(unsigned b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

// Every character of the alphabet is below U+0144 (U+0100 + 68 stand-ins).
constexpr char32_t kAlphabetEnd = 0x144;

struct Alphabet {
  std::array<char32_t, 256> char_of_byte{};
  std::array<std::string, 256> utf8_of_byte;
  std::array<int, kAlphabetEnd> byte_of_char{};  // -1 for a character outside the alphabet
  Alphabet() {
    byte_of_char.fill(-1);
    char32_t next_stand_in = 0x100;
    for (unsigned b = 0; b < 256; ++b) {
      char_of_byte[b] = stands_for_itself(b) ? char32_t(b) : next_stand_in++;
      byte_of_char[char_of_byte[b]] = int(b);
      append_utf8(utf8_of_byte[b], char_of_byte[b]);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet table;
  return table;
}

}  // namespace

char32_t byte_to_alphabet(unsigned char b) { return alphabet().char_of_byte[b]; }

std::string bytes_to_alphabet(std::string_view bytes) {
  const Alphabet& table = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) out += table.utf8_of_byte[static_cast<unsigned char>(b)];
  return out;
}

std::optional<std::string> alphabet_to_bytes(std::string_view text) {
  const Alphabet& table = alphabet();
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    Utf8Char next = next_utf8_char(text, i);
    if (next.error) return std::nullopt;
    if (next.code_point >= kAlphabetEnd || table.byte_of_char[next.code_point] < 0) return std::nullopt;
    out.push_back(static_cast<char>(table.byte_of_char[next.code_point]));
    i += next.length;
  }
  return out;
}

}  // namespace tapegrad::tokenizers
