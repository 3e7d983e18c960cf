// The block formats of ggml's quantized and half-precision tensors (ggml's type_traits table):
// per type its name, elements and bytes per block, and a dequantizer to float32 that gives the
// bits of the gguf package's gguf.quants.dequantize.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tapegrad::quant {

/// ggml's tensor types that tapegrad reads, with ggml's ids (the ids stored in GGUF files).
enum class TensorType : std::uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q6_K = 14, BF16 = 30 };

/// One block format: n elements are stored as n / block_elems blocks of block_bytes each.
struct BlockFormat {
  TensorType type;
  const char* name;  ///< ggml's name: "f32", "q4_1", ...
  std::size_t block_elems;
  std::size_t block_bytes;
  /// Writes n_elems floats (a multiple of block_elems) from the n_elems / block_elems blocks at
  /// `blocks` (little-endian, unaligned).
  void (*dequantize)(const std::byte* blocks, float* out, std::size_t n_elems);
};

/// The format of ggml type id `ggml_type`, or null when tapegrad does not read it.
const BlockFormat* find_block_format(std::uint32_t ggml_type);

/// The format of a known type.
const BlockFormat& block_format(TensorType type);

/// IEEE half (binary16) bits to float32, exactly (subnormals, infinities and NaN payloads kept).
float f16_to_f32(std::uint16_t bits);

/// bfloat16 bits to float32, exactly: the bits are float32's upper half.
float bf16_to_f32(std::uint16_t bits);

}  // namespace tapegrad::quant
