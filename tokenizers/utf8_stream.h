// A streaming UTF-8 decoder for generation and serving: a token's bytes may end mid-character, so
// complete characters pass on and an incomplete tail waits for the next token. Never throws:
// invalid bytes become U+FFFD, one per maximal ill-formed subpart (Unicode's recommended practice,
// as Python's errors="replace" does).
#pragma once

#include <string>
#include <string_view>

namespace tapegrad::tokenizers {

class Utf8Stream {
 public:
  /// Appends bytes; returns the longest prefix of what was pushed and not yet returned that holds
  /// only complete characters, invalid sequences replaced by U+FFFD. A tail that may still become a
  /// character (at most 3 bytes) is held back.
  std::string push(std::string_view bytes);
  /// Returns what is held back, an incomplete tail as U+FFFD, and empties the stream.
  std::string flush();
  /// The bytes held back (0 to 3).
  std::size_t pending() const { return pending_.size(); }

 private:
  std::string pending_;
};

/// bytes with every invalid sequence replaced by U+FFFD, as Utf8Stream's push and flush give it.
std::string replace_invalid_utf8(std::string_view bytes);

}  // namespace tapegrad::tokenizers
