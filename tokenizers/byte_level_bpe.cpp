// Byte-level BPE: the vocabulary's checks and tables, the special-token split, and the merge loop
// (a heap of candidate pairs ordered by rank, then position, as Hugging Face and llama.cpp order
// them: a long piece costs O(n log n), not a rescan of every pair per merge).
#include "tokenizers/byte_level_bpe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <queue>
#include <set>
#include <stdexcept>

#include "tokenizers/byte_alphabet.h"
#include "tokenizers/pre_tokenizer.h"
#include "tokenizers/tokenizer_json.h"
#include "tokenizers/utf8.h"

namespace tapegrad::tokenizers {

namespace {

constexpr std::int32_t kControlToken = 3, kUserDefinedToken = 4;  // GGUF tokenizer.ggml.token_type

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (std::uint64_t(std::uint32_t(left)) << 32) | std::uint32_t(right);
}

std::invalid_argument vocab_error(const std::string& what) {
  return std::invalid_argument("BPE vocabulary: " + what);
}

void check_id(std::int32_t id, std::size_t vocab_size, std::string_view field) {
  if (id < 0 || std::size_t(id) >= vocab_size)
    throw vocab_error(fmt::format("{} {} is outside the {} tokens", field, id, vocab_size));
}

}  // namespace

ByteLevelBpe ByteLevelBpe::from_vocab(BpeVocab vocab) { return ByteLevelBpe(std::move(vocab)); }

