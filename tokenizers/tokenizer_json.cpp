// Reading and writing Hugging Face tokenizer.json for byte-level BPE.
#include "tokenizers/tokenizer_json.h"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "tokenizers/pre_tokenizer.h"

namespace tapegrad::tokenizers {

namespace {

using nlohmann::json;

constexpr std::int32_t kNormalToken = 1, kControlToken = 3, kUserDefinedToken = 4;  // GGUF's codes

// One source's errors, each naming the source and the JSON path of the field.
struct Source {
  std::string_view name;

  std::invalid_argument error(std::string_view path, const std::string& what) const {
    return std::invalid_argument(fmt::format("{}: {}: {}", name, path, what));
  }
  json parse(std::string_view text) const {
    try {
      return json::parse(text);
    } catch (const json::parse_error& e) {
      throw std::invalid_argument(fmt::format("{}: not JSON: {}", name, e.what()));
    }
  }
  const json& member(const json& object, std::string_view path, const char* key) const {
    if (!object.is_object() || !object.contains(key)) throw error(path, fmt::format("no \"{}\"", key));
    return object[key];
  }
  std::string string(const json& value, std::string_view path) const {
    if (!value.is_string()) throw error(path, fmt::format("{} is not a string", value.dump()));
    return value.get<std::string>();
  }
  // object[key] (a string or a bool, as T), or fallback where object has no such key or it is null.
  template <class T>
  T optional(const json& object, std::string_view path, const char* key, T fallback) const {
    if (!object.is_object() || !object.contains(key) || object[key].is_null()) return fallback;
    const json& value = object[key];
    const std::string field = path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
    if constexpr (std::is_same_v<T, bool>) {
      if (!value.is_boolean()) throw error(field, fmt::format("{} is not true or false", value.dump()));
      return value.get<bool>();
    } else {
      return string(value, field);
    }
  }
};

// Whether a ByteLevel pre-tokenizer step is the one our pre-tokenizers run after their split.
bool is_byte_level(const json& step, std::string_view path, bool use_regex, const Source& source) {
  return step.is_object() && source.optional<std::string>(step, path, "type", "") == "ByteLevel" &&
         !source.optional(step, path, "add_prefix_space", false) &&
         source.optional(step, path, "use_regex", true) == use_regex;
}

std::string pre_tokenizer_name(const json& pre, const Source& source) {
  if (is_byte_level(pre, "pre_tokenizer", true, source)) return "gpt2";
  if (pre.is_object() && source.optional<std::string>(pre, "pre_tokenizer", "type", "") == "Sequence" &&
      pre.contains("pretokenizers")) {
    const json& steps = pre["pretokenizers"];
    if (steps.is_array() && steps.size() == 2) {
      const json& split = steps[0];
      const std::string split_path = "pre_tokenizer.pretokenizers[0]", bytes_path = "pre_tokenizer.pretokenizers[1]";
      const std::string split_type = source.optional<std::string>(split, split_path, "type", "");
      if (split_type == "Digits" && source.optional(split, split_path, "individual_digits", false) &&
          is_byte_level(steps[1], bytes_path, true, source))
        return "smollm";
      const json* regex = split.is_object() && split.contains("pattern") && split["pattern"].is_object() &&
                                  split["pattern"].contains("Regex")
                              ? &split["pattern"]["Regex"]
                              : nullptr;
      if (split_type == "Split" && regex && regex->is_string() && *regex == PreTokenizer::named("llama3").pattern() &&
          source.optional<std::string>(split, split_path, "behavior", "") == "Isolated" &&
          !source.optional(split, split_path, "invert", false) && is_byte_level(steps[1], bytes_path, false, source))
        return "llama3";
    }
  }
  throw source.error("pre_tokenizer",
                     fmt::format("{} is not supported (understood: ByteLevel without prefix space; Sequence of "
                                 "Digits(individual_digits) and ByteLevel; Sequence of Split with Llama 3's regex "
                                 "and ByteLevel(use_regex=false))",
                                 pre.dump().substr(0, 300)));
}

// The text of a special token in tokenizer_config.json: a string, {"content": ...} or null.
std::optional<std::string> config_token(const json& config, const char* key, const Source& source) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  const json& value = config[key];
  if (value.is_object()) return source.string(source.member(value, key, "content"), std::string(key) + ".content");
  return source.string(value, key);
}

// The special token a TemplateProcessing post-processor puts first, if any (Llama 3's bos).
std::optional<std::string> leading_special(const json& processor, const std::string& path, const Source& source) {
  if (!processor.is_object()) return std::nullopt;
  const std::string type = source.optional<std::string>(processor, path, "type", "");
  if (type == "Sequence" && processor.contains("processors") && processor["processors"].is_array()) {
    const json& steps = processor["processors"];
    for (std::size_t i = 0; i < steps.size(); ++i)
      if (auto found = leading_special(steps[i], fmt::format("{}.processors[{}]", path, i), source)) return found;
    return std::nullopt;
  }
  if (type != "TemplateProcessing" || !processor.contains("single")) return std::nullopt;
  const json& single = processor["single"];
  if (!single.is_array() || single.empty() || !single[0].is_object() || !single[0].contains("SpecialToken"))
    return std::nullopt;
  const json& special = single[0]["SpecialToken"];
  if (!special.is_object() || !special.contains("id") || !special["id"].is_string()) return std::nullopt;
  return special["id"].get<std::string>();
}

}  // namespace

