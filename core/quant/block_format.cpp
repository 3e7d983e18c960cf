// The block-format table, its scalar dequantizers and quantizers. Each one computes, in float32 and
// in the same order, what gguf.quants.dequantize (or quantize) computes (e.g. Q4_K is
// (d*sc)*q - dmin*m, not d*(sc*q) - ...), so the bits agree; this file is compiled with
// -ffp-contract=off so that no a*b - c becomes a fused multiply-add.
#include "core/quant/block_format.h"

#include <fmt/format.h>

#include <array>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "core/bf16.h"
#include "core/quant/little_endian.h"

namespace tapegrad::quant {

namespace {

float load_f16(const std::byte* p) { return f16_to_f32(load_u16(p)); }

void dequantize_f32(const std::byte* blocks, float* out, std::size_t n_elems) {
  for (std::size_t i = 0; i < n_elems; ++i) {
    const std::byte* p = blocks + 4 * i;
    out[i] = std::bit_cast<float>(std::uint32_t(unsigned(p[0]) | (unsigned(p[1]) << 8) | (unsigned(p[2]) << 16) |
                                                (std::uint32_t(p[3]) << 24)));
  }
}

void dequantize_f16(const std::byte* blocks, float* out, std::size_t n_elems) {
  for (std::size_t i = 0; i < n_elems; ++i) out[i] = load_f16(blocks + 2 * i);
}

void dequantize_bf16(const std::byte* blocks, float* out, std::size_t n_elems) {
  for (std::size_t i = 0; i < n_elems; ++i) out[i] = bf16_to_f32(load_u16(blocks + 2 * i));
}

void quantize_f32(const float* in, std::byte* blocks, std::size_t n_elems) {
  for (std::size_t i = 0; i < n_elems; ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(in[i]);
    for (int b = 0; b < 4; ++b) blocks[4 * i + b] = std::byte((bits >> (8 * b)) & 0xFF);
  }
}

void quantize_f16(const float* in, std::byte* blocks, std::size_t n_elems) {
  for (std::size_t i = 0; i < n_elems; ++i) store_u16(blocks + 2 * i, f32_to_f16(in[i]));
}

void quantize_bf16(const float* in, std::byte* blocks, std::size_t n_elems) {
  for (std::size_t i = 0; i < n_elems; ++i) store_u16(blocks + 2 * i, f32_to_bf16(in[i]));
}

// Q4_0, 18 bytes: f16 d, 16 bytes of nibbles; byte j holds element j (low) and j + 16 (high).
// y = d * (q - 8).
void dequantize_q4_0(const std::byte* blocks, float* out, std::size_t n_elems) {
  for (std::size_t b = 0; b < n_elems / 32; ++b, blocks += 18, out += 32) {
    const float d = load_f16(blocks);
    const std::byte* qs = blocks + 2;
    for (int j = 0; j < 16; ++j) {
      const unsigned byte = unsigned(qs[j]);
      out[j] = d * float(int(byte & 0xF) - 8);
      out[j + 16] = d * float(int(byte >> 4) - 8);
    }
  }
}

// Q4_1, 20 bytes: f16 d, f16 m (the block's minimum), then Q4_0's nibbles unsigned. y = d*q + m.
void dequantize_q4_1(const std::byte* blocks, float* out, std::size_t n_elems) {
  for (std::size_t b = 0; b < n_elems / 32; ++b, blocks += 20, out += 32) {
    const float d = load_f16(blocks), m = load_f16(blocks + 2);
    const std::byte* qs = blocks + 4;
    for (int j = 0; j < 16; ++j) {
      const unsigned byte = unsigned(qs[j]);
      out[j] = d * float(byte & 0xF) + m;
      out[j + 16] = d * float(byte >> 4) + m;
    }
  }
}

// Q5_0, 22 bytes: f16 d, 32 bits (bit j: element j's fifth bit), then Q4_0's nibbles.
// y = d * (q - 16).
void dequantize_q5_0(const std::byte* blocks, float* out, std::size_t n_elems) {
  for (std::size_t b = 0; b < n_elems / 32; ++b, blocks += 22, out += 32) {
    const float d = load_f16(blocks);
    const std::uint32_t fifth = std::uint32_t(load_u16(blocks + 2)) | (std::uint32_t(load_u16(blocks + 4)) << 16);
    const std::byte* qs = blocks + 6;
    for (int j = 0; j < 16; ++j) {
      const unsigned byte = unsigned(qs[j]);
      const int low = int((byte & 0xF) | (((fifth >> j) & 1) << 4));
      const int high = int((byte >> 4) | (((fifth >> (j + 16)) & 1) << 4));
      out[j] = d * float(low - 16);
      out[j + 16] = d * float(high - 16);
    }
  }
}

// Q8_0, 34 bytes: f16 d, 32 signed bytes. y = q * d.
void dequantize_q8_0(const std::byte* blocks, float* out, std::size_t n_elems) {
  for (std::size_t b = 0; b < n_elems / 32; ++b, blocks += 34, out += 32) {
    const float d = load_f16(blocks);
    for (int j = 0; j < 32; ++j) out[j] = float(std::int8_t(blocks[2 + j])) * d;
  }
}

// d = max|x| / 127 and q = round(x * (1/d)), halves away from zero (gguf.quants' np_roundf:
// floor(a) + floor(2 (a - floor(a))) on a = |x/d|), all in float32; a block of zeros has d = 0, q = 0.
void quantize_q8_0(const float* in, std::byte* blocks, std::size_t n_elems) {
  for (std::size_t b = 0; b < n_elems / 32; ++b, blocks += 34, in += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(in[j]));
    const float d = amax / 127.0f;
    const float inverse = d == 0.0f ? 0.0f : 1.0f / d;
    store_u16(blocks, f32_to_f16(d));
    for (int j = 0; j < 32; ++j) {
      const float scaled = in[j] * inverse, magnitude = std::fabs(scaled), floored = std::floor(magnitude);
      const float rounded = floored + std::floor(2.0f * (magnitude - floored));
      blocks[2 + j] = std::byte(std::uint8_t(std::int8_t(scaled < 0.0f ? -rounded : rounded)));
    }
  }
}

// Q4_K, 144 bytes: f16 d, f16 dmin, 12 bytes packing eight 6-bit (scale, min) pairs, 128 bytes of
// nibbles. Sub-block i (32 elements) takes the low nibbles of bytes 32*(i/2) .. +31 when i is even,
// their high nibbles when odd. y = (d*scale_i)*q - dmin*min_i.
void dequantize_q4_k(const std::byte* blocks, float* out, std::size_t n_elems) {
  for (std::size_t b = 0; b < n_elems / 256; ++b, blocks += 144, out += 256) {
    const float d = load_f16(blocks), dmin = load_f16(blocks + 2);
    const std::byte* packed = blocks + 4;
    const std::byte* qs = blocks + 16;
    auto at = [&](int i) { return unsigned(packed[i]); };
    for (int i = 0; i < 8; ++i) {
      // Bytes 0-3: scales 0-3 (low 6 bits); 4-7: mins 0-3; 8-11: the low 4 bits of scales and mins
      // 4-7, whose top 2 bits are the top bits of bytes 0-3 and 4-7.
      const unsigned scale = i < 4 ? at(i) & 0x3F : (at(i + 4) & 0x0F) | ((at(i - 4) >> 2) & 0x30);
      const unsigned min = i < 4 ? at(i + 4) & 0x3F : (at(i + 4) >> 4) | ((at(i) >> 2) & 0x30);
      const float scaled_d = d * float(scale), scaled_min = dmin * float(min);
      const std::byte* q = qs + 32 * (i / 2);
      const int shift = 4 * (i % 2);
      for (int l = 0; l < 32; ++l) out[32 * i + l] = scaled_d * float((unsigned(q[l]) >> shift) & 0xF) - scaled_min;
    }
  }
}

// Q6_K, 210 bytes: 128 bytes of low nibbles (ql), 64 bytes of high 2-bit pairs (qh), 16 signed
// scales (one per 16 elements), f16 d. In each half of 128 elements, element 32*j + l takes
// ql[l + 32*(j%2)] >> 4*(j/2) and qh[l] >> 2*j; q = (low | high << 4) - 32; y = (d*scale)*q.
void dequantize_q6_k(const std::byte* blocks, float* out, std::size_t n_elems) {
  for (std::size_t b = 0; b < n_elems / 256; ++b, blocks += 210, out += 256) {
    const std::byte* ql = blocks;
    const std::byte* qh = blocks + 128;
    const std::byte* scales = blocks + 192;
    const float d = load_f16(blocks + 208);
    std::array<float, 16> scaled_d;
    for (int s = 0; s < 16; ++s) scaled_d[s] = d * float(std::int8_t(scales[s]));
    for (int half = 0; half < 2; ++half) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          const unsigned low = (unsigned(ql[64 * half + 32 * (j % 2) + l]) >> (4 * (j / 2))) & 0xF;
          const unsigned high = (unsigned(qh[32 * half + l]) >> (2 * j)) & 0x3;
          const int element = 128 * half + 32 * j + l;
          out[element] = scaled_d[element / 16] * float(int(low | (high << 4)) - 32);
        }
      }
    }
  }
}

