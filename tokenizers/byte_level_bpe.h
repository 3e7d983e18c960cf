// Byte-level BPE (GPT-2, SmolLM2, Llama 3): text is cut by a pre-tokenizer regex, each piece's
// bytes start as one token each and adjacent pairs merge by rank, lowest first (Sennrich et al.
// 2016; Radford et al. 2019). Special tokens are matched whole before the regex runs.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizers/tokenizer.h"

namespace tapegrad::tokenizers {

class PreTokenizer;

/// A byte-level BPE vocabulary as GGUF files and tokenizer.json store it.
struct BpeVocab {
  /// By id, in GPT-2's byte-to-unicode alphabet (GGUF tokenizer.ggml.tokens, tokenizer.json
  /// model.vocab); special tokens as their plain text ("<|im_end|>").
  std::vector<std::string> tokens;
  std::vector<std::string> merges;        ///< "left right" in the alphabet; rank = index
  std::vector<std::int32_t> token_types;  ///< GGUF codes (1 normal, 3 control, 4 user-defined, ...); may be empty
  std::string pre;                        ///< the pre-tokenizer: "gpt2", "smollm" or "llama3" (pre_tokenizer.h)
  std::optional<std::int32_t> bos;
  /// Stands for a byte that has no token (tokenizer.json model.unk_token). Without one such a byte
  /// is dropped, as Hugging Face tokenizers and llama.cpp drop it: SmolLM2 has no token for the
  /// bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1 and 0xF2, so decode(encode(s)) == s holds
  /// only for text without them.
  std::optional<std::int32_t> unk;
  bool add_bos = false;                ///< a prompt starts with bos
  std::vector<std::int32_t> end_ids;   ///< end-of-text / end-of-turn ids that stop generation
  /// Tokens matched whole in text; with the control (3) and user-defined (4) ones of token_types.
  std::vector<std::int32_t> special_ids;
};

/// Immutable once built: encode may run on several threads at once.
class ByteLevelBpe : public Tokenizer {
 public:
  /// Checks the vocabulary whole: merges name tokens (and their concatenation), ids are in range,
  /// the pre-tokenizer is known. Throws std::invalid_argument naming the first fault.
  static ByteLevelBpe from_vocab(BpeVocab vocab);
  /// A Hugging Face tokenizer.json and, when given, its tokenizer_config.json (bos_token,
  /// eos_token, add_bos_token); tokenizer_json.h says what is understood.
  static ByteLevelBpe from_tokenizer_json(const std::string& path, const std::optional<std::string>& tokenizer_config_path);
  /// A tokenizer.json that Hugging Face tokenizers loads to the same ids.
  std::string to_tokenizer_json() const;

  std::string kind() const override { return "bpe"; }
  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string token_bytes(std::int32_t id) const override;
  std::size_t vocab_size() const override { return vocab_.tokens.size(); }
  std::optional<std::int32_t> bos_id() const override { return vocab_.bos; }
  bool add_bos() const override { return vocab_.add_bos; }
  std::vector<std::int32_t> end_ids() const override { return vocab_.end_ids; }
  std::optional<std::int32_t> special_id(std::string_view text) const override;
  /// {"tokenizer": "bpe", "tokenizer.json": to_tokenizer_json(), "tokenizer.bos_id": id or "",
  ///  "tokenizer.add_bos": "true"/"false", "tokenizer.end_ids": "2,3"}.
  std::map<std::string, std::string> to_metadata() const override;
  /// The inverse of to_metadata().
  static ByteLevelBpe from_metadata(const std::map<std::string, std::string>& metadata);

  /// The vocabulary it was built from, special_ids completed from token_types and sorted.
  const BpeVocab& vocab() const { return vocab_; }

 private:
  struct Merge {
    std::int32_t rank, merged;
  };
  explicit ByteLevelBpe(BpeVocab vocab);
  void encode_ordinary(std::string_view text, std::vector<std::int32_t>& ids) const;
  void encode_piece(std::string_view piece, std::vector<std::int32_t>& ids) const;

  BpeVocab vocab_;
  const PreTokenizer* pre_;
  std::vector<std::string> bytes_;                              // by id: what the token stands for
  std::unordered_map<std::string, std::int32_t> id_of_text_;    // ordinary tokens, in the alphabet
  std::array<std::int32_t, 256> byte_ids_{};                    // the one-byte tokens, else unk or -1
  std::unordered_map<std::uint64_t, Merge> merges_;             // (left id << 32 | right id) -> merge
  std::vector<std::pair<std::string, std::int32_t>> specials_;  // longest first
  std::array<bool, 256> starts_special_{};                      // first bytes of specials_
};

}  // namespace tapegrad::tokenizers
