// PackedMatrix: conversion from float32 (ggml's reference quantizers), views of a file's bytes,
// dequantized rows, and packed_matmul: x quantized into 8-bit blocks once per call, then the
// level's kernel on each thread's share of the outputs (Note [Packed products]).
#include "core/quant/packed_matrix.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/aligned.h"
#include "core/kernels.h"
#include "core/quant/packed_kernels.h"
#include "core/simd.h"

#ifndef TAPEGRAD_HAVE_EMULATED16
#error "CMakeLists.txt says whether this build has the emulated16 test level"
#endif

namespace tapegrad::quant {

namespace {

void store_u16(std::byte* p, std::uint16_t v) {
  p[0] = std::byte(v & 0xFF);
  p[1] = std::byte(v >> 8);
}

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

PackedMatrix view_matrix(TensorType type, std::size_t rows, std::size_t cols, std::span<const std::byte> bytes,
                         std::shared_ptr<const void> owner) {
  const BlockFormat& format = block_format(type);
  if (!has_packed_kernels(type) || cols % format.block_elems != 0)
    throw std::invalid_argument(fmt::format("PackedMatrix: a ({}, {}) matrix of {} has no kernels (block formats "
                                            "need columns in whole blocks of {})",
                                            rows, cols, format.name, format.block_elems));
  PackedMatrix w{type, rows, cols, bytes, std::move(owner)};
  if (bytes.size() != rows * w.row_bytes())
    throw std::invalid_argument(fmt::format("PackedMatrix: a ({}, {}) matrix of {} is {} bytes, got {}", rows, cols,
                                            format.name, rows * w.row_bytes(), bytes.size()));
  return w;
}

// A (rows, cols) matrix of `type`, row r converted from the floats row(r) returns.
template <class Row>
static PackedMatrix pack_rows(std::size_t rows, std::size_t cols, TensorType type, Row row) {
  const BlockFormat& format = block_format(type);
  if (!has_packed_kernels(type) || cols % format.block_elems != 0)
    throw std::invalid_argument(fmt::format("pack_matrix: a ({}, {}) matrix cannot be {} (its rows must be whole "
                                            "blocks of {})",
                                            rows, cols, format.name, format.block_elems));
  const std::size_t row_bytes = cols / format.block_elems * format.block_bytes;
  auto storage = std::make_shared<AlignedVector<std::byte>>(rows * row_bytes);  // rows on lines, as a file's
  for (std::size_t r = 0; r < rows; ++r) pack_row(row(r), cols, type, storage->data() + r * row_bytes);
  return view_matrix(type, rows, cols, *storage, storage);
}

PackedMatrix pack_matrix(const float* w, std::size_t rows, std::size_t cols, TensorType type) {
  return pack_rows(rows, cols, type, [&](std::size_t r) { return w + r * cols; });
}

PackedMatrix pack_transposed(const float* w, std::size_t rows, std::size_t cols, TensorType type) {
  // Columns of w gathered 16 at a time, so that each line of w is read once.
  constexpr std::size_t group = 16;
  std::vector<float> gathered(group * cols);
  return pack_rows(rows, cols, type, [&](std::size_t r) {
    const std::size_t first = r / group * group, count = std::min(group, rows - first);
    if (r == first)
      for (std::size_t c = 0; c < cols; ++c)
        for (std::size_t i = 0; i < count; ++i) gathered[i * cols + c] = w[c * rows + first + i];
    return gathered.data() + (r - first) * cols;
  });
}

void dequantize_rows(const PackedMatrix& w, std::size_t first, std::size_t count, float* out) {
  if (first + count > w.rows)
    throw std::out_of_range(fmt::format("dequantize_rows: rows {}..{} of a matrix of {}", first, first + count, w.rows));
  w.format().dequantize(w.row(first), out, count * w.cols);
}

void quantize_activations(const float* x, std::size_t rows, std::size_t cols, QuantizedActivations& out) {
  const std::size_t blocks = (cols / 32 + 1) / 2 * 2;  // padded to whole pairs
  const std::size_t q_bytes = rows * blocks * 32, group_bytes = rows * blocks * 8 * 4;
  const std::size_t needed = 2 * q_bytes + 3 * group_bytes + 64;
  if (out.capacity < needed) {
    out.storage = std::make_unique<std::byte[]>(needed);
    out.capacity = needed;
  }
  std::byte* base = out.storage.get();
  base += (64 - reinterpret_cast<std::uintptr_t>(base) % 64) % 64;
  auto* q = reinterpret_cast<std::int8_t*>(base);
  auto* neg_sums = reinterpret_cast<std::int32_t*>(base + q_bytes);
  auto* d = reinterpret_cast<float*>(base + q_bytes + group_bytes);
  auto* scaled_sums = reinterpret_cast<float*>(base + q_bytes + 2 * group_bytes);
  auto* q_plus_128 = reinterpret_cast<std::uint8_t*>(base + q_bytes + 3 * group_bytes);
  const RowQuantizer quantize_row = active_packed_table().quantize_row;
  for (std::size_t m = 0; m < rows; ++m)
    quantize_row(x + m * cols, cols, blocks, q + m * blocks * 32, neg_sums + m * blocks * 8, d + m * blocks * 8,
                 scaled_sums + m * blocks * 8);
  for (std::size_t i = 0; i < q_bytes; ++i) q_plus_128[i] = std::uint8_t(q[i] ^ 0x80);
  out.rows = {x, rows, cols, blocks, q, q_plus_128, neg_sums, d, scaled_sums};
}

void pair_activations(QuantizedActivations& out) {
  ActivationRows& rows = out.rows;
  const std::size_t cols = rows.cols, whole = cols / 32 * 32;
  rows.pairs_cols = (cols + 31) / 32 * 32;
  if (out.pairs.size() < rows.rows * rows.pairs_cols) out.pairs.resize(rows.rows * rows.pairs_cols);
  for (std::size_t m = 0; m < rows.rows; ++m) {
    const float* x = rows.x + m * cols;
    float* pairs = out.pairs.data() + m * rows.pairs_cols;
    for (std::size_t k = 0; k < whole; k += 32)
      for (std::size_t j = 0; j < 16; ++j) pairs[k + j] = x[k + 2 * j], pairs[k + 16 + j] = x[k + 2 * j + 1];
    if (whole == cols) continue;
    std::fill(pairs + whole, pairs + whole + 32, 0.0f);
    for (std::size_t k = whole; k < cols; ++k) pairs[whole + k % 2 * 16 + (k - whole) / 2] = x[k];
  }
  rows.pairs = out.pairs.data();
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
    total_rows += p.w->rows, total_bytes += p.w->rows * p.w->row_bytes();
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
  if (bf16) pair_activations(activations);
  const ActivationRows& rows = activations.rows;
  // Outputs first .. last - 1 of the products' rows laid end to end, in panels of weight rows that
  // stay in L2 while x's rows pass a few at a time (those stay in L1): the weights are read from
  // memory once a call, not once per chunk of x (BF16's prefill waited on them; the block formats
  // measured within 3% either way, M = 16 to 512 on SmolLM2's shapes).
  auto outputs = [&](std::size_t first, std::size_t last) {
    constexpr std::size_t chunk = 8;
    std::size_t offset = 0;
    for (const PackedProduct& p : products) {
      const PackedMatrix& w = *p.w;
      const std::size_t from = std::clamp(first, offset, offset + w.rows) - offset;
      const std::size_t to = std::clamp(last, offset, offset + w.rows) - offset;
      offset += w.rows;
      if (from == to) continue;
      const PackedKernel kernel = kernel_for(table, w);
      // BF16, F16 and F32 kernels take all of x's rows and all the outputs, and block them themselves
      // (core/kernels/quant_matmul_float.cpp): their panels fetch the next one while in use.
      const bool blocks_itself = w.format().block_elems == 1;
      const std::size_t panel = blocks_itself ? to - from : panel_rows(w.row_bytes());
      const std::size_t rows_each = blocks_itself ? M : chunk;
      for (std::size_t n0 = from; n0 < to; n0 += panel)
        for (std::size_t m = 0; m < M; m += rows_each) {
          ActivationRows part = rows;
          part.rows = std::min(rows_each, M - m);
          part.x = rows.x + m * rows.cols;
          if (rows.pairs) part.pairs += m * rows.pairs_cols;
          if (rows.q) {
            part.q += m * rows.blocks * 32, part.q_plus_128 += m * rows.blocks * 32;
            part.neg_sums += m * rows.blocks * 8, part.d += m * rows.blocks * 8, part.scaled_sums += m * rows.blocks * 8;
          }
          kernel(p.y + m * w.rows, w.rows, part, w, n0, std::min(n0 + panel, to), accumulate);
        }
    }
  };
  // Outputs split into one contiguous share per thread: each output is computed whole by one
  // thread, so the thread count never changes a bit.
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