constexpr std::array<BlockFormat, 9> kFormats{{
    {TensorType::F32, "f32", 1, 4, dequantize_f32, quantize_f32},
    {TensorType::F16, "f16", 1, 2, dequantize_f16, quantize_f16},
    {TensorType::Q4_0, "q4_0", 32, 18, dequantize_q4_0},
    {TensorType::Q4_1, "q4_1", 32, 20, dequantize_q4_1},
    {TensorType::Q5_0, "q5_0", 32, 22, dequantize_q5_0},
    {TensorType::Q8_0, "q8_0", 32, 34, dequantize_q8_0, quantize_q8_0},
    {TensorType::Q4_K, "q4_K", 256, 144, dequantize_q4_k},
    {TensorType::Q6_K, "q6_K", 256, 210, dequantize_q6_k},
    {TensorType::BF16, "bf16", 1, 2, dequantize_bf16, quantize_bf16},
}};

}  // namespace

const BlockFormat* find_block_format(std::uint32_t ggml_type) {
  for (const BlockFormat& format : kFormats)
    if (std::uint32_t(format.type) == ggml_type) return &format;
  return nullptr;
}

const BlockFormat& block_format(TensorType type) {
  if (const BlockFormat* format = find_block_format(std::uint32_t(type))) return *format;
  throw std::invalid_argument(fmt::format("quant::block_format: unknown tensor type {}", std::uint32_t(type)));
}

