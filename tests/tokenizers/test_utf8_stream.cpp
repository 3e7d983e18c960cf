// The streaming UTF-8 decoder: characters split across pushes, invalid bytes as U+FFFD, random
// pieces equal to the whole.
#include <doctest/doctest.h>

#include "core/random.h"
#include "support/helpers.h"
#include "tokenizers/utf8.h"
#include "tokenizers/utf8_stream.h"

using namespace tapegrad;
using namespace tapegrad::tokenizers;

namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::string random_bytes(Rng& rng, std::size_t n) {
  // Bytes at the edges of UTF-8's ranges, so that every kind of sequence, valid or not, turns up.
  static constexpr unsigned char kPool[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
                                            0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF};
  std::string bytes;
  for (std::size_t i = 0; i < n; ++i) bytes.push_back(char(kPool[rng.below(sizeof kPool)]));
  return bytes;
}

}  // namespace

TEST_CASE("a character split across pushes comes out whole once its last byte arrives") {
  Utf8Stream stream;
  CHECK(stream.push("h\xC3") == "h");
  CHECK(stream.pending() == 1);
  CHECK(stream.push("\xA9!") == "\xC3\xA9!");
  for (char byte : std::string("\xF0\x9F\x98")) CHECK(stream.push(std::string(1, byte)).empty());
  CHECK(stream.pending() == 3);
  CHECK(stream.push("\x80") == "\xF0\x9F\x98\x80");
  CHECK(stream.pending() == 0);
  CHECK(stream.flush().empty());
}

TEST_CASE("invalid bytes become U+FFFD as Python's errors=\"replace\" makes them, and never throw") {
  // Python 3's bytes.decode("utf-8", "replace") of each input.
  const std::pair<std::string, std::string> cases[] = {
      {"a\xFF" "b", "a" + kFffd + "b"},
      {"\xE2\x82x", kFffd + "x"},
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},          // a surrogate: ED's second byte stops at 9F
      {"\xC0\xAF", kFffd + kFffd},                      // overlong
      {"\xF4\x90\x80\x80", kFffd + kFffd + kFffd + kFffd},  // past U+10FFFF
      {"\xE0\x80\x80", kFffd + kFffd + kFffd},
      {"\xF0\x9F\x98\x80\x80", "\xF0\x9F\x98\x80" + kFffd},
  };
  for (const auto& [bytes, want] : cases) {
    CHECK(replace_invalid_utf8(bytes) == want);
    Utf8Stream stream;
    CHECK(stream.push(bytes) + stream.flush() == want);
  }
  Utf8Stream stream;
  CHECK(stream.push("ok\xF0\x9F").size() == 2);
  CHECK(stream.flush() == kFffd);  // an incomplete tail at the end
  CHECK(stream.pending() == 0);
}

TEST_CASE("random bytes pushed in random pieces give valid UTF-8 and what the whole gives at once") {
  Rng rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string bytes = random_bytes(rng, rng.below(24));
    Utf8Stream stream;
    std::string out;
    for (std::size_t at = 0; at < bytes.size();) {
      std::size_t n = std::min<std::size_t>(bytes.size() - at, 1 + rng.below(4));
      std::string piece = stream.push(std::string_view(bytes).substr(at, n));
      CHECK_NOTHROW(validate_utf8(piece));
      CHECK(stream.pending() <= 3);
      out += piece;
      at += n;
    }
    out += stream.flush();
    INFO("trial ", trial);
    CHECK(out == replace_invalid_utf8(bytes));
  }
}

TEST_CASE("valid UTF-8 passes through the stream unchanged, whatever the pieces") {
  std::string text;
  for (char32_t c : std::u32string(U"a\u00e9\u20ac\U0001F600 z\U0010FFFF\u0800")) append_utf8(text, c);
  for (std::size_t piece = 1; piece <= 5; ++piece) {
    Utf8Stream stream;
    std::string out;
    for (std::size_t at = 0; at < text.size(); at += piece) out += stream.push(std::string_view(text).substr(at, piece));
    CHECK(stream.pending() == 0);
    CHECK(out == text);
  }
}
