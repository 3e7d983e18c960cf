// PackedMatrix: conversion from float32 (ggml's reference quantizers), views of a file's bytes,
// dequantized rows, and packed_matmul: x quantized into 8-bit blocks once per call, then the
// level's kernel on each thread's share of the outputs (Note [Packed products]).
#include "core/quant/packed_matrix.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/aligned.h"
#include "core/kernels.h"
#include "core/quant/little_endian.h"
#include "core/quant/packed_kernels.h"
#include "core/quant/row_groups.h"
#include "core/simd.h"

#ifndef TAPEGRAD_HAVE_EMULATED16
#error "CMakeLists.txt says whether this build has the emulated16 test level"
#endif

namespace tapegrad::quant {

namespace {

// The block's value of largest magnitude, sign kept (the first of equal magnitudes), as ggml's
// reference quantizers of Q4_0 and Q5_0 find it.
float largest_magnitude(const float* x) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
  return max;
}

// Q4_0 (quantize_row_q4_0_ref): d = the value of largest magnitude / -8, q = x / d + 8 in 0..15.
void quantize_q4_0(const float* x, std::byte* block) {
  const float d = largest_magnitude(x) / -8, id = d != 0 ? 1 / d : 0;
  store_u16(block, f32_to_f16(d));
  auto code = [&](int j) { return unsigned(std::min(15, int(std::int8_t(x[j] * id + 8.5f)))); };
  for (int j = 0; j < 16; ++j) block[2 + j] = std::byte(code(j) | (code(j + 16) << 4));
}

// Q4_1 (quantize_row_q4_1_ref): d = (max - min) / 15, m = min, q = (x - min) / d in 0..15.
void quantize_q4_1(const float* x, std::byte* block) {
  float min = x[0], max = x[0];
  for (int j = 1; j < 32; ++j) min = std::min(min, x[j]), max = std::max(max, x[j]);
  const float d = (max - min) / 15, id = d != 0 ? 1 / d : 0;
  store_u16(block, f32_to_f16(d));
  store_u16(block + 2, f32_to_f16(min));
  auto code = [&](int j) { return unsigned(std::min(15, int(std::int8_t((x[j] - min) * id + 0.5f)))); };
  for (int j = 0; j < 16; ++j) block[4 + j] = std::byte(code(j) | (code(j + 16) << 4));
}

// Q5_0 (quantize_row_q5_0_ref): d = the value of largest magnitude / -16, q = x / d + 16 in 0..31,
// the fifth bits apart.
void quantize_q5_0(const float* x, std::byte* block) {
  const float d = largest_magnitude(x) / -16, id = d != 0 ? 1 / d : 0;
  store_u16(block, f32_to_f16(d));
  auto code = [&](int j) { return unsigned(std::min(31, int(std::int8_t(x[j] * id + 16.5f)))); };
  std::uint32_t fifth = 0;
  for (int j = 0; j < 16; ++j) {
    fifth |= ((code(j) >> 4) << j) | ((code(j + 16) >> 4) << (j + 16));
    block[6 + j] = std::byte((code(j) & 0xF) | ((code(j + 16) & 0xF) << 4));
  }
  store_u16(block + 2, std::uint16_t(fifth & 0xFFFF));
  store_u16(block + 4, std::uint16_t(fifth >> 16));
}

void pack_row(const float* x, std::size_t cols, TensorType type, std::byte* out) {
  switch (type) {
    case TensorType::F32:
    case TensorType::BF16:
    case TensorType::F16:
    case TensorType::Q8_0:  // the writers' quantizers: a converted matrix has the bits of its file
      block_format(type).quantize(x, out, cols);
      return;
    case TensorType::Q4_0:
      for (std::size_t b = 0; b < cols / 32; ++b) quantize_q4_0(x + 32 * b, out + 18 * b);
      return;
    case TensorType::Q4_1:
      for (std::size_t b = 0; b < cols / 32; ++b) quantize_q4_1(x + 32 * b, out + 20 * b);
      return;
    case TensorType::Q5_0:
      for (std::size_t b = 0; b < cols / 32; ++b) quantize_q5_0(x + 32 * b, out + 22 * b);
      return;
    default: break;
  }
  throw std::invalid_argument(fmt::format("pack_matrix: no conversion to {}", block_format(type).name));
}

}  // namespace

bool has_packed_kernels(TensorType type) {
  return type == TensorType::Q4_0 || type == TensorType::Q4_1 || type == TensorType::Q5_0 ||
         type == TensorType::Q8_0 || type == TensorType::Q4_K || type == TensorType::Q6_K ||
         type == TensorType::BF16 || type == TensorType::F16 || type == TensorType::F32;
}

