// GPT-2's byte alphabet: every byte one printable character, and back.
#include <doctest/doctest.h>

#include "tokenizers/byte_alphabet.h"

using namespace tapegrad::tokenizers;

TEST_CASE("GPT-2's alphabet spells each byte as one printable character and reads it back") {
  CHECK(byte_to_alphabet(' ') == U'\u0120');   // 'Ġ'
  CHECK(byte_to_alphabet('\n') == U'\u010A');  // 'Ċ'
  CHECK(byte_to_alphabet('a') == U'a');
  CHECK(byte_to_alphabet(0xAD) == U'\u0143');  // the last of the 68 stand-ins
  CHECK(bytes_to_alphabet(" hi\n") == "\u0120hi\u010A");
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte.push_back(char(b));
  CHECK(alphabet_to_bytes(bytes_to_alphabet(every_byte)) == every_byte);
  CHECK(!alphabet_to_bytes("\u0144"));  // past the stand-ins
  CHECK(!alphabet_to_bytes(" "));       // space stands for nothing: it is spelled 'Ġ'
  CHECK(!alphabet_to_bytes("\xC3"));    // not UTF-8
}
