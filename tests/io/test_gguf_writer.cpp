// The GGUF writer: every metadata value type and tensor type of the suite's GGUF file copied
// through it reads back equal (tapegrad's reader), tensors sit at aligned offsets with the data
// section padded whole, bad input is refused naming the key or tensor, and a failing write leaves
// the previous file and no temporary.
#include <doctest/doctest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "support/helpers.h"

using namespace tapegrad;
using io::GgufFile;
using io::GgufType;
using io::GgufWriter;
using test::contains;
using test::error_of;

namespace {

const std::string kTypesFile = std::string(TAPEGRAD_SOURCE_DIR) + "/tests/data/gguf_types/tensor_types.gguf";

// Every key and tensor of `source`, in a writer of `alignment`.
GgufWriter copy_of(const GgufFile& source, std::size_t alignment) {
  GgufWriter writer(alignment);
  for (const auto& [key, value] : source.metadata())
    if (key != "general.alignment") writer.add(key, value);
  for (const io::GgufTensor& t : source.tensors())
    writer.add_tensor(t.name, t.type, t.shape, std::vector<std::byte>(t.data.begin(), t.data.end()));
  return writer;
}

void check_same_value(const io::GgufValue& a, const io::GgufValue& b) {
  CHECK(a.type() == b.type());
  CHECK(a.element_type() == b.element_type());
  if (a.type() == GgufType::Array && a.element_type() == GgufType::Array) {
    REQUIRE(a.as_arrays().size() == b.as_arrays().size());
    for (std::size_t i = 0; i < a.as_arrays().size(); ++i) check_same_value(a.as_arrays()[i], b.as_arrays()[i]);
    return;
  }
  CHECK(a.storage().index() == b.storage().index());
  std::visit(
      [&](const auto& stored) {
        using Stored = std::decay_t<decltype(stored)>;
        const Stored* other = std::get_if<Stored>(&b.storage());
        REQUIRE(other != nullptr);
        if constexpr (std::is_same_v<Stored, double>) {
          CHECK(std::memcmp(&stored, other, sizeof(double)) == 0);  // bits: a NaN equals itself
        } else if constexpr (std::is_same_v<Stored, std::vector<double>>) {
          REQUIRE(stored.size() == other->size());
          CHECK(std::memcmp(stored.data(), other->data(), stored.size() * sizeof(double)) == 0);
        } else if constexpr (!std::is_same_v<Stored, std::vector<io::GgufValue>>) {
          CHECK(stored == *other);
        }
      },
      a.storage());
}

}  // namespace

TEST_CASE("a GGUF file copied through GgufWriter reads back with every key, value type and tensor equal") {
  const GgufFile source = GgufFile::open(kTypesFile);
  for (std::size_t alignment : {32, 64}) {
    CAPTURE(alignment);
    const std::string path = test::process_path("copy.gguf");
    copy_of(source, alignment).write(path);
    const GgufFile copy = GgufFile::open(path);
    CHECK(copy.version() == 3);
    CHECK(copy.alignment() == alignment);
    std::size_t keys = 0;
    for (const auto& [key, value] : source.metadata()) {
      if (key == "general.alignment") continue;
      CAPTURE(key);
      const io::GgufValue* read = copy.find(key);
      REQUIRE(read != nullptr);
      check_same_value(value, *read);
      ++keys;
    }
    CHECK(copy.metadata().size() == keys + (alignment == 32 ? 0 : 1));
    REQUIRE(copy.tensors().size() == source.tensors().size());
    const auto* base = reinterpret_cast<const std::byte*>(copy.tensors().front().data.data());
    std::size_t data_end = 0;
    for (std::size_t i = 0; i < source.tensors().size(); ++i) {
      const io::GgufTensor &a = source.tensors()[i], &b = copy.tensors()[i];
      CAPTURE(a.name);
      CHECK(b.name == a.name);
      CHECK(b.type == a.type);
      CHECK(b.shape == a.shape);
      REQUIRE(b.data.size() == a.data.size());
      CHECK(std::equal(a.data.begin(), a.data.end(), b.data.begin()));
      const std::size_t offset = std::size_t(b.data.data() - base);
      CHECK(offset % alignment == 0);
      data_end = offset + (b.data.size() + alignment - 1) / alignment * alignment;
    }
    // llama.cpp reads the data section padded whole: the file ends at the last tensor's padding.
    const std::size_t data_start = std::filesystem::file_size(path) - data_end;
    CHECK(data_start % alignment == 0);
  }
}

