// The byte-level BPE pre-tokenizers on PCRE2 in UTF and UCP mode (\p{L}, \p{N} and \s by Unicode
// properties), compiled once and JIT-compiled; each split gets its own match data, so one
// PreTokenizer serves every thread.
#include "tokenizers/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <stdexcept>

namespace tapegrad::tokenizers {

namespace {

// Hugging Face tokenizers' ByteLevel(use_regex=True) pattern (GPT-2's encoder.py, without its
// <|endoftext|> alternative), and the Split pattern of Llama 3's tokenizer.json.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Unicode's White_Space, which Oniguruma's \s (Hugging Face's regex engine) matches. PCRE2's \s
// differs: it also matches U+180E MONGOLIAN VOWEL SEPARATOR, a format character since Unicode 6.3.
constexpr const char* kWhiteSpace = R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// The pattern with \s and \S spelled as classes of kWhiteSpace, inside and outside brackets.
std::string with_unicode_white_space(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char escaped = pattern[++i];
      if (escaped == 's') out += in_class ? std::string(kWhiteSpace) : fmt::format("[{}]", kWhiteSpace);
      else if (escaped == 'S' && !in_class) out += fmt::format("[^{}]", kWhiteSpace);
      else if (escaped == 'S') throw std::logic_error("pre-tokenizer regex: \\S inside a class is not translated");
      else out += {c, escaped};
      continue;
    }
    if (c == '[') in_class = true;
    else if (c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;

  explicit Regex(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &error,
                         &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw std::logic_error(fmt::format("pre-tokenizer regex /{}/ does not compile at offset {}: {}", pattern, offset,
                                         reinterpret_cast<const char*>(message)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) pcre2_match interprets
  }
  ~Regex() { pcre2_code_free(code); }

  // Appends the matches of the regex in text and the gaps between them (Hugging Face's Split with
  // the "Isolated" behaviour).
  void split_isolated(std::string_view text, std::vector<std::string_view>& pieces) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
        pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
    if (!match) throw std::bad_alloc();
    auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::size_t gap_start = 0, at = 0;
    while (at < text.size()) {
      int found = pcre2_match(code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
      // JIT's machine stack runs out on pathological inputs (a megabyte of spaces); the
      // interpreter keeps its backtracking on the heap.
      if (found == PCRE2_ERROR_JIT_STACKLIMIT)
        found = pcre2_match(code, subject, text.size(), at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, match.get(), nullptr);
      if (found == PCRE2_ERROR_NOMATCH) break;
      if (found < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(found, message, sizeof message);
        throw std::runtime_error(fmt::format("pre-tokenizer: matching at byte {} failed: {}", at,
                                             reinterpret_cast<const char*>(message)));
      }
      const PCRE2_SIZE* bounds = pcre2_get_ovector_pointer(match.get());
      std::size_t begin = bounds[0], end = bounds[1];
      if (end == begin) {  // none of our patterns matches empty; step over one character if one does
        ++at;
        while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
        continue;
      }
      if (begin > gap_start) pieces.push_back(text.substr(gap_start, begin - gap_start));
      pieces.push_back(text.substr(begin, end - begin));
      gap_start = at = end;
    }
    if (gap_start < text.size()) pieces.push_back(text.substr(gap_start));
  }
};

PreTokenizer::PreTokenizer(std::string name, std::string pattern, bool digits_first, bool ignore_merges)
    : name_(std::move(name)), pattern_(std::move(pattern)), digits_first_(digits_first), ignore_merges_(ignore_merges),
      regex_(std::make_unique<Regex>(with_unicode_white_space(pattern_))),
      digit_regex_(digits_first ? std::make_unique<Regex>(R"(\p{N})") : nullptr) {}

PreTokenizer::~PreTokenizer() = default;

std::string PreTokenizer::known_names() { return "gpt2 (or gpt-2), smollm, llama3 (or llama-bpe)"; }

const PreTokenizer& PreTokenizer::named(std::string_view name) {
  static const PreTokenizer gpt2("gpt2", kGpt2Pattern, false, false);
  static const PreTokenizer smollm("smollm", kGpt2Pattern, true, false);
  static const PreTokenizer llama3("llama3", kLlama3Pattern, false, true);
  if (name == "gpt2" || name == "gpt-2") return gpt2;
  if (name == "smollm") return smollm;
  if (name == "llama3" || name == "llama-bpe") return llama3;
  throw std::invalid_argument(
      fmt::format("unknown pre-tokenizer \"{}\" (known: {})", name, known_names()));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  if (!digits_first_) return regex_->split_isolated(text, pieces);
  std::vector<std::string_view> digit_pieces;
  digit_regex_->split_isolated(text, digit_pieces);
  for (std::string_view piece : digit_pieces) regex_->split_isolated(piece, pieces);
}

}  // namespace tapegrad::tokenizers
