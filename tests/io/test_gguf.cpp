// GGUF: every tensor type dequantized bit for bit as the gguf package does and every metadata
// value type read back (tests/data/gguf_types, made by tests/data/make_gguf_types.py), forged
// headers refused with a message naming the file and the field, and SmolLM2's real file.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/fnv1a.h"
#include "io/gguf.h"
#include "support/helpers.h"
#include "support/real_model.h"

using namespace tapegrad;
using io::GgufFile;
using io::GgufType;
using test::contains;
using test::error_of;

namespace {

const std::string kDataDir = std::string(TAPEGRAD_SOURCE_DIR) + "/tests/data/gguf_types/";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read ", path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

nlohmann::json expected() { return nlohmann::json::parse(slurp(kDataDir + "tensor_types.json")); }

// The valid file's bytes, with the positions of its fields found by their names, to forge from.
struct Forge {
  std::string bytes = slurp(kDataDir + "tensor_types.gguf");

  // The position just past the string `text` stored with its u64 length (a key or a tensor name).
  std::size_t after_string(const std::string& text) const {
    std::string stored(8, '\0');
    for (int i = 0; i < 8; ++i) stored[std::size_t(i)] = char((text.size() >> (8 * i)) & 0xff);
    stored += text;
    const std::size_t at = bytes.find(stored);
    REQUIRE_MESSAGE(at != std::string::npos, "no stored string '", text, "' in the file");
    return at + stored.size();
  }
  template <class Unsigned>
  void put(std::size_t at, Unsigned value) {
    for (std::size_t i = 0; i < sizeof(Unsigned); ++i) bytes[at + i] = char((std::uint64_t(value) >> (8 * i)) & 0xff);
  }
  std::uint64_t get_u64(std::size_t at) const {
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < 8; ++i) value |= std::uint64_t(std::uint8_t(bytes[at + i])) << (8 * i);
    return value;
  }
  // A tensor info's fields: n_dims just past the name, then ne, type and offset.
  std::size_t n_dims_at(const std::string& tensor) const { return after_string(tensor); }
  std::size_t ne_at(const std::string& tensor, std::size_t j) const { return after_string(tensor) + 4 + 8 * j; }
  std::size_t type_at(const std::string& tensor) const {
    return after_string(tensor) + 4 + 8 * std::size_t(std::uint8_t(bytes[after_string(tensor)]));
  }
  std::size_t offset_at(const std::string& tensor) const { return type_at(tensor) + 4; }

  std::string write(const std::string& name, std::size_t length = std::string::npos) const {
    const std::string path = test::process_path("gguf_forged_" + name + ".gguf");
    const std::string content = bytes.substr(0, length);
    std::ofstream(path, std::ios::binary).write(content.data(), std::streamsize(content.size()));
    return path;
  }
};

// Opening the file must fail with "<path>: <field>..." containing `problem`.
void check_refused(const std::string& path, const std::string& field, const std::string& problem) {
  const std::string message = error_of<std::runtime_error>([&] { GgufFile::open(path); });
  CHECK_MESSAGE(message.rfind(path + ": " + field, 0) == 0, message, "\n  does not start with: ", path, ": ", field);
  CHECK_MESSAGE(contains(message, problem), message, "\n  does not contain: ", problem);
}

void check_metadata(const GgufFile& file, const nlohmann::json& metadata) {
  for (const auto& [key, want] : metadata.items()) {
    CAPTURE(key);
    const io::GgufValue& value = file.at(key);
    CHECK(std::string(io::gguf_type_name(value.type())) == want["type"].get<std::string>());
    const nlohmann::json& v = want["value"];
    const std::string type = want["type"];
    if (type == "string") {
      CHECK(value.as_string() == v.get<std::string>());
    } else if (type == "bool") {
      CHECK(value.as_bool() == v.get<bool>());
    } else if (type == "f32" || type == "f64") {
      CHECK(value.as_float() == v.get<double>());
    } else if (type != "array") {
      CHECK(value.as_int() == v.get<std::int64_t>());
    } else {
      const std::string element = want["element_type"];
      CHECK(std::string(io::gguf_type_name(value.element_type())) == element);
      CHECK(value.size() == v.size());
      if (element == "string") CHECK(value.as_strings() == v.get<std::vector<std::string>>());
      if (element == "bool") CHECK(value.as_bools() == v.get<std::vector<bool>>());
      if (element == "f32") CHECK(value.as_floats() == v.get<std::vector<double>>());
      if (element == "i32" || element == "u8") CHECK(value.as_ints() == v.get<std::vector<std::int64_t>>());
      if (element == "array") {
        REQUIRE(value.as_arrays().size() == v.size());
        for (std::size_t i = 0; i < v.size(); ++i)
          CHECK(value.as_arrays()[i].as_ints() == v[i].get<std::vector<std::int64_t>>());
      }
    }
  }
}

}  // namespace

