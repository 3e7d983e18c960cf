// libFuzzer target: arbitrary bytes as a Hugging Face tokenizer.json, then (after a NUL byte, when
// there is one) a text to encode with it. Reading must give a vocabulary or one
// std::invalid_argument naming the file; a vocabulary the tokenizer accepts must encode any text to
// ids within it, or refuse invalid UTF-8 with its byte offset.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "tokenizers/byte_level_bpe.h"
#include "tokenizers/tokenizer_json.h"

using namespace tapegrad::tokenizers;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string_view json = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
  BpeVocab vocab;
  try {
    vocab = bpe_vocab_from_tokenizer_json(json, "tok.json");
  } catch (const std::invalid_argument& e) {
    if (!std::string_view(e.what()).starts_with("tok.json: ")) __builtin_trap();
    return 0;
  }
  std::optional<ByteLevelBpe> tokenizer;
  try {
    tokenizer.emplace(ByteLevelBpe::from_vocab(std::move(vocab)));
  } catch (const std::invalid_argument&) {  // merges naming no tokens, ids out of range, ...
    return 0;
  }
  try {
    for (std::int32_t id : tokenizer->encode(text))
      if (id < 0 || std::size_t(id) >= tokenizer->vocab_size()) __builtin_trap();
  } catch (const std::invalid_argument& e) {
    if (!std::string_view(e.what()).starts_with("invalid UTF-8 at byte offset ")) __builtin_trap();
  }
  return 0;
}
