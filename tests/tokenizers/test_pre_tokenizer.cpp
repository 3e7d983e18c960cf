// The pre-tokenizers' pieces against Hugging Face tokenizers 0.23's pre_tokenize_str (ByteLevel;
// Sequence[Digits(individual_digits), ByteLevel]; Sequence[Split(Llama 3's regex), ByteLevel]) on
// strings where the three differ: digits, case, CR LF runs, and white space PCRE2 and Oniguruma
// disagree on (U+180E is not white space since Unicode 6.3; U+0085 and U+3000 are).
#include <doctest/doctest.h>

#include "support/helpers.h"
#include "tokenizers/pre_tokenizer.h"

using namespace tapegrad;
using namespace tapegrad::tokenizers;

namespace {

std::vector<std::string> pieces_of(const std::string& pre, std::string_view text) {
  std::vector<std::string_view> pieces;
  PreTokenizer::named(pre).split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

using Pieces = std::vector<std::string>;

}  // namespace

TEST_CASE("the pre-tokenizers cut text where Hugging Face tokenizers cuts it") {
  const std::string text = "I'M  12345 don't\r\n\n  ok";
  CHECK(pieces_of("gpt2", text) == Pieces{"I", "'", "M", " ", " 12345", " don", "'t", "\r\n\n ", " ok"});
  CHECK(pieces_of("smollm", text) == Pieces{"I", "'", "M", "  ", "1", "2", "3", "4", "5", " don", "'t", "\r\n\n ", " ok"});
  CHECK(pieces_of("llama3", text) == Pieces{"I", "'M", " ", " ", "123", "45", " don", "'t", "\r\n\n", " ", " ok"});
  const std::string numbers = "\u00bd 1,000 \u0663\u0664";
  CHECK(pieces_of("gpt2", numbers) == Pieces{"\u00bd", " 1", ",", "000", " \u0663\u0664"});
  CHECK(pieces_of("smollm", numbers) == Pieces{"\u00bd", " ", "1", ",", "0", "0", "0", " ", "\u0663", "\u0664"});
  CHECK(pieces_of("llama3", numbers) == Pieces{"\u00bd", " ", "1", ",", "000", " ", "\u0663\u0664"});
}

TEST_CASE("white space is Unicode's White_Space, as Oniguruma matches \\s, not PCRE2's") {
  CHECK(pieces_of("gpt2", "a\u180eb  c") == Pieces{"a", "\u180e", "b", " ", " c"});
  CHECK(pieces_of("llama3", "a\u180eb  c") == Pieces{"a", "\u180eb", " ", " c"});
  CHECK(pieces_of("gpt2", "x \u3000y\u0085 z") == Pieces{"x", " ", "\u3000", "y", "\u0085", " z"});
  CHECK(pieces_of("llama3", "x \u3000y\u0085 z") == Pieces{"x", " ", "\u3000y", "\u0085", " z"});
}

TEST_CASE("pre-tokenizers are known by their names and llama.cpp's") {
  CHECK(PreTokenizer::named("gpt-2").name() == "gpt2");
  CHECK(PreTokenizer::named("llama-bpe").name() == "llama3");
  CHECK(PreTokenizer::named("llama3").ignore_merges());
  CHECK(!PreTokenizer::named("smollm").ignore_merges());
  CHECK(PreTokenizer::named("smollm").digits_first());
  CHECK(test::error_of([] { PreTokenizer::named("qwen2"); }) ==
        "unknown pre-tokenizer \"qwen2\" (known: gpt2 (or gpt-2), smollm, llama3 (or llama-bpe))");
}