namespace {

BpeVocab read_tokenizer_json(std::string_view json_text, std::string_view source_name,
                             std::optional<std::string_view> config_json, std::string_view config_name) {
  const Source source{source_name};
  const json root = source.parse(json_text);
  const json& model = source.member(root, "(top)", "model");
  if (source.optional<std::string>(model, "model", "type", "BPE") != "BPE")
    throw source.error("model.type", fmt::format("{} is not BPE", model["type"].dump()));
  for (const char* absent : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(absent) && !model[absent].is_null() && model[absent] != "")
      throw source.error(fmt::format("model.{}", absent), fmt::format("{} is not supported", model[absent].dump()));
  for (const char* unsupported : {"byte_fallback", "fuse_unk"})
    if (source.optional(model, "model", unsupported, false))
      throw source.error(fmt::format("model.{}", unsupported), "true is not supported");
  if (root.contains("normalizer") && !root["normalizer"].is_null())
    throw source.error("normalizer", fmt::format("{} is not supported (only null)", root["normalizer"].dump().substr(0, 200)));

  BpeVocab vocab;
  vocab.pre = pre_tokenizer_name(source.member(root, "(top)", "pre_tokenizer"), source);
  const bool ignore_merges = source.optional(model, "model", "ignore_merges", false);
  if (ignore_merges != PreTokenizer::named(vocab.pre).ignore_merges())
    throw source.error("model.ignore_merges",
                       fmt::format("{} does not go with the {} pre-tokenizer", ignore_merges, vocab.pre));

  std::map<std::int64_t, std::pair<std::string, std::int32_t>> by_id;  // id -> (text, GGUF token type)
  const json& model_vocab = source.member(model, "model", "vocab");
  if (!model_vocab.is_object()) throw source.error("model.vocab", "is not an object");
  for (const auto& [text, id] : model_vocab.items()) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= INT32_MAX)
      throw source.error(fmt::format("model.vocab[\"{}\"]", text), fmt::format("{} is not an id", id.dump()));
    by_id[id.get<std::int64_t>()] = {text, kNormalToken};
  }
  if (root.contains("added_tokens")) {
    const json& added = root["added_tokens"];
    if (!added.is_array()) throw source.error("added_tokens", "is not an array");
    for (std::size_t i = 0; i < added.size(); ++i) {
      std::string path = fmt::format("added_tokens[{}]", i);
      const json& id = source.member(added[i], path, "id");
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= INT32_MAX)
        throw source.error(path + ".id", fmt::format("{} is not an id", id.dump()));
      std::string content = source.string(source.member(added[i], path, "content"), path + ".content");
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        if (source.optional(added[i], path, flag, false))
          throw source.error(fmt::format("{}.{}", path, flag), "true is not supported (the token is matched as it is)");
      const bool special = source.optional(added[i], path, "special", true);
      by_id[id.get<std::int64_t>()] = {content, special ? kControlToken : kUserDefinedToken};
    }
  }
  for (const auto& [id, token] : by_id) {
    if (std::size_t(id) != vocab.tokens.size())
      throw source.error("model.vocab", fmt::format("no token has the id {} (neither model.vocab nor added_tokens)",
                                                    vocab.tokens.size()));
    vocab.tokens.push_back(token.first);
    vocab.token_types.push_back(token.second);
  }

  const json& merges = source.member(model, "model", "merges");
  if (!merges.is_array()) throw source.error("model.merges", "is not an array");
  vocab.merges.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const json& merge = merges[i];
    if (merge.is_string()) vocab.merges.push_back(merge.get<std::string>());
    else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
      vocab.merges.push_back(merge[0].get<std::string>() + " " + merge[1].get<std::string>());
    else throw source.error(fmt::format("model.merges[{}]", i), fmt::format("{} is not \"a b\" nor [a, b]", merge.dump()));
  }

  auto id_of = [&](const std::string& text, const Source& where, std::string_view field) {
    for (std::size_t id = 0; id < vocab.tokens.size(); ++id)
      if (vocab.tokens[id] == text) return std::int32_t(id);
    throw where.error(field, fmt::format("\"{}\" is not a token", text));
  };
  if (model.contains("unk_token") && !model["unk_token"].is_null())
    vocab.unk = id_of(source.string(model["unk_token"], "model.unk_token"), source, "model.unk_token");
  if (root.contains("post_processor"))
    if (auto bos = leading_special(root["post_processor"], "post_processor", source)) {
      vocab.bos = id_of(*bos, source, "post_processor");
      vocab.add_bos = true;
    }
  if (config_json) {
    const Source config_source{config_name};
    const json config = config_source.parse(*config_json);
    if (!config.is_object()) throw config_source.error("(top)", "is not an object");
    if (auto bos = config_token(config, "bos_token", config_source)) vocab.bos = id_of(*bos, config_source, "bos_token");
    if (auto eos = config_token(config, "eos_token", config_source)) vocab.end_ids = {id_of(*eos, config_source, "eos_token")};
    vocab.add_bos = config_source.optional(config, "", "add_bos_token", vocab.add_bos);
    if (vocab.add_bos && !vocab.bos) throw config_source.error("add_bos_token", "is true but there is no bos_token");
  }
  return vocab;
}

}  // namespace

