// The interleaved layout of packed matrices (core/quant/row_groups.h): ggml's blocks decoded into
// their parts (halves, scales, unsigned codes) and written sixteen rows a unit, and back.
#include "core/quant/row_groups.h"

#include <cstring>

#include "core/quant/little_endian.h"

namespace tapegrad::quant {

namespace {

// One row's block in parts: its halves, scale bytes and unsigned codes (Note [Packed products]).
struct Parts {
  std::uint16_t d = 0, m = 0;   // m: Q4_1's minimum, Q4_K's dmin
  std::uint8_t scales[16] = {};  // Q4_K: scales 0-7 then minimums 0-7; Q6_K: 16 signed scales
  std::uint8_t u[256] = {};
};

// A block in ggml's layout (core/quant/block_format.cpp) to parts.
void decode(TensorType type, const std::byte* block, Parts& p) {
  auto byte = [&](std::size_t i) { return unsigned(block[i]); };
  switch (type) {
    case TensorType::Q4_0:
    case TensorType::Q4_1:
    case TensorType::Q5_0: {
      const std::size_t codes = type == TensorType::Q4_0 ? 2 : type == TensorType::Q4_1 ? 4 : 6;
      p.d = load_u16(block);
      if (type == TensorType::Q4_1) p.m = load_u16(block + 2);
      for (int j = 0; j < 16; ++j) p.u[j] = std::uint8_t(byte(codes + j) & 0xF), p.u[j + 16] = std::uint8_t(byte(codes + j) >> 4);
      if (type == TensorType::Q5_0) {
        const std::uint32_t fifth = byte(2) | (byte(3) << 8) | (byte(4) << 16) | (byte(5) << 24);
        for (int j = 0; j < 32; ++j) p.u[j] |= std::uint8_t(((fifth >> j) & 1) << 4);
      }
      return;
    }
    case TensorType::Q8_0:
      p.d = load_u16(block);
      for (int j = 0; j < 32; ++j) p.u[j] = std::uint8_t(byte(2 + j) ^ 0x80);
      return;
    case TensorType::Q4_K: {
      p.d = load_u16(block), p.m = load_u16(block + 2);
      auto at = [&](int i) { return byte(4 + i); };
      for (int i = 0; i < 8; ++i) {  // as dequantize_q4_k unpacks them
        p.scales[i] = std::uint8_t(i < 4 ? at(i) & 0x3F : (at(i + 4) & 0x0F) | ((at(i - 4) >> 2) & 0x30));
        p.scales[8 + i] = std::uint8_t(i < 4 ? at(i + 4) & 0x3F : (at(i + 4) >> 4) | ((at(i) >> 2) & 0x30));
        for (int l = 0; l < 32; ++l) p.u[32 * i + l] = std::uint8_t((byte(16 + 32 * (i / 2) + l) >> (4 * (i % 2))) & 0xF);
      }
      return;
    }
    case TensorType::Q6_K:
      p.d = load_u16(block + 208);
      for (int s = 0; s < 16; ++s) p.scales[s] = std::uint8_t(byte(192 + s));
      for (int half = 0; half < 2; ++half)
        for (int j = 0; j < 4; ++j)
          for (int l = 0; l < 32; ++l) {
            const unsigned low = (byte(64 * half + 32 * (j % 2) + l) >> (4 * (j / 2))) & 0xF;
            const unsigned high = (byte(128 + 32 * half + l) >> (2 * j)) & 0x3;
            p.u[128 * half + 32 * j + l] = std::uint8_t(low | (high << 4));
          }
      return;
    default: return;
  }
}

// Parts back to a block in ggml's layout.
void encode(TensorType type, const Parts& p, std::byte* block) {
  auto put = [&](std::size_t i, unsigned v) { block[i] = std::byte(v & 0xFF); };
  switch (type) {
    case TensorType::Q4_0:
    case TensorType::Q4_1:
    case TensorType::Q5_0: {
      const std::size_t codes = type == TensorType::Q4_0 ? 2 : type == TensorType::Q4_1 ? 4 : 6;
      store_u16(block, p.d);
      if (type == TensorType::Q4_1) store_u16(block + 2, p.m);
      for (int j = 0; j < 16; ++j) put(codes + j, (p.u[j] & 0xF) | ((p.u[j + 16] & 0xF) << 4));
      if (type == TensorType::Q5_0) {
        std::uint32_t fifth = 0;
        for (int j = 0; j < 32; ++j) fifth |= std::uint32_t((p.u[j] >> 4) & 1) << j;
        for (int i = 0; i < 4; ++i) put(2 + i, fifth >> (8 * i));
      }
      return;
    }
    case TensorType::Q8_0:
      store_u16(block, p.d);
      for (int j = 0; j < 32; ++j) put(2 + j, p.u[j] ^ 0x80);
      return;
    case TensorType::Q4_K:
      store_u16(block, p.d), store_u16(block + 2, p.m);
      for (int i = 0; i < 4; ++i) {
        const unsigned scale = p.scales[i], min = p.scales[8 + i], scale4 = p.scales[4 + i], min4 = p.scales[12 + i];
        put(4 + i, scale | ((scale4 >> 4) << 6));
        put(8 + i, min | ((min4 >> 4) << 6));
        put(12 + i, (scale4 & 0xF) | ((min4 & 0xF) << 4));
      }
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) put(16 + 32 * k + l, p.u[64 * k + l] | (p.u[64 * k + 32 + l] << 4));
      return;
    case TensorType::Q6_K:
      std::memset(block, 0, 192);
      for (int half = 0; half < 2; ++half)
        for (int j = 0; j < 4; ++j)
          for (int l = 0; l < 32; ++l) {
            const unsigned u = p.u[128 * half + 32 * j + l];
            block[64 * half + 32 * (j % 2) + l] |= std::byte((u & 0xF) << (4 * (j / 2)));
            block[128 + 32 * half + l] |= std::byte((u >> 4) << (2 * j));
          }
      for (int s = 0; s < 16; ++s) put(192 + s, p.scales[s]);
      store_u16(block + 208, p.d);
      return;
    default: return;
  }
}

// Where byte t of row r's lane of chunk c sits.
constexpr std::size_t lane_byte(std::size_t c, std::size_t r, std::size_t t) { return 64 * c + 4 * r + t; }

// Row r's 32 codes u into nibble chunks at `chunks` (or back).
void put_nibbles(const std::uint8_t* u, std::size_t r, std::byte* chunks) {
  for (std::size_t c = 0; c < 4; ++c)
    for (std::size_t t = 0; t < 4; ++t)
      chunks[lane_byte(c, r, t)] = std::byte((u[4 * c + t] & 0xF) | ((u[16 + 4 * c + t] & 0xF) << 4));
}
void get_nibbles(const std::byte* chunks, std::size_t r, std::uint8_t* u) {
  for (std::size_t c = 0; c < 4; ++c)
    for (std::size_t t = 0; t < 4; ++t) {
      const unsigned v = unsigned(chunks[lane_byte(c, r, t)]);
      u[4 * c + t] = std::uint8_t(v & 0xF), u[16 + 4 * c + t] = std::uint8_t(v >> 4);
    }
}

// Row r's parts into the unit (to = true) or out of it.
void transfer(TensorType type, std::byte* unit, std::size_t r, Parts& p, bool to) {
  const UnitLayout L = unit_layout(type);
  auto half = [&](std::size_t at, std::uint16_t& v) {
    if (to) store_u16(unit + at + 2 * r, v);
    else v = load_u16(unit + at + 2 * r);
  };
  auto scale = [&](std::size_t at, std::uint8_t& v) {
    if (to) unit[at + r] = std::byte(v);
    else v = std::uint8_t(unit[at + r]);
  };
  half(L.d, p.d);
  if (L.m) half(L.m, p.m);
  switch (type) {
    case TensorType::Q4_0:
    case TensorType::Q4_1:
    case TensorType::Q5_0:
      if (to) put_nibbles(p.u, r, unit + L.codes);
      else get_nibbles(unit + L.codes, r, p.u);
      if (type == TensorType::Q5_0)
        for (std::size_t t = 0; t < 4; ++t) {
          std::byte& bits = unit[L.fifth + 4 * r + t];
          if (to) bits = std::byte(0);
          for (std::size_t j = 0; j < 8; ++j) {
            if (to) bits |= std::byte(((p.u[4 * j + t] >> 4) & 1) << j);
            else p.u[4 * j + t] |= std::uint8_t(((unsigned(bits) >> j) & 1) << 4);
          }
        }
      return;
    case TensorType::Q8_0:
      for (std::size_t j = 0; j < 8; ++j)
        for (std::size_t t = 0; t < 4; ++t) {
          std::byte& code = unit[L.codes + lane_byte(j, r, t)];
          if (to) code = std::byte(p.u[4 * j + t]);
          else p.u[4 * j + t] = std::uint8_t(code);
        }
      return;
    case TensorType::Q4_K:
      for (std::size_t s = 0; s < 16; ++s) scale(L.scales + 16 * s, p.scales[s]);
      for (std::size_t s = 0; s < 8; ++s) {
        if (to) put_nibbles(p.u + 32 * s, r, unit + L.codes + s * L.sub_bytes);
        else get_nibbles(unit + L.codes + s * L.sub_bytes, r, p.u + 32 * s);
      }
      return;
    case TensorType::Q6_K:
      for (std::size_t s = 0; s < 16; ++s) scale(L.scales + 16 * s, p.scales[s]);
      for (std::size_t s = 0; s < 8; ++s) {
        std::uint8_t* u = p.u + 32 * s;
        std::byte* sub = unit + L.codes + s * L.sub_bytes;
        if (to) put_nibbles(u, r, sub);
        else get_nibbles(sub, r, u);
        for (std::size_t a = 0; a < 2; ++a)
          for (std::size_t t = 0; t < 4; ++t) {
            std::byte& bits = sub[256 + lane_byte(a, r, t)];
            if (to) bits = std::byte(0);
            for (std::size_t c = 0; c < 4; ++c) {
              std::uint8_t& code = u[4 * (4 * a + c) + t];
              if (to) bits |= std::byte((code >> 4) << (2 * c));
              else code = std::uint8_t(code | (((unsigned(bits) >> (2 * c)) & 3) << 4));
            }
          }
      }
      return;
    default: return;
  }
}

}  // namespace

