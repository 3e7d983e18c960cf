// Private to core/: the little-endian halves and words of GGUF blocks and packed units, read and
// written at any alignment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tapegrad::quant {

inline std::uint16_t load_u16(const std::byte* p) { return std::uint16_t(unsigned(p[0]) | (unsigned(p[1]) << 8)); }

inline std::uint32_t load_u32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);  // x86: little-endian
  return v;
}

inline void store_u16(std::byte* p, std::uint16_t v) {
  p[0] = std::byte(v & 0xFF);
  p[1] = std::byte(v >> 8);
}

}  // namespace tapegrad::quant