const BlockFormat* find_conversion(std::string_view name) {
  for (TensorType type : {TensorType::BF16, TensorType::F16, TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1})
    if (block_format(type).name == name) return &block_format(type);
  return nullptr;
}

std::size_t PackedMatrix::unit_columns() const { return unit_layout(type).columns; }
std::size_t PackedMatrix::group_bytes() const { return units() * unit_layout(type).bytes; }

namespace {

void check_shape(TensorType type, std::size_t rows, std::size_t cols, bool converting) {
  const BlockFormat& format = block_format(type);
  if (has_packed_kernels(type) && cols % format.block_elems == 0) return;
  if (converting)
    throw std::invalid_argument(fmt::format("pack_matrix: a ({}, {}) matrix cannot be {} (its rows must be whole "
                                            "blocks of {})",
                                            rows, cols, format.name, format.block_elems));
  throw std::invalid_argument(fmt::format("PackedMatrix: a ({}, {}) matrix of {} has no kernels (block formats need "
                                          "columns in whole blocks of {})",
                                          rows, cols, format.name, format.block_elems));
}

// Storage for packed weights, carved from chunks of 32 MB on 2 MB pages where the kernel gives them
// (transparent huge pages on request): a product streams its weights, and on 4 KB pages each 4 KB
// of them costs a TLB miss (Q8_0's one-row product streamed 1.3x as fast on 2 MB pages). Matrices
// share a chunk, so that a model of many small matrices holds about the pages its bytes need; a
// chunk is freed with the last matrix in it.
std::shared_ptr<std::byte> packed_storage(std::size_t bytes) {
  constexpr std::size_t chunk_bytes = std::size_t(32) << 20;
  auto allocate = [](std::size_t size) { return std::shared_ptr<std::byte>(allocate_huge_pages(size), std::free); };
  const std::size_t lines = (bytes + 63) / 64 * 64;
  if (lines > chunk_bytes / 4) return allocate(lines);
  static std::mutex mutex;
  static std::weak_ptr<std::byte> carving;
  static std::size_t used = 0;
  std::lock_guard lock(mutex);
  std::shared_ptr<std::byte> chunk = carving.lock();
  if (!chunk || used + lines > chunk_bytes) chunk = allocate(chunk_bytes), carving = chunk, used = 0;
  std::shared_ptr<std::byte> part(chunk, chunk.get() + used);
  used += lines;
  return part;
}

// A matrix of `type` whose row r's blocks (ggml's layout) row_blocks(r) gives, 16 rows at a time.
template <class RowBlocks>
PackedMatrix interleave_rows(TensorType type, std::size_t rows, std::size_t cols, RowBlocks row_blocks) {
  PackedMatrix w{type, rows, cols, {}, nullptr};
  std::shared_ptr<std::byte> storage = packed_storage(w.groups() * w.group_bytes());
  const std::size_t unit_columns = w.unit_columns(), unit_bytes = unit_layout(type).bytes;
  const std::size_t row_bytes_per_unit = unit_columns / w.format().block_elems * w.format().block_bytes;
  for (std::size_t g = 0; g < w.groups(); ++g) {
    const std::byte* blocks[group_rows];
    for (std::size_t r = 0; r < group_rows; ++r) blocks[r] = 16 * g + r < rows ? row_blocks(16 * g + r) : nullptr;
    std::byte* group = storage.get() + g * w.group_bytes();
    for (std::size_t u = 0; u < w.units(); ++u) {
      interleave_unit(type, blocks, group + u * unit_bytes, std::min(unit_columns, cols - u * unit_columns));
      for (const std::byte*& block : blocks)
        if (block) block += row_bytes_per_unit;
    }
  }
  w.bytes = {storage.get(), w.groups() * w.group_bytes()};
  w.owner = std::move(storage);
  return w;
}

}  // namespace

PackedMatrix interleave_matrix(TensorType type, std::size_t rows, std::size_t cols, std::span<const std::byte> bytes) {
  check_shape(type, rows, cols, false);
  const std::size_t row_bytes = cols / block_format(type).block_elems * block_format(type).block_bytes;
  if (bytes.size() != rows * row_bytes)
    throw std::invalid_argument(fmt::format("PackedMatrix: a ({}, {}) matrix of {} is {} bytes, got {}", rows, cols,
                                            block_format(type).name, rows * row_bytes, bytes.size()));
  return interleave_rows(type, rows, cols, [&](std::size_t r) { return bytes.data() + r * row_bytes; });
}

