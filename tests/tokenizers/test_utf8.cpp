// UTF-8: invalid input refused with the byte offset and reason, round trips, printable descriptions.
#include <doctest/doctest.h>

#include "support/helpers.h"
#include "tokenizers/utf8.h"

using namespace tapegrad;
using namespace tapegrad::tokenizers;

TEST_CASE("invalid UTF-8 is refused naming the byte offset and the reason") {
  for (auto decode : {+[](std::string_view s) { decode_utf8(s); }, +[](std::string_view s) { validate_utf8(s); }}) {
    CHECK(test::error_of([&] { decode("ab\x80"); }) == "invalid UTF-8 at byte offset 2: unexpected continuation byte");
    CHECK(test::error_of([&] { decode("a\xC3"); }) == "invalid UTF-8 at byte offset 1: truncated sequence");
    CHECK(test::error_of([&] { decode("\xC0\xAF"); }) == "invalid UTF-8 at byte offset 0: overlong encoding");
    CHECK(test::error_of([&] { decode("x\xED\xA0\x80"); }) == "invalid UTF-8 at byte offset 1: UTF-16 surrogate");
    CHECK(test::error_of([&] { decode("\xF4\x90\x80\x80"); }) == "invalid UTF-8 at byte offset 0: code point beyond U+10FFFF");
    CHECK(test::error_of([&] { decode("\xFF"); }) == "invalid UTF-8 at byte offset 0: invalid lead byte");
    CHECK(test::error_of([&] { decode("\xE2\x82x"); }) == "invalid UTF-8 at byte offset 0: missing continuation byte");
  }
}

TEST_CASE("UTF-8 round-trips every kind of code point") {
  std::u32string all = {U'a', U'\u00e9', U'\u20ac', U'\U0001F600', U'\U0010FFFF'};
  std::string text;
  for (char32_t c : all) append_utf8(text, c);
  CHECK(decode_utf8(text) == all);
  CHECK_NOTHROW(validate_utf8(text));
}

TEST_CASE("characters are described printably for error messages") {
  CHECK(describe_char(U'a') == "'a'");
  CHECK(describe_char(U'\n') == "U+000A");
  CHECK(describe_char(U'\'') == "U+0027");
  CHECK(describe_char(U'\u00e9') == "'\u00e9' (U+00E9)");
}
