// Reading a Hugging Face model folder: the required files, the single or sharded safetensors
// weights (the index checked against the shards), and the optional tokenizer files.
#include "io/hf_folder.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "io/safetensors.h"

namespace tapegrad::io {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::runtime_error file_error(const fs::path& file, const std::string& problem) {
  return std::runtime_error(fmt::format("{}: {}", file.string(), problem));
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw file_error(file, "cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw file_error(file, "read failed");
  return text.str();
}

fs::path required_file(const fs::path& folder, const char* name, const char* what) {
  const fs::path file = folder / name;
  if (!fs::is_regular_file(file)) throw file_error(file, fmt::format("missing (a Hugging Face model folder needs {})", what));
  return file;
}

std::optional<std::string> optional_file(const fs::path& folder, const char* name) {
  const fs::path file = folder / name;
  if (fs::is_regular_file(file)) return file.string();
  return std::nullopt;
}

// The JSON object in `text`, read from `file`, refusing duplicate keys at the top two levels (a tensor named
// twice in weight_map would otherwise silently keep the last shard).
json parse_object(const fs::path& file, const std::string& text) {
  std::vector<std::set<std::string>> keys_at_depth(3);
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    // An object's start comes at its parent's depth, its keys one deeper.
    if (event == json::parse_event_t::object_start && depth < 2) keys_at_depth[std::size_t(depth) + 1].clear();
    if (event == json::parse_event_t::key && depth >= 1 && depth <= 2 &&
        !keys_at_depth[std::size_t(depth)].insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(text, on_event);
  } catch (const json::exception& e) {
    throw file_error(file, fmt::format("invalid JSON: {}", e.what()));
  }
  if (!parsed.is_object()) throw file_error(file, fmt::format("is a JSON {}, expected an object", parsed.type_name()));
  if (!duplicate.empty()) throw file_error(file, fmt::format("key '{}' appears twice", duplicate));
  return parsed;
}

// The shards named by the index, each with the tensors the index puts in it.
std::map<std::string, std::set<std::string>> read_index(const fs::path& index) {
  const json parsed = parse_object(index, read_text(index));
  if (!parsed.contains("weight_map") || !parsed["weight_map"].is_object())
    throw file_error(index, "weight_map: missing or not an object of tensor name -> shard file");
  std::map<std::string, std::set<std::string>> shards;
  for (const auto& [tensor, shard] : parsed["weight_map"].items()) {
    if (!shard.is_string())
      throw file_error(index, fmt::format("weight_map: tensor '{}' maps to a JSON {}, expected a shard file name", tensor,
                                          shard.type_name()));
    const std::string name = shard.get<std::string>();
    // Shards sit beside the index: a name that leaves the folder is refused.
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw file_error(index, fmt::format("weight_map: tensor '{}' maps to '{}', not a file name in the folder", tensor,
                                          name));
    shards[name].insert(tensor);
  }
  if (shards.empty()) throw file_error(index, "weight_map: lists no tensor");
  return shards;
}

std::map<std::string, Tensor> read_shards(const fs::path& folder, const fs::path& index) {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> shard_of;
  for (const auto& [shard_name, listed] : read_index(index)) {
    const fs::path shard = folder / shard_name;
    if (!fs::is_regular_file(shard))
      throw file_error(shard, fmt::format("missing (model.safetensors.index.json lists it for {} tensors, e.g. '{}')",
                                          listed.size(), *listed.begin()));
    SafetensorsFile file = read_safetensors(shard.string());
    for (const std::string& name : listed)
      if (!file.tensors.count(name))
        throw file_error(shard, fmt::format("tensor '{}' is missing (model.safetensors.index.json puts it here)", name));
    for (auto& [name, tensor] : file.tensors) {
      if (auto other = shard_of.find(name); other != shard_of.end())
        throw file_error(shard, fmt::format("tensor '{}' is also in {}", name, other->second));
      if (!listed.count(name)) {
        // Every tensor of a shard is listed: one the index puts elsewhere, or nowhere, contradicts it.
        throw file_error(shard, fmt::format("tensor '{}' is not listed for this shard in model.safetensors.index.json",
                                            name));
      }
      shard_of.emplace(name, shard_name);
      tensors.emplace(name, std::move(tensor));
    }
  }
  return tensors;
}

}  // namespace

HfFolder read_hf_folder(const std::string& path) {
  const fs::path folder(path);
  if (!fs::is_directory(folder)) throw file_error(folder, "not a folder (a Hugging Face model folder was expected)");
  HfFolder out;
  out.path = path;
  const fs::path config = required_file(folder, "config.json", "config.json");
  out.config_json = read_text(config);
  parse_object(config, out.config_json);
  out.tokenizer_json_path = required_file(folder, "tokenizer.json", "tokenizer.json").string();
  out.tokenizer_config_path = optional_file(folder, "tokenizer_config.json");
  out.chat_template_path = optional_file(folder, "chat_template.jinja");

  const fs::path single = folder / "model.safetensors", index = folder / "model.safetensors.index.json";
  if (fs::is_regular_file(single))
    out.tensors = std::move(read_safetensors(single.string()).tensors);
  else if (fs::is_regular_file(index))
    out.tensors = read_shards(folder, index);
  else
    throw file_error(single, "missing, and so is model.safetensors.index.json (a Hugging Face model folder needs its weights)");
  return out;
}

}  // namespace tapegrad::io