// A (rows, cols) matrix of `type`, row r converted from the floats row(r) returns.
template <class Row>
static PackedMatrix pack_rows(std::size_t rows, std::size_t cols, TensorType type, Row row) {
  check_shape(type, rows, cols, true);
  const std::size_t row_bytes = cols / block_format(type).block_elems * block_format(type).block_bytes;
  std::vector<std::byte> group(group_rows * row_bytes);
  return interleave_rows(type, rows, cols, [&](std::size_t r) {
    pack_row(row(r), cols, type, group.data() + r % group_rows * row_bytes);
    return group.data() + r % group_rows * row_bytes;
  });
}

PackedMatrix pack_matrix(const float* w, std::size_t rows, std::size_t cols, TensorType type) {
  return pack_rows(rows, cols, type, [&](std::size_t r) { return w + r * cols; });
}

PackedMatrix pack_transposed(const float* w, std::size_t rows, std::size_t cols, TensorType type) {
  // Columns of w gathered 16 at a time, so that each line of w is read once.
  std::vector<float> gathered(group_rows * cols);
  return pack_rows(rows, cols, type, [&](std::size_t r) {
    const std::size_t first = r / group_rows * group_rows, count = std::min(group_rows, rows - first);
    if (r == first)
      for (std::size_t c = 0; c < cols; ++c)
        for (std::size_t i = 0; i < count; ++i) gathered[i * cols + c] = w[c * rows + first + i];
    return gathered.data() + (r - first) * cols;
  });
}

void dequantize_rows(const PackedMatrix& w, std::size_t first, std::size_t count, float* out) {
  if (first + count > w.rows)
    throw std::out_of_range(fmt::format("dequantize_rows: rows {}..{} of a matrix of {}", first, first + count, w.rows));
  const BlockFormat& format = w.format();
  const std::size_t unit_bytes = unit_layout(w.type).bytes, unit_columns = w.unit_columns();
  std::vector<std::byte> block(unit_columns / format.block_elems * format.block_bytes);
  for (std::size_t r = first; r < first + count; ++r, out += w.cols) {
    const std::byte* group = w.group(r / group_rows);
    for (std::size_t u = 0; u < w.units(); ++u) {
      const std::size_t columns = std::min(unit_columns, w.cols - u * unit_columns);
      deinterleave_unit(w.type, group + u * unit_bytes, r % group_rows, block.data(), columns);
      format.dequantize(block.data(), out + u * unit_columns, columns);
    }
  }
}

void quantize_activations(const float* x, std::size_t rows, std::size_t cols, QuantizedActivations& out) {
  const std::size_t blocks = (cols + 31) / 32;
  const std::size_t q_bytes = rows * blocks * 32, block_bytes = rows * blocks * 4;
  const std::size_t needed = q_bytes + 5 * block_bytes + 64;
  if (out.capacity < needed) {
    out.storage = std::make_unique<std::byte[]>(needed);
    out.capacity = needed;
  }
  std::byte* base = out.storage.get();
  base += (64 - reinterpret_cast<std::uintptr_t>(base) % 64) % 64;
  auto* q = reinterpret_cast<std::int8_t*>(base);
  auto* d = reinterpret_cast<float*>(base + q_bytes);
  auto* neg_sums = reinterpret_cast<std::int32_t*>(base + q_bytes + block_bytes);
  auto* scaled_sums = reinterpret_cast<float*>(base + q_bytes + 2 * block_bytes);
  auto* neg_half_sums = reinterpret_cast<std::int32_t*>(base + q_bytes + 3 * block_bytes);
  const RowQuantizer quantize_row = active_packed_table().quantize_row;
  for (std::size_t m = 0; m < rows; ++m)
    quantize_row(x + m * cols, cols, q + m * blocks * 32, d + m * blocks, neg_sums + m * blocks,
                 neg_half_sums + 2 * m * blocks, scaled_sums + m * blocks);
  out.rows = {.x = x, .rows = rows, .cols = cols, .blocks = blocks, .q = q, .d = d, .neg_sums = neg_sums,
              .neg_half_sums = neg_half_sums, .scaled_sums = scaled_sums};
}

void pair_activations(const PackedKernelTable& table, const float* x, std::size_t rows, std::size_t cols,
                      QuantizedActivations& out) {
  const std::size_t words = (cols + 31) / 32 * table.bf16_block_words;
  if (out.pairs.size() < rows * words) out.pairs.resize(rows * words);
  for (std::size_t m = 0; m < rows; ++m) table.pair_row(x + m * cols, cols, out.pairs.data() + m * words);
  out.rows.bf16_pairs = out.pairs.data(), out.rows.bf16_words = words;
}

