// A training text as the example programs use it: read, checked as UTF-8, tokenized (by its own
// characters, tokenizers::CharTokenizer, or by a model's tokenizer), and split into the first 90%
// (training) and the last 10% (validation) of its ids.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tokenizers/char_tokenizer.h"
#include "tokenizers/tokenizer.h"

namespace tapegrad::examples {

struct Corpus {
  std::string path;
  /// The sorted distinct characters of the whole text (corpus_of_characters), or a model's own.
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;
  std::vector<std::int32_t> ids;  // the whole text, encoded
  std::size_t train_size = 0;     // ids[0, train_size) trains, ids[train_size, end) validates
  std::uint64_t fingerprint = 0;  // FNV-1a 64 of the file's bytes: a resume checks it is the same text

  std::span<const std::int32_t> train() const { return std::span(ids).first(train_size); }
  std::span<const std::int32_t> validation() const { return std::span(ids).subspan(train_size); }
  /// What an id stands for, in messages: "characters" for a character vocabulary, else "tokens".
  std::string unit() const;
};

/// A text tokenized by its own characters, from the file's bytes already read (train's rank 0
/// reads). An empty file or invalid UTF-8 throws std::runtime_error naming the file (and the byte
/// offset of bad UTF-8).
Corpus corpus_of_characters(const std::string& path, const std::string& bytes);
/// The same text encoded whole by a model's tokenizer (no BOS: windows start anywhere). Text the
/// tokenizer cannot encode throws naming the file and the character.
Corpus corpus_of_tokens(const std::string& path, const std::string& bytes,
                        std::shared_ptr<const tokenizers::Tokenizer> tokenizer);
/// A corpus from ids another process encoded (the other ranks of a data-parallel run), split alike.
Corpus corpus_of_ids(const std::string& path, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
                     std::vector<std::int32_t> ids, std::uint64_t fingerprint);

/// The first `limit` ids of a file's text (all of them when limit is 0) under an existing
/// tokenizer; text it cannot encode (a character outside a character vocabulary, invalid UTF-8)
/// throws naming the file, the character and its position.
std::vector<std::int32_t> encode_file(const std::string& path, const tokenizers::Tokenizer& tokenizer,
                                      std::size_t limit);

}  // namespace tapegrad::examples