BpeVocab bpe_vocab_from_tokenizer_json(std::string_view json_text, std::string_view source_name,
                                       std::optional<std::string_view> config_json, std::string_view config_name) {
  try {
    return read_tokenizer_json(json_text, source_name, config_json, config_name);
  } catch (const nlohmann::json::exception& e) {  // a backstop: Source names the fields it reads
    const std::string sources = config_json ? fmt::format("{} or {}", source_name, config_name) : std::string(source_name);
    throw std::invalid_argument(fmt::format("{}: {}", sources, e.what()));
  }
}

std::string bpe_vocab_to_tokenizer_json(const BpeVocab& vocab) {
  const PreTokenizer& pre = PreTokenizer::named(vocab.pre);
  using ordered = nlohmann::ordered_json;
  const ordered byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  ordered pre_tokenizer;
  if (pre.name() == "gpt2") {
    pre_tokenizer = byte_level;
  } else if (pre.name() == "smollm") {
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  } else {
    ordered split = {{"type", "Split"}, {"pattern", {{"Regex", pre.pattern()}}}, {"behavior", "Isolated"}, {"invert", false}};
    ordered bytes_only = byte_level;
    bytes_only["use_regex"] = false;
    pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", {split, bytes_only}}};
  }

  ordered added = ordered::array();
  std::vector<bool> special(vocab.tokens.size());
  for (std::int32_t id : vocab.special_ids) special[std::size_t(id)] = true;
  for (std::size_t id = 0; id < vocab.token_types.size(); ++id)
    special[id] = special[id] || vocab.token_types[id] == kControlToken || vocab.token_types[id] == kUserDefinedToken;
  ordered model_vocab = ordered::object();
  for (std::size_t id = 0; id < vocab.tokens.size(); ++id) {
    const std::string& text = vocab.tokens[id];
    if (model_vocab.contains(text))
      throw std::invalid_argument(fmt::format("to_tokenizer_json: tokens {} and {} are both \"{}\"",
                                              model_vocab[text].get<std::size_t>(), id, text));
    model_vocab[text] = id;
    if (special[id]) {
      bool user_defined = id < vocab.token_types.size() && vocab.token_types[id] == kUserDefinedToken;
      added.push_back({{"id", id}, {"content", text}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", !user_defined}});
    }
  }
  ordered merges = ordered::array();
  for (const std::string& merge : vocab.merges) {
    std::size_t space = merge.find(' ');
    merges.push_back({merge.substr(0, space), merge.substr(space + 1)});
  }

  ordered post_processor = nullptr;
  if (vocab.add_bos) {
    const std::string& bos = vocab.tokens[std::size_t(*vocab.bos)];
    ordered bos_step = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
    post_processor = {{"type", "TemplateProcessing"},
                      {"single", {bos_step, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                      {"pair", {bos_step, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, bos_step,
                                {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
                      {"special_tokens", {{bos, {{"id", bos}, {"ids", {*vocab.bos}}, {"tokens", {bos}}}}}}};
  }
  ordered root = {{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", added},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", pre_tokenizer},
                  {"post_processor", post_processor},
                  {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                  {"model",
                   {{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", vocab.unk ? ordered(vocab.tokens[std::size_t(*vocab.unk)]) : ordered(nullptr)},
                    {"continuing_subword_prefix", nullptr},
                    {"end_of_word_suffix", nullptr},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"ignore_merges", pre.ignore_merges()},
                    {"vocab", model_vocab},
                    {"merges", merges}}}};
  return root.dump();
}

namespace {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot be opened", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error(fmt::format("{}: cannot be read", path));
  return text.str();
}

}  // namespace

ByteLevelBpe ByteLevelBpe::from_tokenizer_json(const std::string& path, const std::optional<std::string>& tokenizer_config_path) {
  std::string text = read_text_file(path);
  std::optional<std::string> config;
  if (tokenizer_config_path) config = read_text_file(*tokenizer_config_path);
  BpeVocab vocab = bpe_vocab_from_tokenizer_json(text, path, config, tokenizer_config_path.value_or(""));
  try {
    return from_vocab(std::move(vocab));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", path, e.what()));
  }
}

std::string ByteLevelBpe::to_tokenizer_json() const { return bpe_vocab_to_tokenizer_json(vocab_); }

}  // namespace tapegrad::tokenizers