TEST_CASE("every GGUF tensor type dequantizes to the gguf package's float32 bits, in v3 and v2 files") {
  const nlohmann::json want = expected();
  for (const auto& [name, about] : want["files"].items()) {
    CAPTURE(name);
    const GgufFile file = GgufFile::open(kDataDir + name);
    CHECK(file.version() == about["version"].get<std::uint32_t>());
    CHECK(file.alignment() == about["alignment"].get<std::size_t>());
    REQUIRE(file.tensors().size() == want["tensors"].size());
    for (const io::GgufTensor& tensor : file.tensors()) {
      CAPTURE(tensor.name);
      const nlohmann::json& t = want["tensors"].at(tensor.name);
      CHECK(std::string(quant::block_format(tensor.type).name) == t["type"].get<std::string>());
      CHECK(tensor.shape == t["shape"].get<std::vector<std::size_t>>());
      CHECK(reinterpret_cast<std::uintptr_t>(tensor.data.data()) % file.alignment() == 0);  // mapping is page-aligned
      const Tensor values = file.dequantize(tensor);
      REQUIRE(values.shape() == tensor.shape);
      CHECK(fmt::format("{:016x}", fnv1a64(values.data(), values.bytes())) == t["fnv1a64"].get<std::string>());
      for (std::size_t i = 0; i < 8; ++i) CHECK(std::bit_cast<std::uint32_t>(values[i]) == t["first_bits"][i].get<std::uint32_t>());
    }
    CHECK(file.find_tensor("t.q4_K") == &file.tensors()[6]);
    CHECK(file.find_tensor("nope") == nullptr);
  }
}

TEST_CASE("every GGUF metadata value type reads back as the gguf package wrote it") {
  const nlohmann::json want = expected();
  for (const char* name : {"tensor_types.gguf", "tensor_types_v2.gguf"}) {
    CAPTURE(name);
    const GgufFile file = GgufFile::open(kDataDir + name);
    check_metadata(file, want["metadata"]);
    CHECK(file.find("general.architecture") == &file.at("general.architecture"));
    CHECK(file.find("no.such.key") == nullptr);
  }
}

TEST_CASE("a GGUF value asked as the wrong type, a u64 past int64 and a missing key each name the file and the key") {
  Forge forge;
  forge.put(forge.after_string("test.u64") + 4, std::uint64_t(1) << 63);
  const std::string path = forge.write("u64_past_int64");
  const GgufFile file = GgufFile::open(path);
  CHECK(error_of<std::runtime_error>([&] { file.at("test.string").as_int(); }) ==
        path + ": metadata key 'test.string': is a string, expected an integer");
  CHECK(error_of<std::runtime_error>([&] { file.at("test.ints").as_strings(); }) ==
        path + ": metadata key 'test.ints': is an array of i32, expected an array of strings");
  CHECK(error_of<std::runtime_error>([&] { file.at("test.u64").as_int(); }) ==
        path + ": metadata key 'test.u64': 9223372036854775808 is past the int64 range");
  CHECK(error_of<std::runtime_error>([&] { file.at("general.name"); }) == path + ": metadata key 'general.name' is missing");
  CHECK(error_of<std::runtime_error>([&] { file.at("test.nested").as_arrays()[1].as_floats(); }) ==
        path + ": metadata key 'test.nested'[1]: is an array of i32, expected an array of floats");
}

TEST_CASE("a GGUF file cut short anywhere in its header or data is refused with a message naming the file") {
  const Forge forge;
  const std::size_t infos_end = forge.offset_at("t.q6_K") + 8;  // the last tensor info's last field
  for (std::size_t length = 0; length < infos_end; length += 7) {
    CAPTURE(length);
    const std::string path = forge.write("truncated", length);
    const std::string message = error_of<std::runtime_error>([&] { GgufFile::open(path); });
    CHECK_MESSAGE(message.rfind(path + ": ", 0) == 0, message);
  }
  check_refused(forge.write("short_header", 20), "header", "the file is 20 bytes, too short for GGUF's 24-byte header");
  check_refused(forge.write("cut_in_name", forge.after_string("t.q6_K") - 2), "tensor info 7 name",
                "string of 6 bytes at byte");
  check_refused(forge.write("no_data", infos_end + 1), "tensor data", "past the end of the");
  // t.q6_K, two 210-byte blocks, ends the data (the file's last bytes are padding).
  const std::size_t data_end = (infos_end + 31) / 32 * 32 + forge.get_u64(forge.offset_at("t.q6_K")) + 2 * 210;
  check_refused(forge.write("cut_in_data", data_end - 1), "tensor 't.q6_K'", "run past the end of the");
  CHECK(GgufFile::open(forge.write("cut_in_padding", data_end)).tensors().size() == 8);
}

