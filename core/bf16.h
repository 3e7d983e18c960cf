// bfloat16, the upper half of a float32's bits: float32's rounding to it (nearest even) and back,
// inline for the kernels' packing loops (core/kernels/matmul_bf16.cpp) and every other user.
#pragma once

#include <bit>
#include <cstdint>

namespace tapegrad {

/// float32 to bfloat16 bits, rounded to nearest even (as ggml, the gguf package and torch do); a
/// NaN keeps its sign and upper payload and is made quiet (bit 6 of the half set).
inline std::uint16_t to_bf16_bits(float value) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) return std::uint16_t((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return std::uint16_t(bits >> 16);
}

/// bfloat16 bits to float32, exactly.
inline float from_bf16_bits(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

/// value rounded to the nearest bfloat16 (ties to even), as a float32.
inline float round_to_bf16(float value) { return from_bf16_bits(to_bf16_bits(value)); }

}  // namespace tapegrad
