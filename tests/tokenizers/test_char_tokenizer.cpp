// The character tokenizer: its ids, its errors, and its rebuilding from checkpoint metadata.
#include <doctest/doctest.h>

#include "support/helpers.h"
#include "tokenizers/char_tokenizer.h"

using namespace tapegrad;
using namespace tapegrad::tokenizers;

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
  CHECK(test::error_of([&] { tok.encode("a\xC3"); }) == "invalid UTF-8 at byte offset 1: truncated sequence");
  CHECK(test::error_of([] { CharTokenizer::from_text(""); }) == "CharTokenizer: the text is empty");
  CHECK(test::contains(test::error_of([] { CharTokenizer::from_vocab("ba"); }), "not a sorted list"));
}

TEST_CASE("a character tokenizer is rebuilt from its metadata, and metadata without a tokenizer kind is characters") {
  CharTokenizer tok = CharTokenizer::from_text("hello, wörld\n");
  const Tokenizer& as_interface = tok;
  CHECK(as_interface.kind() == "char");
  CHECK(as_interface.vocab_size() == 11);
  CHECK(as_interface.token_bytes(10) == "ö");
  CHECK(!as_interface.bos_id());
  CHECK(as_interface.end_ids().empty());
  auto metadata = tok.to_metadata();
  CHECK(metadata == std::map<std::string, std::string>{{"tokenizer", "char"}, {"vocab", "\n ,dehlorwö"}});
  CHECK(tokenizer_from_metadata(metadata)->encode("wörld") == tok.encode("wörld"));
  CHECK(tokenizer_from_metadata({{"vocab", "abc"}})->encode("cab") == std::vector<std::int32_t>{2, 0, 1});
  CHECK(test::error_of([] { tokenizer_from_metadata({{"tokenizer", "char"}}); }) ==
        "tokenizer metadata: a \"char\" tokenizer needs the field \"vocab\"");
  CHECK(test::contains(test::error_of([] { tokenizer_from_metadata({{"tokenizer", "wordpiece"}}); }),
                       "unknown tokenizer \"wordpiece\""));
}
