// The block formats of ggml's quantized and half-precision tensors (ggml's type_traits table):
// per type its name, elements and bytes per block, a dequantizer to float32 that gives the bits of
// the gguf package's gguf.quants.dequantize, and for the types tapegrad writes a quantizer that
// gives the bits of gguf.quants.quantize.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tapegrad::quant {

/// ggml's tensor types that tapegrad reads, with ggml's ids (the ids stored in GGUF files).
enum class TensorType : std::uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14, BF16 = 30
};

/// One block format: n elements are stored as n / block_elems blocks of block_bytes each.
struct BlockFormat {
  TensorType type;
  const char* name;  ///< ggml's name: "f32", "q4_1", ...
  std::size_t block_elems;
  std::size_t block_bytes;
  /// Writes n_elems floats (a multiple of block_elems) from the n_elems / block_elems blocks at
  /// `blocks` (little-endian, unaligned).
  void (*dequantize)(const std::byte* blocks, float* out, std::size_t n_elems);
  /// Writes n_elems floats (a multiple of block_elems) as n_elems / block_elems blocks, the bits
  /// of gguf.quants.quantize; null for the types tapegrad does not write (f32, f16, bf16 and q8_0
  /// it does). Non-finite inputs of a block type (q8_0) give blocks as unspecified as numpy's.
  void (*quantize)(const float* in, std::byte* blocks, std::size_t n_elems) = nullptr;
};

/// The format of ggml type id `ggml_type`, or null when tapegrad does not read it.
const BlockFormat* find_block_format(std::uint32_t ggml_type);

/// The format of a known type.
const BlockFormat& block_format(TensorType type);

/// IEEE half (binary16) bits to float32, exactly (subnormals, infinities and NaN payloads kept).
float f16_to_f32(std::uint16_t bits);

/// bfloat16 bits to float32, exactly: the bits are float32's upper half.
float bf16_to_f32(std::uint16_t bits);

/// float32 to IEEE half bits, rounded to nearest even (numpy's astype(float16)): past 65504 a value
/// rounds to infinity, below 2^-14 to a subnormal or zero; a NaN keeps its sign and top payload
/// bits (a payload that would vanish becomes 1).
std::uint16_t f32_to_f16(float value);

/// float32 to bfloat16 bits, rounded to nearest even (ggml's ggml_compute_fp32_to_bf16, the gguf
/// package, torch): a NaN keeps its sign and upper payload and is made quiet (bit 6 of the half set).
std::uint16_t f32_to_bf16(float value);

}  // namespace tapegrad::quant
