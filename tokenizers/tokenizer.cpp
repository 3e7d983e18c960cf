// What every tokenizer shares: decoding as concatenated token bytes, and rebuilding a tokenizer
// from a checkpoint's metadata.
#include "tokenizers/tokenizer.h"

#include <fmt/format.h>

#include <stdexcept>

#include "tokenizers/byte_level_bpe.h"
#include "tokenizers/char_tokenizer.h"

namespace tapegrad::tokenizers {

std::string Tokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  for (std::int32_t id : ids) out += token_bytes(id);
  return out;
}

namespace {

const std::string& field(const std::map<std::string, std::string>& metadata, const std::string& kind,
                         const std::string& name) {
  auto it = metadata.find(name);
  if (it == metadata.end())
    throw std::invalid_argument(fmt::format("tokenizer metadata: a \"{}\" tokenizer needs the field \"{}\"", kind, name));
  return it->second;
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_metadata(const std::map<std::string, std::string>& metadata) {
  auto kind_it = metadata.find("tokenizer");
  std::string kind = kind_it == metadata.end() ? "char" : kind_it->second;
  if (kind == "char") return std::make_unique<CharTokenizer>(CharTokenizer::from_vocab(field(metadata, kind, "vocab")));
  if (kind == "bpe") return std::make_unique<ByteLevelBpe>(ByteLevelBpe::from_metadata(metadata));
  throw std::invalid_argument(fmt::format("tokenizer metadata: unknown tokenizer \"{}\" (known: char, bpe)", kind));
}

}  // namespace tapegrad::tokenizers