std::span<const PackedKernelTable> level_packed_tables() {
  switch (simd_level()) {
    case SimdLevel::avx512: return kernels::avx512::packed_tables();
    case SimdLevel::avx2: return kernels::avx2::packed_tables();
#if TAPEGRAD_HAVE_EMULATED16
    case SimdLevel::emulated16: return kernels::emulated16::packed_tables();
#else
    case SimdLevel::emulated16: break;
#endif
    case SimdLevel::sse2: break;
  }
  return kernels::sse2::packed_tables();
}

const PackedKernelTable& active_packed_table() { return level_packed_tables().front(); }

namespace {

PackedKernel kernel_for(const PackedKernelTable& table, const PackedMatrix& w) {
  switch (w.type) {
    case TensorType::Q4_0: return table.q4_0;
    case TensorType::Q4_1: return table.q4_1;
    case TensorType::Q5_0: return table.q5_0;
    case TensorType::Q8_0: return table.q8_0;
    case TensorType::Q4_K: return table.q4_k;
    case TensorType::Q6_K: return table.q6_k;
    case TensorType::BF16: return table.bf16;
    case TensorType::F16: return table.f16;
    case TensorType::F32: return table.f32;
    default: break;
  }
  throw std::invalid_argument(fmt::format("packed_matmul: no kernels for {}", w.format().name));
}

}  // namespace

void packed_matmul(float* y, const float* x, std::size_t M, const PackedMatrix& w, bool accumulate) {
  const PackedProduct product{y, &w};
  packed_matmuls({&product, 1}, x, M, accumulate);
}

void packed_matmuls(std::span<const PackedProduct> products, const float* x, std::size_t M, bool accumulate) {
  const PackedKernelTable& table = active_packed_table();
  std::size_t total_rows = 0, total_bytes = 0;
  bool blocks = false, bf16 = false;
  for (const PackedProduct& p : products) {
    kernel_for(table, *p.w);
    if (p.w->cols != products[0].w->cols)
      throw std::invalid_argument(fmt::format("packed_matmuls: matrices of {} and {} columns cannot share x",
                                              products[0].w->cols, p.w->cols));
    total_rows += p.w->rows, total_bytes += p.w->bytes.size();
    blocks = blocks || p.w->format().block_elems > 1;  // blocks of 32, or K-quants' of 256
    bf16 = bf16 || p.w->type == TensorType::BF16;
  }
  if (M == 0 || total_rows == 0) return;
  const std::size_t cols = products[0].w->cols;
  static thread_local QuantizedActivations activations;
  if (blocks) {
    quantize_activations(x, M, cols, activations);  // once for every block format: x's blocks do not depend on W's
  } else {
    activations.rows = {};
    activations.rows.x = x, activations.rows.rows = M, activations.rows.cols = cols;
  }
  if (bf16) pair_activations(table, x, M, cols, activations);  // once, as the blocks
  const ActivationRows& rows = activations.rows;
  // Outputs first .. last - 1 of the products' rows laid end to end; each kernel walks its share in
  // panels that stay in L2 while x's rows pass (quant_matmul_tiles.h).
  auto outputs = [&](std::size_t first, std::size_t last) {
    std::size_t offset = 0;
    for (const PackedProduct& p : products) {
      const PackedMatrix& w = *p.w;
      const std::size_t from = std::clamp(first, offset, offset + w.rows) - offset;
      const std::size_t to = std::clamp(last, offset, offset + w.rows) - offset;
      offset += w.rows;
      if (from < to) kernel_for(table, w)(p.y, w.rows, rows, w, from, to, accumulate);
    }
  };
  // Outputs split into one contiguous share per thread, in whole groups of 16 where the products'
  // rows are: each output is computed whole by one thread, so the thread count never changes a bit.
  const int threads = num_threads();
  constexpr std::size_t min_parallel_bytes = 1 << 16;
  if (threads <= 1 || omp_in_parallel() || total_rows < 64 || M * total_bytes < min_parallel_bytes) {
    outputs(0, total_rows);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const std::size_t t = std::size_t(omp_get_thread_num()), n = std::size_t(omp_get_num_threads());
    const std::size_t first = total_rows * t / n / 16 * 16;
    const std::size_t last = t + 1 == n ? total_rows : total_rows * (t + 1) / n / 16 * 16;
    outputs(first, last);
  }
}

}  // namespace tapegrad::quant