float f16_to_f32(std::uint16_t bits) {
  const std::uint32_t sign = std::uint32_t(bits >> 15) << 31;
  std::uint32_t exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // A subnormal half, mantissa * 2^-24, is a normal float: shift the mantissa up to its
    // implicit bit, lowering the exponent once per shift.
    std::uint32_t float_exponent = 127 - 15 + 1;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --float_exponent;
    }
    return std::bit_cast<float>(sign | (float_exponent << 23) | ((mantissa & 0x3FF) << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

float bf16_to_f32(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

std::uint16_t f32_to_f16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = std::uint16_t((bits >> 16) & 0x8000);
  const std::uint32_t magnitude = bits & 0x7FFFFFFF, exponent = magnitude >> 23, mantissa = magnitude & 0x7FFFFF;
  if (exponent == 0xFF) {
    if (mantissa == 0) return sign | 0x7C00;
    const std::uint16_t nan = std::uint16_t(0x7C00 | (mantissa >> 13));
    return sign | (nan == 0x7C00 ? 0x7C01 : nan);
  }
  if (magnitude >= 0x47800000) return sign | 0x7C00;  // 2^16 and up: past the largest half
  // Keeps `shift` low bits of `significand` off, rounding to nearest even.
  const auto round_off = [](std::uint32_t significand, std::uint32_t shift) {
    const std::uint32_t kept = significand >> shift, rest = significand & ((1u << shift) - 1), half = 1u << (shift - 1);
    return kept + ((rest > half || (rest == half && (kept & 1))) ? 1u : 0u);
  };
  if (exponent < 113) {  // below 2^-14: a subnormal half, (implicit 1 . mantissa) * 2^(exponent - 127) / 2^-24
    if (exponent < 102) return sign;  // below 2^-25: rounds to zero
    return sign | std::uint16_t(round_off(mantissa | 0x800000, 126 - exponent));
  }
  // A carry out of the mantissa raises the exponent, to infinity at the top: the encoding's order.
  return sign | std::uint16_t(round_off((exponent - 112) << 23 | mantissa, 13));
}

std::uint16_t f32_to_bf16(float value) { return to_bf16_bits(value); }  // the one rounding (core/bf16.h)

}  // namespace tapegrad::quant