ByteLevelBpe::ByteLevelBpe(BpeVocab vocab) : vocab_(std::move(vocab)) {
  const std::size_t size = vocab_.tokens.size();
  if (size == 0) throw vocab_error("no tokens");
  if (size > std::size_t(INT32_MAX)) throw vocab_error(fmt::format("{} tokens do not fit int32 ids", size));
  if (!vocab_.token_types.empty() && vocab_.token_types.size() != size)
    throw vocab_error(fmt::format("{} token types for {} tokens", vocab_.token_types.size(), size));
  pre_ = &PreTokenizer::named(vocab_.pre);
  vocab_.pre = pre_->name();

  std::set<std::int32_t> special(vocab_.special_ids.begin(), vocab_.special_ids.end());
  for (std::size_t id = 0; id < vocab_.token_types.size(); ++id)
    if (vocab_.token_types[id] == kControlToken || vocab_.token_types[id] == kUserDefinedToken) special.insert(std::int32_t(id));
  for (std::int32_t id : special) check_id(id, size, "special token id");
  vocab_.special_ids.assign(special.begin(), special.end());
  if (vocab_.bos) check_id(*vocab_.bos, size, "bos id");
  if (vocab_.unk) check_id(*vocab_.unk, size, "unk id");
  if (vocab_.add_bos && !vocab_.bos) throw vocab_error("add_bos is set but there is no bos id");
  for (std::int32_t id : vocab_.end_ids) check_id(id, size, "end id");

  bytes_.resize(size);
  for (std::size_t id = 0; id < size; ++id) {
    const std::string& text = vocab_.tokens[id];
    if (special.count(std::int32_t(id))) {
      if (text.empty()) throw vocab_error(fmt::format("special token {} is empty", id));
      bytes_[id] = text;
      specials_.emplace_back(text, std::int32_t(id));
      starts_special_[static_cast<unsigned char>(text[0])] = true;
      continue;
    }
    // A token outside the alphabet (none in GPT-2's, SmolLM2's or Llama 3's vocabularies) is never
    // produced by merges of bytes; it decodes as its own text.
    std::optional<std::string> bytes = alphabet_to_bytes(text);
    bytes_[id] = bytes ? std::move(*bytes) : text;
    id_of_text_.emplace(text, std::int32_t(id));  // the first of duplicated texts wins
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  for (unsigned b = 0; b < 256; ++b) {
    std::string text = bytes_to_alphabet(std::string(1, char(b)));
    auto it = id_of_text_.find(text);
    byte_ids_[b] = it != id_of_text_.end() ? it->second : vocab_.unk.value_or(-1);
  }

  merges_.reserve(vocab_.merges.size());
  for (std::size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
    const std::string& merge = vocab_.merges[rank];
    std::size_t space = merge.find(' ');
    if (space == std::string::npos || merge.find(' ', space + 1) != std::string::npos)
      throw vocab_error(fmt::format("merge {} \"{}\" is not two tokens separated by one space", rank, merge));
    auto id_of = [&](const std::string& text) {
      auto it = id_of_text_.find(text);
      if (it == id_of_text_.end()) throw vocab_error(fmt::format("merge {} \"{}\": \"{}\" is not a token", rank, merge, text));
      return it->second;
    };
    std::string left = merge.substr(0, space), right = merge.substr(space + 1);
    std::int32_t left_id = id_of(left), right_id = id_of(right);
    Merge entry{std::int32_t(rank), id_of(left + right)};
    merges_.emplace(pair_key(left_id, right_id), entry);  // a repeated merge keeps its first rank
  }
}

std::optional<std::int32_t> ByteLevelBpe::special_id(std::string_view text) const {
  for (const auto& [special, id] : specials_)
    if (special == text) return id;
  return std::nullopt;
}

std::string ByteLevelBpe::token_bytes(std::int32_t id) const {
  if (id < 0 || std::size_t(id) >= bytes_.size())
    throw std::out_of_range(fmt::format("ByteLevelBpe: id {} is outside the vocabulary of size {}", id, bytes_.size()));
  return bytes_[std::size_t(id)];
}

std::vector<std::int32_t> ByteLevelBpe::encode(std::string_view text) const {
  validate_utf8(text);
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  // Leftmost special token first, the longest where several start at one byte (as Hugging Face's
  // added-token matcher); the text between them goes through the pre-tokenizer and merges.
  std::size_t plain_start = 0;
  for (std::size_t at = 0; at < text.size(); ++at) {
    if (!starts_special_[static_cast<unsigned char>(text[at])]) continue;
    for (const auto& [special, id] : specials_) {
      if (text.compare(at, special.size(), special) != 0) continue;
      encode_ordinary(text.substr(plain_start, at - plain_start), ids);
      ids.push_back(id);
      at += special.size() - 1;
      plain_start = at + 1;
      break;
    }
  }
  encode_ordinary(text.substr(plain_start), ids);
  return ids;
}

void ByteLevelBpe::encode_ordinary(std::string_view text, std::vector<std::int32_t>& ids) const {
  if (text.empty()) return;
  std::vector<std::string_view> pieces;
  pre_->split(text, pieces);
  for (std::string_view piece : pieces) encode_piece(piece, ids);
}

void ByteLevelBpe::encode_piece(std::string_view piece, std::vector<std::int32_t>& ids) const {
  if (piece.size() == 1) {
    if (std::int32_t id = byte_ids_[static_cast<unsigned char>(piece[0])]; id >= 0) ids.push_back(id);
    return;
  }
  if (pre_->ignore_merges()) {
    auto whole = id_of_text_.find(bytes_to_alphabet(piece));
    if (whole != id_of_text_.end()) {
      ids.push_back(whole->second);
      return;
    }
  }
  // The piece's symbols as a doubly linked list over its bytes; a merge folds the right symbol
  // into the left one. Candidates go stale when a neighbour merges first and are skipped then.
  struct Symbol {
    std::int32_t id, prev, next;
  };
  struct Candidate {
    std::int32_t rank, left, left_id, right_id, merged;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  for (char byte : piece) {
    std::int32_t id = byte_ids_[static_cast<unsigned char>(byte)];
    if (id < 0) continue;
    auto at = std::int32_t(symbols.size());
    symbols.push_back({id, at - 1, at + 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  const auto n = std::int32_t(symbols.size());
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> candidates;
  auto consider = [&](std::int32_t left) {
    if (left < 0) return;
    std::int32_t right = symbols[std::size_t(left)].next;
    if (right < 0) return;
    std::int32_t left_id = symbols[std::size_t(left)].id, right_id = symbols[std::size_t(right)].id;
    auto merge = merges_.find(pair_key(left_id, right_id));
    if (merge != merges_.end()) candidates.push({merge->second.rank, left, left_id, right_id, merge->second.merged});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!candidates.empty()) {
    Candidate best = candidates.top();
    candidates.pop();
    Symbol& left = symbols[std::size_t(best.left)];
    if (left.id != best.left_id || left.next < 0 || symbols[std::size_t(left.next)].id != best.right_id) continue;
    Symbol& right = symbols[std::size_t(left.next)];
    left.id = best.merged;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0) symbols[std::size_t(left.next)].prev = best.left;
    consider(left.prev);
    consider(best.left);
  }
  for (std::int32_t i = 0; i >= 0; i = symbols[std::size_t(i)].next) ids.push_back(symbols[std::size_t(i)].id);
}

std::map<std::string, std::string> ByteLevelBpe::to_metadata() const {
  return {{"tokenizer", "bpe"},
          {"tokenizer.json", to_tokenizer_json()},
          {"tokenizer.bos_id", vocab_.bos ? std::to_string(*vocab_.bos) : ""},
          {"tokenizer.add_bos", vocab_.add_bos ? "true" : "false"},
          {"tokenizer.end_ids", fmt::format("{}", fmt::join(vocab_.end_ids, ","))}};
}

namespace {

std::int32_t metadata_id(std::string_view text, std::string_view field) {
  std::int32_t id = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (error != std::errc() || end != text.data() + text.size())
    throw std::invalid_argument(fmt::format("tokenizer metadata: \"{}\" holds \"{}\", not an id", field, text));
  return id;
}

}  // namespace

ByteLevelBpe ByteLevelBpe::from_metadata(const std::map<std::string, std::string>& metadata) {
  auto field = [&](const std::string& name) -> const std::string& {
    auto it = metadata.find(name);
    if (it == metadata.end())
      throw std::invalid_argument(fmt::format("tokenizer metadata: a \"bpe\" tokenizer needs the field \"{}\"", name));
    return it->second;
  };
  BpeVocab vocab = bpe_vocab_from_tokenizer_json(field("tokenizer.json"), "tokenizer metadata \"tokenizer.json\"");
  const std::string& bos = field("tokenizer.bos_id");
  vocab.bos = bos.empty() ? std::nullopt : std::optional(metadata_id(bos, "tokenizer.bos_id"));
  const std::string& add_bos = field("tokenizer.add_bos");
  if (add_bos != "true" && add_bos != "false")
    throw std::invalid_argument(fmt::format("tokenizer metadata: \"tokenizer.add_bos\" holds \"{}\", not true or false", add_bos));
  vocab.add_bos = add_bos == "true";
  vocab.end_ids.clear();
  std::string_view end_ids = field("tokenizer.end_ids");
  while (!end_ids.empty()) {
    std::size_t comma = std::min(end_ids.find(','), end_ids.size());
    vocab.end_ids.push_back(metadata_id(end_ids.substr(0, comma), "tokenizer.end_ids"));
    end_ids.remove_prefix(std::min(comma + 1, end_ids.size()));
  }
  return from_vocab(std::move(vocab));
}

}  // namespace tapegrad::tokenizers
