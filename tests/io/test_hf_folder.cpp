// Hugging Face folders: a single-file and a sharded folder read whole; every missing or
// contradictory file (config.json, tokenizer.json, a shard, a tensor in two shards or missing from
// its shard, an F64 weight) refused with a message naming that file.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "io/hf_folder.h"
#include "io/safetensors.h"
#include "support/helpers.h"

using namespace tapegrad;
using test::contains;
using test::error_of;
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary).write(text.data(), std::streamsize(text.size()));
}

// A folder with config.json and tokenizer.json, but no weights yet.
fs::path make_folder(const std::string& name) {
  const fs::path folder = test::process_path("hf_" + name);
  fs::remove_all(folder);
  fs::create_directories(folder);
  write_text(folder / "config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4})");
  write_text(folder / "tokenizer.json", R"({"model": {"type": "BPE"}})");
  return folder;
}

void write_shard(const fs::path& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors) {
  write_safetensors(path.string(), tensors, {});
}

const std::string kIndex = R"({"metadata": {"total_size": 40}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                "b": "model-00002-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})";

void check_refused(const fs::path& folder, const fs::path& file, const std::string& problem) {
  const std::string message = error_of<std::runtime_error>([&] { io::read_hf_folder(folder.string()); });
  CHECK_MESSAGE(message.rfind(file.string() + ": ", 0) == 0, message, "\n  does not start with: ", file.string());
  CHECK_MESSAGE(contains(message, problem), message, "\n  does not contain: ", problem);
}

}  // namespace

TEST_CASE("a Hugging Face folder with one model.safetensors reads its config, weights and tokenizer files") {
  const fs::path folder = make_folder("single");
  const Tensor w = test::random_tensor({3, 2}, 1);
  write_shard(folder / "model.safetensors", {{"w", &w}});
  io::HfFolder read = io::read_hf_folder(folder.string());
  CHECK(contains(read.config_json, "LlamaForCausalLM"));
  REQUIRE(read.tensors.size() == 1);
  CHECK(read.tensors.at("w").shape() == Shape{3, 2});
  CHECK(read.tensors.at("w")[5] == w[5]);
  CHECK(read.tokenizer_json_path == (folder / "tokenizer.json").string());
  CHECK(!read.tokenizer_config_path);
  CHECK(!read.chat_template_path);
  write_text(folder / "tokenizer_config.json", "{}");
  write_text(folder / "chat_template.jinja", "{{ messages }}");
  read = io::read_hf_folder(folder.string());
  CHECK(read.tokenizer_config_path == (folder / "tokenizer_config.json").string());
  CHECK(read.chat_template_path == (folder / "chat_template.jinja").string());
}

TEST_CASE("a sharded Hugging Face folder reads every shard its index lists") {
  const fs::path folder = make_folder("sharded");
  const Tensor a = test::random_tensor({2}, 1), b = test::random_tensor({2, 2}, 2), c = test::random_tensor({4}, 3);
  write_shard(folder / "model-00001-of-00002.safetensors", {{"a", &a}});
  write_shard(folder / "model-00002-of-00002.safetensors", {{"b", &b}, {"c", &c}});
  write_text(folder / "model.safetensors.index.json", kIndex);
  const io::HfFolder read = io::read_hf_folder(folder.string());
  REQUIRE(read.tensors.size() == 3);
  CHECK(read.tensors.at("b").shape() == Shape{2, 2});
  CHECK(read.tensors.at("c")[3] == c[3]);
}

TEST_CASE("a Hugging Face folder with a missing or contradictory file is refused, naming the file") {
  const Tensor a = test::random_tensor({2}, 1), b = test::random_tensor({2, 2}, 2), c = test::random_tensor({4}, 3);
  fs::path folder = make_folder("no_config");
  fs::remove(folder / "config.json");
  check_refused(folder, folder / "config.json", "missing (a Hugging Face model folder needs config.json)");

  folder = make_folder("bad_config");
  write_text(folder / "config.json", "[1, 2]");
  check_refused(folder, folder / "config.json", "is a JSON array, expected an object");

  folder = make_folder("no_tokenizer");
  fs::remove(folder / "tokenizer.json");
  check_refused(folder, folder / "tokenizer.json", "missing");

  folder = make_folder("no_weights");
  check_refused(folder, folder / "model.safetensors", "missing, and so is model.safetensors.index.json");

  folder = make_folder("missing_shard");
  write_shard(folder / "model-00001-of-00002.safetensors", {{"a", &a}});
  write_text(folder / "model.safetensors.index.json", kIndex);
  check_refused(folder, folder / "model-00002-of-00002.safetensors", "missing (model.safetensors.index.json lists it for 2 tensors");

  folder = make_folder("tensor_in_two_shards");
  write_shard(folder / "model-00001-of-00002.safetensors", {{"a", &a}, {"b", &b}});
  write_shard(folder / "model-00002-of-00002.safetensors", {{"b", &b}, {"c", &c}});
  write_text(folder / "model.safetensors.index.json", kIndex);
  check_refused(folder, folder / "model-00001-of-00002.safetensors",
                "tensor 'b' is not listed for this shard in model.safetensors.index.json");

  folder = make_folder("tensor_missing_from_shard");
  write_shard(folder / "model-00001-of-00002.safetensors", {{"a", &a}});
  write_shard(folder / "model-00002-of-00002.safetensors", {{"b", &b}});
  write_text(folder / "model.safetensors.index.json", kIndex);
  check_refused(folder, folder / "model-00002-of-00002.safetensors",
                "tensor 'c' is missing (model.safetensors.index.json puts it here)");

  folder = make_folder("index_names_twice");
  write_text(folder / "model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "a": "model-00002-of-00002.safetensors"}})");
  check_refused(folder, folder / "model.safetensors.index.json", "key 'a' appears twice");

  folder = make_folder("index_leaves_folder");
  write_text(folder / "model.safetensors.index.json", R"({"weight_map": {"a": "../model.safetensors"}})");
  check_refused(folder, folder / "model.safetensors.index.json", "not a file name in the folder");

  folder = make_folder("f64");
  const std::string header = R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  std::string bytes(8, '\0');
  bytes[0] = char(header.size());
  write_text(folder / "model.safetensors", bytes + header + std::string(8, '\0'));
  check_refused(folder, folder / "model.safetensors", "tensor 'w': dtype 'F64' is not supported (F32, F16 or BF16)");
}
