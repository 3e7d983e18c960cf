// The block-format table: ggml's ids and sizes, and the exact half-to-float conversions (every one
// of the 65,536 halves against a double reference). The dequantizers' bits are checked against the
// gguf package in tests/io/test_gguf.cpp.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/quant/block_format.h"

using namespace tapegrad::quant;

TEST_CASE("the block-format table has ggml's ids, block sizes and bytes, and knows no other type") {
  struct Row {
    std::uint32_t id;
    const char* name;
    std::size_t elems, bytes;
  };
  for (const Row& row : {Row{0, "f32", 1, 4}, Row{1, "f16", 1, 2}, Row{2, "q4_0", 32, 18}, Row{3, "q4_1", 32, 20},
                         Row{8, "q8_0", 32, 34}, Row{12, "q4_K", 256, 144}, Row{14, "q6_K", 256, 210},
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
  for (std::uint32_t unknown : {4u, 6u, 7u, 9u, 10u, 11u, 13u, 15u, 31u, 99u, 0xFFFFFFFFu}) CHECK(find_block_format(unknown) == nullptr);
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