TEST_CASE("a GGUF file with a wrong magic, an unread version or big-endian numbers is refused, saying which") {
  Forge forge;
  forge.bytes[0] = 'X';
  check_refused(forge.write("magic"), "magic", "bytes 58 47 55 46 are not \"GGUF\"");
  forge = Forge();
  for (std::uint32_t version : {1u, 4u}) {
    forge.put(4, version);
    check_refused(forge.write("version"), "version", fmt::format("{} is not supported (GGUF versions 2 and 3 are)", version));
  }
  forge.put(4, std::uint32_t(0x03000000));
  check_refused(forge.write("big_endian"), "version", "the file is big-endian (version 3)");
}

TEST_CASE("a GGUF string or array that runs past the end of the file is refused before anything is allocated") {
  Forge forge;
  forge.put(forge.after_string("test.string") + 4, std::uint64_t(1) << 62);
  check_refused(forge.write("huge_string"), "metadata key 'test.string'", "string of 4611686018427387904 bytes");
  forge = Forge();
  forge.put(forge.after_string("test.ints") + 8, std::uint64_t(1) << 61);
  check_refused(forge.write("huge_array"), "metadata key 'test.ints'",
                "array of 2305843009213693952 i32 elements runs past the end of the file");
  forge = Forge();
  forge.put(forge.after_string("test.strings") + 8, std::uint64_t(-1));
  check_refused(forge.write("huge_string_array"), "metadata key 'test.strings'", "runs past the end of the file");
  forge = Forge();
  forge.put(8, std::uint64_t(1) << 60);
  check_refused(forge.write("tensor_count"), "tensor_count", "tensor infos cannot fit");
  forge = Forge();
  forge.put(16, std::uint64_t(-1));
  check_refused(forge.write("metadata_count"), "metadata_kv_count", "entries cannot fit");
}

TEST_CASE("GGUF metadata with a bad bool, an unknown value type, a key twice or a bad alignment is refused") {
  Forge forge;
  forge.put(forge.after_string("test.true") + 4, std::uint8_t(2));
  check_refused(forge.write("bool"), "metadata key 'test.true'", "bool byte is 2, expected 0 or 1");
  forge = Forge();
  forge.put(forge.after_string("test.u8"), std::uint32_t(13));
  check_refused(forge.write("value_type"), "metadata key 'test.u8'", "value type 13 is not a GGUF value type");
  forge = Forge();
  forge.put(forge.after_string("test.ints") + 4, std::uint32_t(99));
  check_refused(forge.write("element_type"), "metadata key 'test.ints'", "array element type 99 is not a GGUF value type");
  forge = Forge();
  forge.bytes[forge.after_string("test.i8") - 2] = 'u';  // test.i8 becomes a second test.u8
  check_refused(forge.write("key_twice"), "metadata key 'test.u8'", "appears twice");

  Forge v2;
  v2.bytes = slurp(kDataDir + "tensor_types_v2.gguf");
  const std::size_t alignment_at = v2.after_string("general.alignment") + 4;
  for (std::uint32_t alignment : {0u, 48u, 4u}) {
    v2.put(alignment_at, alignment);
    check_refused(v2.write("alignment"), "metadata key 'general.alignment'",
                  fmt::format("{} is not a power of two and a multiple of 8", alignment));
  }
  v2.put(alignment_at - 4, std::uint32_t(GgufType::I32));
  check_refused(v2.write("alignment_type"), "metadata key 'general.alignment'", "is a i32, expected a u32");
}

TEST_CASE("GGUF arrays may nest, but no deeper than the limit") {
  // A hand-made file: no tensors, one key holding arrays nested `depth` deep around one u8.
  auto nested = [](std::size_t depth) {
    Forge forge;
    forge.bytes = std::string("GGUF") + std::string("\x03\0\0\0", 4) + std::string(8, '\0') + std::string("\x01\0\0\0\0\0\0\0", 8);
    auto u32 = [&](std::uint32_t v) { forge.bytes.append(4, '\0'); forge.put(forge.bytes.size() - 4, v); };
    auto u64 = [&](std::uint64_t v) { forge.bytes.append(8, '\0'); forge.put(forge.bytes.size() - 8, v); };
    u64(1);
    forge.bytes += "k";
    u32(std::uint32_t(GgufType::Array));
    for (std::size_t level = 1; level < depth; ++level) {
      u32(std::uint32_t(GgufType::Array));
      u64(1);
    }
    u32(std::uint32_t(GgufType::U8));
    u64(1);
    forge.bytes += '\x07';
    return forge.write("nested_" + std::to_string(depth));
  };
  const GgufFile file = GgufFile::open(nested(io::kGgufMaxArrayDepth));
  const io::GgufValue* value = &file.at("k");
  for (std::size_t level = 1; level < io::kGgufMaxArrayDepth; ++level) value = &value->as_arrays().at(0);
  CHECK(value->as_ints() == std::vector<std::int64_t>{7});
  check_refused(nested(io::kGgufMaxArrayDepth + 1), "metadata key 'k'", "arrays nest deeper than 8 levels");
}

