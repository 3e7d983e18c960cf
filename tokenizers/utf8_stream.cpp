// The streaming UTF-8 decoder: at each position, how many bytes form a well-formed prefix of a
// character (Unicode Table 3-7's ranges) decides between passing on, holding back and replacing.
#include "tokenizers/utf8_stream.h"

namespace tapegrad::tokenizers {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

struct Prefix {
  std::size_t matched;  // bytes of text that are a well-formed start of a character (0: a bad lead)
  std::size_t length;   // the bytes that character needs
};

// The well-formed prefix of the character starting text (non-empty). The second byte's range
// depends on the lead (no overlong forms, surrogates or code points past U+10FFFF); the others are
// 80..BF.
Prefix well_formed_prefix(std::string_view text) {
  const auto lead = static_cast<unsigned char>(text[0]);
  if (lead < 0x80) return {1, 1};
  std::size_t length;
  unsigned char low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) length = 2;
  else if (lead >= 0xE0 && lead <= 0xEF) length = 3, low = lead == 0xE0 ? 0xA0 : 0x80, high = lead == 0xED ? 0x9F : 0xBF;
  else if (lead >= 0xF0 && lead <= 0xF4) length = 4, low = lead == 0xF0 ? 0x90 : 0x80, high = lead == 0xF4 ? 0x8F : 0xBF;
  else return {0, 1};
  std::size_t matched = 1;
  while (matched < length && matched < text.size()) {
    const auto byte = static_cast<unsigned char>(text[matched]);
    if (byte < low || byte > high) break;
    low = 0x80, high = 0xBF;
    ++matched;
  }
  return {matched, length};
}

// Appends the valid characters of text, replacing ill-formed subparts; a tail that may still
// complete is appended too when `final`, else its length is returned.
std::size_t decode_into(std::string& out, std::string_view text, bool final) {
  std::size_t at = 0;
  while (at < text.size()) {
    Prefix prefix = well_formed_prefix(text.substr(at));
    if (prefix.matched == prefix.length) {
      out.append(text, at, prefix.length);
      at += prefix.length;
    } else if (!final && prefix.matched > 0 && at + prefix.matched == text.size()) {
      return text.size() - at;
    } else {
      out += kReplacement;
      at += prefix.matched > 0 ? prefix.matched : 1;
    }
  }
  return 0;
}

}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  std::size_t held = decode_into(out, pending_, false);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out;
  decode_into(out, pending_, true);
  pending_.clear();
  return out;
}

std::string replace_invalid_utf8(std::string_view bytes) {
  std::string out;
  decode_into(out, bytes, true);
  return out;
}

}  // namespace tapegrad::tokenizers