// Where column k (0..31) of row r sits in a BF16 unit, in bytes (row_groups.h).
constexpr std::size_t bf16_offset(std::size_t k, std::size_t r) {
  const std::size_t word = k / 4 * 2 + k % 2, slot = 1 - k / 2 % 2;
  return 4 * (16 * word + r) + 2 * slot;
}

void interleave_unit(TensorType type, const std::byte* const rows[group_rows], std::byte* unit,
                     std::size_t columns) {
  const BlockFormat& format = block_format(type);
  if (type == TensorType::BF16) {
    std::memset(unit, 0, unit_layout(type).bytes);
    for (std::size_t r = 0; r < group_rows; ++r)
      for (std::size_t k = 0; rows[r] && k < columns; ++k) std::memcpy(unit + bf16_offset(k, r), rows[r] + 2 * k, 2);
    return;
  }
  if (format.block_elems == 1) {  // F16, F32: row r's element at r
    for (std::size_t r = 0; r < group_rows; ++r) {
      if (rows[r]) std::memcpy(unit + r * format.block_bytes, rows[r], format.block_bytes);
      else std::memset(unit + r * format.block_bytes, 0, format.block_bytes);
    }
    return;
  }
  for (std::size_t r = 0; r < group_rows; ++r) {
    Parts parts;  // a missing row: zero halves and codes, so zero weights
    if (rows[r]) decode(type, rows[r], parts);
    transfer(type, unit, r, parts, true);
  }
}

void deinterleave_unit(TensorType type, const std::byte* unit, std::size_t r, std::byte* block, std::size_t columns) {
  const BlockFormat& format = block_format(type);
  if (type == TensorType::BF16) {
    for (std::size_t k = 0; k < columns; ++k) std::memcpy(block + 2 * k, unit + bf16_offset(k, r), 2);
    return;
  }
  if (format.block_elems == 1) {
    std::memcpy(block, unit + r * format.block_bytes, format.block_bytes);
    return;
  }
  Parts parts;
  transfer(type, const_cast<std::byte*>(unit), r, parts, false);
  encode(type, parts, block);
}

}  // namespace tapegrad::quant
