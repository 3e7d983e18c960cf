// libFuzzer target: arbitrary bytes as corpus text or a prompt. Valid UTF-8 must round-trip
// through the tokenizer exactly; invalid UTF-8 must be refused with its byte offset.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "tokenizers/char_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    tapegrad::tokenizers::CharTokenizer tokenizer = tapegrad::tokenizers::CharTokenizer::from_text(text);
    if (tokenizer.decode(tokenizer.encode(text)) != text) __builtin_trap();
    if (tapegrad::tokenizers::CharTokenizer::from_vocab(tokenizer.vocab()).vocab() != tokenizer.vocab()) __builtin_trap();
  } catch (const std::invalid_argument& e) {
    std::string message = e.what();
    if (size > 0 && message.rfind("invalid UTF-8 at byte offset ", 0) != 0) __builtin_trap();
  }
  return 0;
}
