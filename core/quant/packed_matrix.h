// PackedMatrix: an inference-only weight matrix kept in a ggml block format, its (out, in) rows
// interleaved sixteen at a time (core/quant/row_groups.h); packed_matmul, the product y = x W^T
// that decoding runs on it (docs/quantization.md).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "core/quant/block_format.h"

namespace tapegrad::quant {

/// rows x cols weights in groups of 16 rows, each group units() units of 16 rows interleaved
/// (core/quant/row_groups.h), the last group padded with zero rows.
struct PackedMatrix {
  TensorType type = TensorType::F32;
  std::size_t rows = 0;  ///< outputs
  std::size_t cols = 0;  ///< inputs, a multiple of the format's block_elems
  std::span<const std::byte> bytes;  ///< groups() * group_bytes() bytes, starting on a cache line
  std::shared_ptr<const void> owner;  ///< keeps `bytes` alive

  const BlockFormat& format() const { return block_format(type); }
  std::size_t groups() const { return (rows + 15) / 16; }
  std::size_t unit_columns() const;  ///< a row's weights in a unit (row_groups.h)
  std::size_t units() const { return (cols + unit_columns() - 1) / unit_columns(); }
  std::size_t group_bytes() const;
  const std::byte* group(std::size_t g) const { return bytes.data() + g * group_bytes(); }
};

/// Whether packed_matmul has kernels for `type`: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, BF16, F16 and F32.
bool has_packed_kernels(TensorType type);

/// The formats a float matrix can be converted to at load (`--weights`): "bf16", "f16", "q8_0",
/// "q4_0", "q4_1"; null for any other name.
const BlockFormat* find_conversion(std::string_view name);

/// w (rows, cols) float32, row-major, converted to `type` as ggml's reference quantizers do
/// (round-to-nearest-even for bf16 and f16). Throws std::invalid_argument when cols is not a
/// multiple of the format's block, or the type has no kernels or no conversion (Q4_K, Q6_K: read
/// from files only).
PackedMatrix pack_matrix(const float* w, std::size_t rows, std::size_t cols, TensorType type);

/// pack_matrix of w^T, w (cols, rows) row-major (a Linear's (in, out) weight), without a
/// transposed float32 copy.
PackedMatrix pack_transposed(const float* w, std::size_t rows, std::size_t cols, TensorType type);

/// A matrix from the `bytes` of a file's tensor, rows of blocks in ggml's layout, interleaved into
/// its own storage; checks the sizes.
PackedMatrix interleave_matrix(TensorType type, std::size_t rows, std::size_t cols, std::span<const std::byte> bytes);

/// out (count, cols) = rows first .. first + count - 1 of w, dequantized (block_format's dequantize).
void dequantize_rows(const PackedMatrix& w, std::size_t first, std::size_t count, float* out);

/// y (M, rows) = x (M, cols) W^T (+ y when accumulating: y + the product). Each output is computed
/// by the same operations whatever M is, whichever rows share the call, at every SIMD level and
/// thread count (Note [Packed products], core/quant/packed_kernels.h): the block formats through
/// integer dot products with x quantized to 8 bits per block of 32, BF16, F16 and F32 by float products.
/// Outputs are split across the kernel threads when the product is large enough.
void packed_matmul(float* y, const float* x, std::size_t M, const PackedMatrix& w, bool accumulate);

/// One product of packed_matmuls: y (M, w->rows) = x w^T.
struct PackedProduct {
  float* y = nullptr;               ///< (M, w->rows), row-major
  const PackedMatrix* w = nullptr;  ///< the weights, (out, in) rows
};

/// packed_matmul for matrices that read the same x (a layer's q, k and v; gate and up): x is
/// quantized once and the products' outputs, laid end to end, are split across the kernel threads
/// in one parallel region. Every output has the bits packed_matmul gives it. Throws
/// std::invalid_argument when the matrices' column counts differ or a format has no kernels.
void packed_matmuls(std::span<const PackedProduct> products, const float* x, std::size_t M, bool accumulate);

}  // namespace tapegrad::quant
