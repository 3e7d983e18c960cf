// The pre-tokenizers of byte-level BPE: Unicode regexes (PCRE2) that cut text into the pieces
// BPE merges within. GPT-2's pattern; SmolLM's (every digit alone, then GPT-2's); Llama 3's.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad::tokenizers {

class PreTokenizer {
 public:
  /// "gpt2" (llama.cpp's "gpt-2"), "smollm" or "llama3" (llama.cpp's "llama-bpe"); throws
  /// std::invalid_argument naming the known ones. Compiled once, shared by every tokenizer.
  static const PreTokenizer& named(std::string_view name);
  static std::string known_names();  ///< "gpt2, smollm, llama3" for error messages

  const std::string& name() const { return name_; }  ///< the canonical name: gpt2, smollm or llama3
  const std::string& pattern() const { return pattern_; }  ///< the regex, as Hugging Face writes it
  bool digits_first() const { return digits_first_; }      ///< every \p{N} is a piece of its own first
  /// A piece that is a whole token is emitted as is, without merges (Llama 3's tokenizer.json).
  bool ignore_merges() const { return ignore_merges_; }

  /// Appends the pieces of text (valid UTF-8, unchecked) in order; together they are text.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

 private:
  struct Regex;
  PreTokenizer(std::string name, std::string pattern, bool digits_first, bool ignore_merges);
  std::string name_, pattern_;
  bool digits_first_, ignore_merges_;
  std::unique_ptr<Regex> regex_, digit_regex_;
};

}  // namespace tapegrad::tokenizers