TEST_CASE("GGUF tensor infos with bad dims, types, offsets, overlaps or names are refused before any data is read") {
  Forge forge;
  forge.put(forge.n_dims_at("t.q4_1"), std::uint32_t(5));
  check_refused(forge.write("dims"), "tensor 't.q4_1'", "has 5 dimensions, more than ggml's 4");
  forge = Forge();
  forge.put(forge.ne_at("t.q4_1", 1), std::uint64_t(0));
  check_refused(forge.write("dim_zero"), "tensor 't.q4_1'", "dimension ne[1] is 0");
  forge = Forge();
  forge.put(forge.ne_at("t.f32", 1), std::uint64_t(1) << 31);
  forge.put(forge.ne_at("t.f32", 2), std::uint64_t(1) << 31);
  check_refused(forge.write("overflow"), "tensor 't.f32'", "the element count overflows");
  forge = Forge();
  forge.put(forge.ne_at("t.f32", 0), std::uint64_t(1) << 60);  // 2^60 * 3 * 1 * 2 elements of 4 bytes
  check_refused(forge.write("byte_overflow"), "tensor 't.f32'", "the byte count overflows");
  forge = Forge();
  forge.put(forge.ne_at("t.q4_1", 0), std::uint64_t(3));  // 3 x 32 instead of 32 x 3: same count
  forge.put(forge.ne_at("t.q4_1", 1), std::uint64_t(32));
  check_refused(forge.write("partial_block"), "tensor 't.q4_1'", "ne[0] = 3 is not a whole number of 32-element q4_1 blocks");
  forge = Forge();
  forge.put(forge.type_at("t.q4_1"), std::uint32_t(99));
  check_refused(forge.write("type"), "tensor 't.q4_1'", "type 99 is not supported");
  forge = Forge();
  const std::size_t q4_1_offset = forge.offset_at("t.q4_1");
  forge.put(q4_1_offset, forge.get_u64(q4_1_offset) + 4);
  check_refused(forge.write("misaligned"), "tensor 't.q4_1'", "is not a multiple of the alignment 32");
  forge = Forge();
  forge.put(forge.offset_at("t.q4_1"), std::uint64_t(1) << 40);
  check_refused(forge.write("past_end"), "tensor 't.q4_1'", "run past the end of the");
  forge = Forge();
  forge.put(forge.offset_at("t.q4_1"), forge.get_u64(forge.offset_at("t.q4_0")));
  check_refused(forge.write("overlap"), "tensor 't.q4_", "overlap tensor 't.q4_");
  forge = Forge();
  forge.bytes[forge.after_string("t.f16") - 2] = '3';  // t.f16 -> t.f36
  forge.bytes[forge.after_string("t.f36") - 1] = '2';  // -> t.f32, a second one
  check_refused(forge.write("name_twice"), "tensor 't.f32'", "appears twice");
}

TEST_CASE("SmolLM2's GGUF opens at once and every tensor dequantizes to finite values") {
  const auto path = test::smollm2_path();
  if (!path) return;
  const auto start = std::chrono::steady_clock::now();
  const GgufFile file = GgufFile::open(*path);
  const double open_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("opened ", *path, " in ", open_ms, " ms");
  CHECK(file.version() == 3);
  CHECK(file.at("general.architecture").as_string() == "llama");
  CHECK(file.at("llama.block_count").as_int() == 30);
  CHECK(file.at("tokenizer.ggml.merges").as_strings().size() == 48900);
  CHECK(file.at("tokenizer.ggml.tokens").as_strings().size() == 49152);
  const io::GgufTensor* embedding = file.find_tensor("token_embd.weight");
  REQUIRE(embedding != nullptr);
  CHECK(embedding->type == quant::TensorType::Q8_0);
  CHECK(embedding->shape == std::vector<std::size_t>{49152, 576});
  CHECK(file.find_tensor("blk.29.ffn_down.weight")->type == quant::TensorType::Q4_1);
  CHECK(file.find_tensor("blk.29.ffn_down.weight")->shape == std::vector<std::size_t>{576, 1536});
  std::size_t parameters = 0;
  for (const io::GgufTensor& tensor : file.tensors()) {
    const Tensor values = file.dequantize(tensor);
    bool finite = true;
    for (std::size_t i = 0; i < values.size(); ++i) finite = finite && std::isfinite(values[i]);
    CHECK_MESSAGE(finite, tensor.name, " has a non-finite value");
    parameters += values.size();
  }
  CHECK(file.tensors().size() == 272);
  CHECK(parameters == 134515008);
}
