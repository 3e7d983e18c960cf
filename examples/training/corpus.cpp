// Reading, checking, tokenizing and splitting a text file.
#include "training/corpus.h"

#include <fmt/format.h>

#include <stdexcept>

#include "cli/program.h"
#include "core/fnv1a.h"
#include "tokenizers/utf8.h"

namespace tapegrad::examples {

namespace {
std::u32string decode_file(const std::string& path, const std::string& bytes) {
  if (bytes.empty()) throw std::runtime_error(fmt::format("{}: the file is empty; a text to read is needed", path));
  try {
    return tokenizers::decode_utf8(bytes);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: {}", path, e.what()));
  }
}

std::string encode_utf8(std::u32string_view chars) {
  std::string out;
  for (char32_t c : chars) tokenizers::append_utf8(out, c);
  return out;
}
}  // namespace

std::string Corpus::unit() const { return tokenizer->kind() == "char" ? "characters" : "tokens"; }

Corpus corpus_of_ids(const std::string& path, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
                     std::vector<std::int32_t> ids, std::uint64_t fingerprint) {
  Corpus corpus{path, std::move(tokenizer), std::move(ids), 0, fingerprint};
  corpus.train_size = corpus.ids.size() * 9 / 10;
  return corpus;
}

Corpus corpus_of_characters(const std::string& path, const std::string& bytes) {
  decode_file(path, bytes);  // checks before the tokenizer sees it, so errors name the file
  auto chars = std::make_shared<const tokenizers::CharTokenizer>(tokenizers::CharTokenizer::from_text(bytes));
  std::vector<std::int32_t> ids = chars->encode(bytes);
  return corpus_of_ids(path, std::move(chars), std::move(ids), fnv1a64(bytes));
}

Corpus corpus_of_tokens(const std::string& path, const std::string& bytes,
                        std::shared_ptr<const tokenizers::Tokenizer> tokenizer) {
  decode_file(path, bytes);
  std::vector<std::int32_t> ids;
  try {
    ids = tokenizer->encode(bytes);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: {} of the model", path, e.what()));
  }
  return corpus_of_ids(path, std::move(tokenizer), std::move(ids), fnv1a64(bytes));
}

std::vector<std::int32_t> encode_file(const std::string& path, const tokenizers::Tokenizer& tokenizer,
                                      std::size_t limit) {
  std::u32string chars = decode_file(path, read_file(path));
  // A character vocabulary's ids are the characters: cut the text first, so that characters past
  // the limit are never looked up. Other tokenizers' ids are cut after encoding.
  if (limit > 0 && chars.size() > limit && tokenizer.kind() == "char") chars.resize(limit);
  try {
    std::vector<std::int32_t> ids = tokenizer.encode(encode_utf8(chars));
    if (limit > 0 && ids.size() > limit) ids.resize(limit);
    return ids;
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: {} of the model", path, e.what()));
  }
}

}  // namespace tapegrad::examples
