// The block-format table: ggml's ids and sizes, the exact half-to-float conversions (every one of
// the 65,536 halves against a double reference), and the quantizers' bits against the gguf
// package's (tests/data/quant_golden.json). The dequantizers' bits are checked against the gguf
// package in tests/io/test_gguf.cpp.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/quant/block_format.h"

using namespace tapegrad::quant;

TEST_CASE("the block-format table has ggml's ids, block sizes and bytes, and knows no other type") {
  struct Row {
    std::uint32_t id;
    const char* name;
    std::size_t elems, bytes;
  };
  for (const Row& row : {Row{0, "f32", 1, 4}, Row{1, "f16", 1, 2}, Row{2, "q4_0", 32, 18}, Row{3, "q4_1", 32, 20},
                         Row{6, "q5_0", 32, 22}, Row{8, "q8_0", 32, 34}, Row{12, "q4_K", 256, 144},
                         Row{14, "q6_K", 256, 210},
                         Row{30, "bf16", 1, 2}}) {
    CAPTURE(row.name);
    const BlockFormat* format = find_block_format(row.id);
    REQUIRE(format != nullptr);
    CHECK(std::uint32_t(format->type) == row.id);
    CHECK(std::string(format->name) == row.name);
    CHECK(format->block_elems == row.elems);
    CHECK(format->block_bytes == row.bytes);
    CHECK(&block_format(format->type) == format);
  }
  for (std::uint32_t unknown : {4u, 5u, 7u, 9u, 10u, 11u, 13u, 15u, 31u, 99u, 0xFFFFFFFFu}) CHECK(find_block_format(unknown) == nullptr);
}

TEST_CASE("f16_to_f32 converts every half exactly, subnormals, infinities and NaN payloads included") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float got = f16_to_f32(std::uint16_t(bits));
    const double sign = (bits & 0x8000) ? -1.0 : 1.0;
    const int exponent = int((bits >> 10) & 0x1F);
    const int mantissa = int(bits & 0x3FF);
    if (exponent == 0x1F) {
      const std::uint32_t want = ((bits & 0x8000u) << 16) | 0x7F800000u | (std::uint32_t(mantissa) << 13);
      if (std::bit_cast<std::uint32_t>(got) != want) FAIL("half ", bits, " gave bits ", std::bit_cast<std::uint32_t>(got));
      continue;
    }
    const double want = exponent == 0 ? sign * std::ldexp(mantissa, -24) : sign * std::ldexp(1024 + mantissa, exponent - 25);
    if (double(got) != want || std::signbit(got) != bool(bits & 0x8000)) FAIL("half ", bits, " gave ", got, ", want ", want);
  }
}

TEST_CASE("bf16_to_f32 gives the float32 whose upper half the bits are") {
  CHECK(bf16_to_f32(0x3F80) == 1.0f);
  CHECK(bf16_to_f32(0xC040) == -3.0f);
  CHECK(std::bit_cast<std::uint32_t>(bf16_to_f32(0x0001)) == 0x00010000u);
  CHECK(std::bit_cast<std::uint32_t>(bf16_to_f32(0xFFC1)) == 0xFFC10000u);
}

TEST_CASE("f32_to_f16 and f32_to_bf16 give back every half and bfloat16 that is not a NaN") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const bool half_nan = (bits & 0x7C00) == 0x7C00 && (bits & 0x3FF) != 0;
    if (!half_nan && f32_to_f16(f16_to_f32(std::uint16_t(bits))) != bits) FAIL("half ", bits, " came back changed");
    const bool bf16_nan = (bits & 0x7F80) == 0x7F80 && (bits & 0x7F) != 0;
    if (!bf16_nan && f32_to_bf16(bf16_to_f32(std::uint16_t(bits))) != bits) FAIL("bfloat16 ", bits, " came back changed");
  }
}

TEST_CASE("the f16, bf16 and q8_0 quantizers give the gguf package's bytes (quant_golden.json)") {
  std::ifstream in(std::string(TAPEGRAD_SOURCE_DIR) + "/tests/data/quant_golden.json");
  REQUIRE(in);
  const nlohmann::json golden = nlohmann::json::parse(in);
  for (const char* name : {"f16", "bf16", "q8_0"}) {
    CAPTURE(name);
    const nlohmann::json& c = golden[name];
    std::vector<float> input;
    for (std::uint32_t bits : c["input_bits"].get<std::vector<std::uint32_t>>()) input.push_back(std::bit_cast<float>(bits));
    const std::string want = c["output_hex"].get<std::string>();
    const BlockFormat* format = nullptr;
    for (std::uint32_t id : {1u, 8u, 30u})
      if (std::string(find_block_format(id)->name) == name) format = find_block_format(id);
    REQUIRE(format != nullptr);
    REQUIRE(bool(format->quantize));
    REQUIRE(input.size() % format->block_elems == 0);
    std::vector<std::byte> out(input.size() / format->block_elems * format->block_bytes);
    format->quantize(input.data(), out.data(), input.size());
    REQUIRE(want.size() == 2 * out.size());
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const unsigned expected = unsigned(std::stoul(want.substr(2 * i, 2), nullptr, 16));
      if (unsigned(out[i]) != expected && ++mismatches <= 5) {
        const std::size_t first = i / format->block_bytes * format->block_elems;
        FAIL_CHECK("byte ", i, " is ", unsigned(out[i]), ", the gguf package's ", expected, " (block of input ", first,
                   ", bits ", std::bit_cast<std::uint32_t>(input[first]), ")");
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("f32 quantizes to its own little-endian bytes, and the K and 4-bit types have no quantizer") {
  const float value = -1.5f;
  std::byte out[4];
  block_format(TensorType::F32).quantize(&value, out, 1);
  CHECK(std::bit_cast<float>(std::uint32_t(unsigned(out[0]) | unsigned(out[1]) << 8 | unsigned(out[2]) << 16 |
                                           std::uint32_t(out[3]) << 24)) == value);
  for (TensorType type : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q4_K, TensorType::Q6_K})
    CHECK_FALSE(bool(block_format(type).quantize));
}

TEST_CASE("the q5_0 dequantizer gives gguf.quants.dequantize's values, the fifth bits included") {
  // d = 0.375, fifth bits 0xA5C30F96, nibble bytes (37 j + 11) mod 256; the values the gguf package
  // (0.19) gives for these 22 bytes
  const char* hex = "0036960fc3a50b30557a9fc4e90e33587da2c7ec1136";
  std::byte block[22];
  for (int i = 0; i < 22; ++i) block[i] = std::byte(std::stoul(std::string(hex + 2 * i, 2), nullptr, 16));
  const float want[32] = {-1.875, 0.0,   1.875,  -2.25,  5.625,  -4.5,   -2.625, 5.25,  1.125, 3.0,   4.875,
                          0.75,   -3.375, -1.5,  -5.625, -3.75,  0.0,    1.125,  -4.125, -3.375, -2.625, -1.5,
                          5.25,   0.0,   1.125,  -4.125, 2.625,  -2.25,  -1.5,   5.25,  -5.625, 1.125};
  float got[32];
  block_format(TensorType::Q5_0).dequantize(block, got, 32);
  for (int j = 0; j < 32; ++j) CHECK_MESSAGE(got[j] == want[j], "element ", j);
}
