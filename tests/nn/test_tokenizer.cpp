#include <doctest/doctest.h>

#include "nn/tokenizer.h"
#include "support/helpers.h"

using namespace tapegrad;
using namespace tapegrad::nn;

TEST_CASE("the tokenizer's ids are the sorted distinct code points") {
  CharTokenizer tok = CharTokenizer::from_text("hello, wörld\n");
  CHECK(tok.size() == 11);
  CHECK(tok.vocab() == "\n ,dehlorwö");
  auto ids = tok.encode("wörld");
  CHECK(ids == std::vector<std::int32_t>{9, 10, 8, 6, 3});
  CHECK(tok.decode(ids) == "wörld");
  CHECK(CharTokenizer::from_vocab(tok.vocab()).encode("hello") == tok.encode("hello"));
}

TEST_CASE("unknown characters, bad ids and invalid UTF-8 are named") {
  CharTokenizer tok = CharTokenizer::from_text("abc");
  CHECK(test::error_of([&] { tok.encode("abz"); }) == "character 'z' at position 2 is not in the vocabulary of 3 characters");
  CHECK(test::error_of([&] { tok.encode("a\n"); }) == "character U+000A at position 1 is not in the vocabulary of 3 characters");
  CHECK(test::error_of([&] { tok.decode(std::vector<std::int32_t>{3}); }) == "CharTokenizer: id 3 is outside the vocabulary of size 3");
  CHECK(test::error_of([] { decode_utf8("ab\x80"); }) == "invalid UTF-8 at byte offset 2: unexpected continuation byte");
  CHECK(test::error_of([] { decode_utf8("a\xC3"); }) == "invalid UTF-8 at byte offset 1: truncated sequence");
  CHECK(test::error_of([] { decode_utf8("\xC0\xAF"); }) == "invalid UTF-8 at byte offset 0: overlong encoding");
  CHECK(test::error_of([] { decode_utf8("x\xED\xA0\x80"); }) == "invalid UTF-8 at byte offset 1: UTF-16 surrogate");
  CHECK(test::error_of([] { decode_utf8("\xF4\x90\x80\x80"); }) == "invalid UTF-8 at byte offset 0: code point beyond U+10FFFF");
  CHECK(test::error_of([] { decode_utf8("\xFF"); }) == "invalid UTF-8 at byte offset 0: invalid lead byte");
  CHECK(test::error_of([] { CharTokenizer::from_text(""); }) == "CharTokenizer: the text is empty");
  CHECK(test::contains(test::error_of([] { CharTokenizer::from_vocab("ba"); }), "not a sorted list"));
}

TEST_CASE("UTF-8 round-trips every kind of code point") {
  std::u32string all = {U'a', U'\u00e9', U'\u20ac', U'\U0001F600', U'\U0010FFFF'};
  std::string text;
  for (char32_t c : all) append_utf8(text, c);
  CHECK(decode_utf8(text) == all);
}