TEST_CASE("GgufWriter quantizes float32 tensors and writes the shorthand keys with their types") {
  GgufWriter writer;
  writer.add_string("general.architecture", "llama");
  writer.add_u32("n", 7);
  writer.add_i32("minus", -7);
  writer.add_f32("eps", 1e-5f);
  writer.add_bool("yes", true);
  writer.add_strings("words", {"a", "b c", ""});
  const std::vector<std::int32_t> ids = {1, -2, 3};
  writer.add_i32s("ids", ids);
  const std::vector<float> values = test::random_vector(2 * 64, 3);
  for (quant::TensorType type : {quant::TensorType::F32, quant::TensorType::F16, quant::TensorType::BF16,
                                 quant::TensorType::Q8_0})
    writer.add_tensor(fmt::format("w.{}", quant::block_format(type).name), type, {2, 64}, values);
  const std::string path = test::process_path("shorthand.gguf");
  writer.write(path);

  const GgufFile file = GgufFile::open(path);
  CHECK(file.at("general.architecture").as_string() == "llama");
  CHECK(file.at("n").type() == GgufType::U32);
  CHECK(file.at("n").as_int() == 7);
  CHECK(file.at("minus").type() == GgufType::I32);
  CHECK(file.at("minus").as_int() == -7);
  CHECK(file.at("eps").type() == GgufType::F32);
  CHECK(file.at("eps").as_float() == double(1e-5f));
  CHECK(file.at("yes").as_bool());
  CHECK(file.at("words").as_strings() == std::vector<std::string>{"a", "b c", ""});
  CHECK(file.at("ids").element_type() == GgufType::I32);
  CHECK(file.at("ids").as_ints() == std::vector<std::int64_t>{1, -2, 3});
  // Each type's round trip: exact for f32, to the rounding of its format for the others.
  for (const auto& [name, tolerance] : std::vector<std::pair<std::string, float>>{
           {"w.f32", 0.0f}, {"w.f16", 1.0f / 1024}, {"w.bf16", 1.0f / 128}, {"w.q8_0", 1.0f / 127}}) {
    CAPTURE(name);
    const Tensor read = file.dequantize(*file.find_tensor(name));
    REQUIRE(read.shape() == Shape{2, 64});
    float amax = 0;
    for (float v : values) amax = std::max(amax, std::fabs(v));
    for (std::size_t i = 0; i < values.size(); ++i) {
      // f16 and bf16 round relative to the value, q8_0 relative to the block's largest
      const float scale = name == "w.q8_0" ? amax : std::fabs(values[i]);
      if (std::fabs(read.data()[i] - values[i]) > tolerance * scale) FAIL(name, "[", i, "] read back as ", read.data()[i], " for ", values[i]);
    }
  }
}

TEST_CASE("GgufWriter refuses bad keys, values and tensors, naming them") {
  GgufWriter writer;
  writer.add_u32("k", 1);
  CHECK(contains(error_of<std::invalid_argument>([&] { writer.add_u32("k", 2); }), "metadata key 'k' is given twice"));
  CHECK(contains(error_of<std::invalid_argument>([&] { writer.add_u32("", 2); }), "a metadata key is empty"));
  CHECK(contains(error_of<std::invalid_argument>([&] { writer.add_u32("general.alignment", 64); }),
                 "general.alignment is the constructor's argument"));
  CHECK(contains(error_of<std::invalid_argument>(
                     [&] { writer.add("small", io::make_gguf_value(GgufType::U8, std::uint64_t(300))); }),
                 "metadata key 'small': 300 does not fit a u8"));
  CHECK(contains(error_of<std::invalid_argument>([&] {
                   writer.add("neg", io::make_gguf_value(GgufType::I8, std::uint64_t(std::int64_t(-129))));
                 }),
                 "metadata key 'neg': -129 does not fit a i8"));
  CHECK(contains(error_of<std::invalid_argument>(
                     [&] { writer.add("mixed", io::make_gguf_value(GgufType::String, std::uint64_t(1))); }),
                 "metadata key 'mixed': a string value holds no string"));
  const std::vector<std::byte> four(4);
  writer.add_tensor("t", quant::TensorType::F32, {1}, four);
  CHECK(contains(error_of<std::invalid_argument>([&] { writer.add_tensor("t", quant::TensorType::F32, {1}, four); }),
                 "tensor 't': is given twice"));
  CHECK(contains(error_of<std::invalid_argument>([&] { writer.add_tensor("u", quant::TensorType::F32, {2}, four); }),
                 "tensor 'u': 4 bytes given; shape 2 as f32 takes 8"));
  CHECK(contains(error_of<std::invalid_argument>([&] { writer.add_tensor("u", quant::TensorType::Q8_0, {2, 16}, four); }),
                 "tensor 'u': the innermost dimension 16 is not a whole number of 32-element q8_0 blocks"));
  CHECK(contains(error_of<std::invalid_argument>([&] { writer.add_tensor("u", quant::TensorType::F32, {1, 0}, four); }),
                 "tensor 'u': shape 1x0 has a zero dimension"));
  CHECK(contains(error_of<std::invalid_argument>([&] { writer.add_tensor("u", quant::TensorType::F32, {}, four); }),
                 "tensor 'u': has 0 dimensions"));
  CHECK(contains(error_of<std::invalid_argument>(
                     [&] { writer.add_tensor(std::string(64, 'n'), quant::TensorType::F32, {1}, four); }),
                 "the name is 64 bytes; llama.cpp takes fewer than 64"));
  const std::vector<float> floats(32);
  CHECK(contains(error_of<std::invalid_argument>([&] { writer.add_tensor("u", quant::TensorType::Q4_K, {256}, floats); }),
                 "tapegrad does not quantize to q4_K"));
  CHECK_THROWS_AS(GgufWriter(48), std::invalid_argument);
}

TEST_CASE("a GGUF write that fails leaves the previous file intact and no temporary, and names the path") {
  const std::string path = test::process_path("kept.gguf");
  GgufWriter first;
  first.add_string("which", "first");
  first.write(path);
  GgufWriter second;
  second.add_string("which", "second");
  second.add_tensor("t", quant::TensorType::F32, {1000}, std::vector<float>(1000));
  for (std::int64_t fail_after : {0, 10, 200, 2000}) {
    io::detail::gguf_fail_after_bytes = fail_after;
    const std::string message = error_of<std::runtime_error>([&] { second.write(path); });
    CHECK(message.rfind(path + ": write failed after " + std::to_string(fail_after) + " bytes", 0) == 0);
    CHECK(GgufFile::open(path).at("which").as_string() == "first");
    CHECK(!std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
  }
  const std::string missing = test::process_path("no/such/folder/x.gguf");
  CHECK(error_of<std::runtime_error>([&] { second.write(missing); }).rfind(missing + ": cannot create the temporary file", 0) == 0);
  second.write(path);
  CHECK(GgufFile::open(path).at("which").as_string() == "second");
}
