// packed_matmul per format, at the SIMD level in use (the suite runs every level and emulated16):
// bit for bit against Note [Packed products] written out here as plain loops (so every level gives
// the same bits), within the activation quantization's error bound of a double product over the
// dequantized weights, and the same bits for a row whatever the rows beside it, M and the threads.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/kernels.h"
#include "core/quant/packed_kernels.h"
#include "core/quant/packed_matrix.h"
#include "core/simd.h"
#include "support/bf16_contract.h"
#include "support/helpers.h"

using namespace tapegrad;
using quant::TensorType;

namespace {

constexpr TensorType kFormats[] = {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q8_0,
                                   TensorType::Q4_K, TensorType::Q6_K, TensorType::BF16, TensorType::F16,
                                   TensorType::F32};

bool is_k_quant(TensorType type) { return type == TensorType::Q4_K || type == TensorType::Q6_K; }
bool is_float(TensorType type) {
  return type == TensorType::BF16 || type == TensorType::F16 || type == TensorType::F32;
}

std::uint16_t u16(const std::byte* p) { return std::uint16_t(unsigned(p[0]) | (unsigned(p[1]) << 8)); }

// A matrix's rows in ggml's layout, which the reference reads, and the packed matrix made from them.
struct TestMatrix {
  std::vector<std::byte> file;
  quant::PackedMatrix w;
  const std::byte* row(std::size_t n) const { return file.data() + n * w.cols / w.format().block_elems * w.format().block_bytes; }
};

// Block b of 32 of a row of a block format or K-quant: its unsigned codes, d_w of each half (Q6_K's
// have their own scales) and the block's m_w (Note [Packed products]), read from the bytes as ggml
// lays them out.
struct BlockTerms {
  int code[32];
  float d_w[2];
  float m_w = 0;
};

BlockTerms block_terms(TensorType type, const std::byte* row, std::size_t b) {
  BlockTerms t;
  if (is_k_quant(type)) {
    const std::byte* super = row + b / 8 * quant::block_format(type).block_bytes;
    const int i = int(b % 8);
    if (type == TensorType::Q4_K) {
      auto at = [&](int k) { return unsigned(super[4 + k]); };
      const unsigned scale = i < 4 ? at(i) & 63 : (at(i + 4) & 15) | ((at(i - 4) >> 6) << 4);
      const unsigned min = i < 4 ? at(i + 4) & 63 : (at(i + 4) >> 4) | ((at(i) >> 6) << 4);
      t.d_w[0] = t.d_w[1] = quant::f16_to_f32(u16(super)) * float(scale);
      t.m_w = -(quant::f16_to_f32(u16(super + 2)) * float(min));
      for (int j = 0; j < 32; ++j) t.code[j] = (unsigned(super[16 + 32 * (i / 2) + j]) >> (4 * (i % 2))) & 15;
    } else {
      for (int h = 0; h < 2; ++h) t.d_w[h] = quant::f16_to_f32(u16(super + 208)) * float(std::int8_t(super[192 + 2 * i + h]));
      for (int j = 0; j < 32; ++j) {
        const int element = 32 * i + j, half = element / 128, k = element % 128;  // k = 32 * quarter + l
        const unsigned low = unsigned(super[64 * half + k % 64]) >> (4 * (k / 64));
        const unsigned high = unsigned(super[128 + 32 * half + k % 32]) >> (2 * (k / 32));
        t.code[j] = int((low & 15) | ((high & 3) << 4));
      }
    }
    return t;
  }
  const std::byte* block = row + b * quant::block_format(type).block_bytes;
  t.d_w[0] = t.d_w[1] = quant::f16_to_f32(u16(block));
  for (int j = 0; j < 32; ++j) {
    if (type == TensorType::Q8_0) {
      t.code[j] = int(std::int8_t(block[2 + j])) + 128;
    } else {
      const std::size_t codes = type == TensorType::Q4_1 ? 4 : type == TensorType::Q5_0 ? 6 : 2;
      t.code[j] = (unsigned(block[codes + j % 16]) >> (j < 16 ? 0 : 4)) & 0xF;
      if (type == TensorType::Q5_0) t.code[j] |= int(((u16(block + 2 + 2 * (j / 16)) >> (j % 16)) & 1) << 4);
    }
  }
  if (type == TensorType::Q4_1) t.m_w = quant::f16_to_f32(u16(block + 2));
  return t;
}

// Note [Packed products] for output (m, n), from the block bytes and the quantized x.
float reference_output(const TestMatrix& t, const quant::ActivationRows& x, std::size_t m, std::size_t n) {
  const quant::PackedMatrix& w = t.w;
  const std::byte* row = t.row(n);
  float acc = 0;
  auto weight = [&](std::size_t k) {
    float value = 0;
    quant::block_format(w.type).dequantize(row + w.format().block_bytes * k, &value, 1);
    return value;
  };
  if (w.type == TensorType::BF16)
    return test::bf16_contract(w.cols, weight, [&](std::size_t k) { return x.x[m * x.cols + k]; }, 0.0f);
  if (is_float(w.type)) {
    for (std::size_t k = 0; k < w.cols; ++k) acc = std::fma(weight(k), x.x[m * x.cols + k], acc);
    return acc;
  }
  const int offset = w.type == TensorType::Q4_0   ? 8
                     : w.type == TensorType::Q5_0 ? 16
                     : w.type == TensorType::Q6_K ? 32
                     : w.type == TensorType::Q8_0 ? 128
                                                  : 0;
  const int halves = w.type == TensorType::Q6_K ? 2 : 1;
  for (std::size_t b = 0; b < w.cols / 32; ++b) {
    const BlockTerms terms = block_terms(w.type, row, b);
    const std::int8_t* q = x.q + (m * x.blocks + b) * 32;
    const float dx = x.d[m * x.blocks + b];
    int q_sum = 0;
    for (int h = 0; h < halves; ++h) {
      int sum = 0;
      for (int j = h * 32 / halves; j < (h + 1) * 32 / halves; ++j) sum += (terms.code[j] - offset) * q[j], q_sum += q[j];
      acc = std::fma(float(sum), terms.d_w[h] * dx, acc);
    }
    if (w.type == TensorType::Q4_1 || w.type == TensorType::Q4_K) acc = std::fma(terms.m_w, dx * float(q_sum), acc);
  }
  return acc;
}

// Random weights in ggml's layout: the float formats' converted from random floats; the others'
// random bytes with random finite halves for d (and Q4_1's m, Q4_K's dmin).
TestMatrix random_matrix(TensorType type, std::size_t rows, std::size_t cols, std::uint64_t seed) {
  const quant::BlockFormat& format = quant::block_format(type);
  std::vector<std::byte> bytes(rows * cols / format.block_elems * format.block_bytes);
  if (is_float(type)) {
    const std::vector<float> w = test::random_vector(rows * cols, seed);
    format.quantize(w.data(), bytes.data(), rows * cols);
  } else {
    std::mt19937_64 random(seed);
    for (std::byte& byte : bytes) byte = std::byte(random() & 0xFF);
    std::uniform_real_distribution<float> scale(-0.01f, 0.01f);
    const std::vector<std::size_t> halves = type == TensorType::Q4_K   ? std::vector<std::size_t>{0, 2}
                                            : type == TensorType::Q6_K ? std::vector<std::size_t>{208}
                                            : type == TensorType::Q4_1 ? std::vector<std::size_t>{0, 2}
                                                                       : std::vector<std::size_t>{0};
    for (std::size_t at = 0; at < bytes.size(); at += format.block_bytes)
      for (std::size_t half : halves) {
        const std::uint16_t bits = quant::f32_to_f16(scale(random));
        bytes[at + half] = std::byte(bits & 0xFF), bytes[at + half + 1] = std::byte(bits >> 8);
      }
  }
  quant::PackedMatrix w = quant::interleave_matrix(type, rows, cols, bytes);
  return {std::move(bytes), std::move(w)};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::size_t> column_counts(TensorType type) {
  // 4100: rows of 8 KB, more than AVX-512's widened panel holds 37 of (quant_matmul_float.cpp).
  if (is_float(type)) return {1, 7, 16, 17, 40, 96, 4100};
  if (is_k_quant(type)) return {256, 512, 1536};
  return {32, 64, 96, 576};
}

// The probe row's outputs when it sits at `position` among `batch` rows of other values.
std::vector<float> probe_in_batch(const quant::PackedMatrix& w, const std::vector<float>& probe, std::size_t batch,
                                  std::size_t position, std::uint64_t seed) {
  std::vector<float> x = test::random_vector(batch * w.cols, seed, 4.0);
  std::copy(probe.begin(), probe.end(), x.begin() + position * w.cols);
  std::vector<float> y(batch * w.rows);
  quant::packed_matmul(y.data(), x.data(), batch, w, false);
  return {y.begin() + position * w.rows, y.begin() + (position + 1) * w.rows};
}

// The kernel of `type` in `table`.
quant::PackedKernel kernel_of(const quant::PackedKernelTable& table, TensorType type) {
  switch (type) {
    case TensorType::Q4_0: return table.q4_0;
    case TensorType::Q4_1: return table.q4_1;
    case TensorType::Q5_0: return table.q5_0;
    case TensorType::Q8_0: return table.q8_0;
    case TensorType::Q4_K: return table.q4_k;
    case TensorType::Q6_K: return table.q6_k;
    case TensorType::BF16: return table.bf16;
    case TensorType::F32: return table.f32;
    default: return table.f16;
  }
}

}  // namespace

TEST_CASE("every packed kernel table of this level gives Note [Packed products]'s bits for every format") {
  for (const quant::PackedKernelTable& table : quant::level_packed_tables())
    for (TensorType type : kFormats)
      for (std::size_t cols : column_counts(type))
        // 11: 3 x 8 float tiles; 17, 23: 1 x 16 float and 1 x 12 BF16 chain tiles, and their tails
        for (std::size_t M : {1, 2, 3, 5, 7, 11, 17, 23}) {
          const std::size_t rows = 37;
          TestMatrix t = random_matrix(type, rows, cols, 7 + cols);
          std::vector<float> x = test::random_vector(M * cols, 100 + M, 3.0);
          if (type == TensorType::BF16) {  // the contract's flushes: subnormal weights and x, tiny products
            auto set_bits = [&](std::size_t i, unsigned bits) {
              t.file[2 * i] = std::byte(bits & 0xFF), t.file[2 * i + 1] = std::byte(bits >> 8);
            };
            for (std::size_t i = 3; i < t.file.size() / 2; i += 7) set_bits(i, i % 2 ? 0x8021 : 0x0021);  // subnormal
            for (std::size_t i = 5; i < t.file.size() / 2; i += 11) set_bits(i, i % 2 ? 0x9E40 : 0x1E40);  // +-1.5 2^-67
            for (std::size_t i = 2; i < x.size(); i += 13) x[i] = i % 3 ? 1e-39f : -0x1p-62f;
            t.w = quant::interleave_matrix(type, rows, cols, t.file);
          }
          const quant::PackedMatrix& w = t.w;
          quant::QuantizedActivations qx;
          quant::quantize_activations(x.data(), M, cols, qx);
          quant::pair_activations(table, x.data(), M, cols, qx);
          const quant::ActivationRows& xr = qx.rows;
          std::vector<float> y(M * rows);
          kernel_of(table, type)(y.data(), rows, xr, w, 0, rows, false);
          for (std::size_t m = 0; m < M; ++m)
            for (std::size_t n = 0; n < rows; ++n) {
              const float expected = reference_output(t, xr, m, n);
              if (std::bit_cast<std::uint32_t>(y[m * rows + n]) != std::bit_cast<std::uint32_t>(expected))
                FAIL(fmt::format("{} ({}, {}) cols {} M {}: output ({}, {}) is {}, Note [Packed products] gives {}",
                                 w.format().name, table.integer_dot, table.bf16_dot, cols, M, m, n, y[m * rows + n],
                                 expected));
            }
          std::vector<float> accumulated(M * rows, 0.5f);
          kernel_of(table, type)(accumulated.data(), rows, xr, w, 0, rows, true);
          for (std::size_t i = 0; i < M * rows; ++i)
            if (accumulated[i] != 0.5f + y[i])
              FAIL(fmt::format("{} ({}) cols {} M {}: accumulating onto 0.5 gave {} at {}, not 0.5 + {}",
                               w.format().name, table.integer_dot, cols, M, accumulated[i], i, y[i]));
          // outputs 5 .. 28: parts of groups, the others untouched
          std::vector<float> part(M * rows, -1.0f);
          kernel_of(table, type)(part.data(), rows, xr, w, 5, 29, false);
          for (std::size_t i = 0; i < M * rows; ++i) {
            const bool inside = i % rows >= 5 && i % rows < 29;
            if (std::bit_cast<std::uint32_t>(part[i]) != std::bit_cast<std::uint32_t>(inside ? y[i] : -1.0f))
              FAIL(fmt::format("{} ({}) cols {} M {}: outputs 5 to 28 alone gave {} at {}, not {}", w.format().name,
                               table.integer_dot, cols, M, part[i], i, inside ? y[i] : -1.0f));
          }
        }
}

TEST_CASE("float products of 16 to 31 rows stream whole groups to an aligned y with the bits of plain stores") {
  // y on a cache line with rows of whole groups: the outputs go past the caches at AVX-512
  // (TileSums::store); one float further on, every store is a plain one.
  for (TensorType type : {TensorType::F32, TensorType::F16})
    for (std::size_t M : {16, 23}) {
      const std::size_t rows = 48, cols = 40;
      const TestMatrix t = random_matrix(type, rows, cols, 11);
      const std::vector<float> x = test::random_vector(M * cols, 200 + M, 3.0);
      AlignedVector<float> aligned(M * rows + 16, -1.0f), shifted(M * rows + 16, -1.0f);
      quant::packed_matmul(aligned.data(), x.data(), M, t.w, false);
      quant::packed_matmul(shifted.data() + 1, x.data(), M, t.w, false);
      CHECK_MESSAGE(std::memcmp(aligned.data(), shifted.data() + 1, M * rows * sizeof(float)) == 0,
                    std::string(t.w.format().name), " M ", M, ": streamed and plain stores differ");
      // outputs 5 .. 36: groups whole and not
      for (const quant::PackedKernelTable& table : quant::level_packed_tables()) {
        AlignedVector<float> part(M * rows, -1.0f);
        quant::QuantizedActivations qx;
        qx.rows.x = x.data(), qx.rows.rows = M, qx.rows.cols = cols;
        kernel_of(table, type)(part.data(), rows, qx.rows, t.w, 5, 37, false);
        for (std::size_t i = 0; i < M * rows; ++i) {
          const bool inside = i % rows >= 5 && i % rows < 37;
          if (std::bit_cast<std::uint32_t>(part[i]) != std::bit_cast<std::uint32_t>(inside ? aligned[i] : -1.0f))
            FAIL(fmt::format("{} M {}: outputs 5 to 36 alone gave {} at {}, not {}", t.w.format().name, M, part[i], i,
                             inside ? aligned[i] : -1.0f));
        }
      }
    }
}

TEST_CASE("a packed matrix gives back its file's blocks and their dequantized rows") {
  for (TensorType type : kFormats) {
    const std::size_t rows = 37, cols = is_k_quant(type) ? 512 : is_float(type) ? 104 : 96;  // BF16: a partial unit
    const TestMatrix t = random_matrix(type, rows, cols, 5);
    const quant::BlockFormat& format = t.w.format();
    std::vector<float> expected(rows * cols), got(rows * cols);
    format.dequantize(t.file.data(), expected.data(), rows * cols);
    quant::dequantize_rows(t.w, 0, rows, got.data());
    CHECK_MESSAGE(same_bits(got, expected), format.name, ": dequantized rows differ from the file's");
    std::vector<float> row(cols);
    quant::dequantize_rows(t.w, 20, 1, row.data());
    CHECK_MESSAGE(std::equal(row.begin(), row.end(), expected.begin() + 20 * cols), format.name, ": row 20 alone differs");
  }
  const std::vector<std::byte> short_bytes(100);
  CHECK_THROWS_WITH(quant::interleave_matrix(TensorType::Q8_0, 2, 64, short_bytes),
                    "PackedMatrix: a (2, 64) matrix of q8_0 is 136 bytes, got 100");
}

TEST_CASE("packed_matmul stays within its activation rounding of a double product over the dequantized weights") {
  for (TensorType type : kFormats) {
    const std::size_t rows = 19, cols = is_k_quant(type) ? 512 : 96, M = 3;
    const quant::PackedMatrix w = random_matrix(type, rows, cols, 3).w;
    const std::vector<float> x = test::random_vector(M * cols, 4, 2.0);
    std::vector<float> dense(rows * cols), y(M * rows);
    quant::dequantize_rows(w, 0, rows, dense.data());
    quant::packed_matmul(y.data(), x.data(), M, w, false);
    const bool blocks = w.format().block_elems > 1;
    for (std::size_t m = 0; m < M; ++m)
      for (std::size_t n = 0; n < rows; ++n) {
        double exact = 0, bound = 0;
        for (std::size_t b = 0; b < cols / 32; ++b) {
          double amax = 0, weight_sum = 0;
          for (std::size_t k = 32 * b; k < 32 * b + 32; ++k) {
            exact += double(dense[n * cols + k]) * x[m * cols + k];
            amax = std::max(amax, std::fabs(double(x[m * cols + k])));
            weight_sum += std::fabs(double(dense[n * cols + k]) * (blocks ? 1.0 : x[m * cols + k]));
          }
          // x quantized to steps of amax / 127 moves each term by at most half a step, rounded to
          // bf16 by 2^-9 of itself; float sums add a relative 1e-5 or so.
          if (blocks) bound += weight_sum * amax / 127 / 2 * 1.001 + 1e-5 * weight_sum * amax;
          else bound += (w.type == TensorType::BF16 ? 0x1p-9 + 1e-5 : 1e-5) * weight_sum;
        }
        CHECK_MESSAGE(std::fabs(y[m * rows + n] - exact) <= bound + 1e-6,
                      fmt::format("{}: output ({}, {}) is {}, the double product {} (bound {})", w.format().name, m,
                                  n, y[m * rows + n], exact, bound));
      }
  }
}

TEST_CASE("packed_matmul gives a row the same bits alone, among others and on any thread count") {
  const int threads_before = num_threads();
  for (TensorType type : kFormats) {
    const std::size_t rows = 160, cols = is_k_quant(type) ? 768 : 576, M = 4;  // rows * cols worth two threads
    const quant::PackedMatrix w = random_matrix(type, rows, cols, 11).w;
    const std::vector<float> x = test::random_vector(M * cols, 12);
    set_num_threads(1);
    std::vector<float> together(M * rows);
    quant::packed_matmul(together.data(), x.data(), M, w, false);
    for (std::size_t m = 0; m < M; ++m) {
      std::vector<float> alone(rows), expected(together.begin() + m * rows, together.begin() + (m + 1) * rows);
      quant::packed_matmul(alone.data(), x.data() + m * cols, 1, w, false);
      CHECK_MESSAGE(same_bits(alone, expected), fmt::format("{}: row {} of {} differs from the row alone",
                                                            w.format().name, m, M));
    }
    set_num_threads(2);
    std::vector<float> on_two(M * rows);
    quant::packed_matmul(on_two.data(), x.data(), M, w, false);
    CHECK_MESSAGE(same_bits(on_two, together), fmt::format("{}: two threads differ from one", w.format().name));
    std::vector<float> accumulated(M * rows, 0.5f);
    quant::packed_matmul(accumulated.data(), x.data(), M, w, true);
    for (std::size_t i = 0; i < M * rows; ++i) REQUIRE(accumulated[i] == 0.5f + together[i]);
  }
  set_num_threads(threads_before);
}

TEST_CASE("packed_matmul gives a row the bits it gets alone in a batch of 1 to 17 rows at any position") {
  // 37 weight rows: whole register tiles and a remainder; 3 blocks (an odd last block) or 40
  // elements (a partial last vector).
  for (TensorType type : kFormats) {
    const std::size_t cols = is_k_quant(type) ? 512 : quant::block_format(type).block_elems == 32 ? 96 : 40;
    const quant::PackedMatrix w = random_matrix(type, 37, cols, 31).w;
    const std::vector<float> probe = test::random_vector(cols, 32);
    const std::vector<float> alone = probe_in_batch(w, probe, 1, 0, 33);
    for (std::size_t batch = 1; batch <= 17; ++batch)
      for (std::size_t position = 0; position < batch; ++position)
        if (!same_bits(probe_in_batch(w, probe, batch, position, 40 + batch), alone))
          FAIL(fmt::format("{}: the row at {} of {} differs from the row alone", w.format().name, position, batch));
  }
}

TEST_CASE("packed_matmul gives a row the same bits in batches of any size on one and two threads") {
  // 400 rows of 576 (K-quants 768): worth two threads for every format.
  const int threads_before = num_threads();
  for (TensorType type : kFormats) {
    const std::size_t cols = is_k_quant(type) ? 768 : 576;
    const quant::PackedMatrix w = random_matrix(type, 400, cols, 51).w;
    const std::vector<float> probe = test::random_vector(cols, 52);
    set_num_threads(1);
    const std::vector<float> alone = probe_in_batch(w, probe, 1, 0, 53);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (auto [batch, position] : {std::pair<std::size_t, std::size_t>{1, 0}, {9, 8}, {16, 5}, {17, 16}})
        CHECK_MESSAGE(same_bits(probe_in_batch(w, probe, batch, position, 60 + batch), alone),
                      fmt::format("{}: the row at {} of {} on {} threads differs from the row alone",
                                  w.format().name, position, batch, threads));
    }
  }
  set_num_threads(threads_before);
}

TEST_CASE("quantize_activations gives every level the same blocks, ties, tiny, infinite and NaN values included") {
  const std::size_t rows = 3, cols = 200;  // 7 blocks, the last partial
  std::vector<float> x = test::random_vector(rows * cols, 71, 3.0);
  x[5] = 63.5f, x[6] = -127.0f;                             // a block whose codes meet ties (x / d = 31.75 ... )
  for (std::size_t k = 32; k < 64; ++k) x[k] = 1e-39f * float(k);  // subnormal d: no codes
  x[70] = std::numeric_limits<float>::infinity();
  x[cols + 100] = std::numeric_limits<float>::quiet_NaN();
  const SimdLevel before = simd_level();
  set_simd_level(SimdLevel::sse2);
  quant::QuantizedActivations expected;
  quant::quantize_activations(x.data(), rows, cols, expected);
  const std::size_t blocks = expected.rows.blocks;
  auto same = [&](const void* a, const void* b, std::size_t bytes) { return std::memcmp(a, b, bytes) == 0; };
  for (SimdLevel level : testable_simd_levels()) {
    set_simd_level(level);
    quant::QuantizedActivations got;
    quant::quantize_activations(x.data(), rows, cols, got);
    CHECK_MESSAGE(same(got.rows.q, expected.rows.q, rows * blocks * 32), simd_level_name(level), ": codes differ");
    CHECK_MESSAGE(same(got.rows.neg_sums, expected.rows.neg_sums, rows * blocks * 4), simd_level_name(level),
                  ": sums differ");
    CHECK_MESSAGE(same(got.rows.neg_half_sums, expected.rows.neg_half_sums, rows * blocks * 8), simd_level_name(level),
                  ": half sums differ");
    CHECK_MESSAGE(same(got.rows.d, expected.rows.d, rows * blocks * 4), simd_level_name(level), ": d differs");
    CHECK_MESSAGE(same(got.rows.scaled_sums, expected.rows.scaled_sums, rows * blocks * 4), simd_level_name(level),
                  ": scaled sums differ");
  }
  set_simd_level(before);
  CHECK(std::isnan(expected.rows.d[2]));              // the block holding the infinity
  CHECK(std::isnan(expected.rows.d[blocks + 3]));     // the block holding the NaN
  CHECK(expected.rows.d[1] < std::numeric_limits<float>::min());
  for (int j = 0; j < 32; ++j) REQUIRE(expected.rows.q[32 + j] == 0);
  const quant::PackedMatrix w = random_matrix(TensorType::Q8_0, 5, cols / 32 * 32 + 32, 72).w;
  std::vector<float> padded(rows * w.cols);
  for (std::size_t m = 0; m < rows; ++m) std::copy_n(x.data() + m * cols, cols, padded.data() + m * w.cols);
  std::vector<float> y(rows * w.rows);
  quant::packed_matmul(y.data(), padded.data(), rows, w, false);
  for (std::size_t n = 0; n < w.rows; ++n)  // rows 0 and 1 hold an infinity and a NaN, row 2 neither
    CHECK((std::isnan(y[n]) && std::isnan(y[w.rows + n]) && !std::isnan(y[2 * w.rows + n])));
}

TEST_CASE("packed_matmuls gives each matrix sharing x packed_matmul's bits, on one and two threads") {
  // q, k and v of different formats (x quantized once for the block formats, read as is for
  // BF16), large enough together to split across two threads mid-matrix.
  const int threads_before = num_threads();
  const std::size_t cols = 576;
  const quant::PackedMatrix q = random_matrix(TensorType::Q4_1, 200, cols, 81).w;
  const quant::PackedMatrix k = random_matrix(TensorType::BF16, 72, cols, 82).w;
  const quant::PackedMatrix v = random_matrix(TensorType::Q8_0, 88, cols, 83).w;
  for (std::size_t M : {1, 5}) {
    const std::vector<float> x = test::random_vector(M * cols, 84 + M);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<float> yq(M * q.rows, 0.25f), yk(M * k.rows, 0.25f), yv(M * v.rows, 0.25f);
      const quant::PackedProduct products[] = {{yq.data(), &q}, {yk.data(), &k}, {yv.data(), &v}};
      quant::packed_matmuls(products, x.data(), M, true);
      for (const auto& [y, w] : {std::pair{&yq, &q}, {&yk, &k}, {&yv, &v}}) {
        std::vector<float> alone(M * w->rows, 0.25f);
        quant::packed_matmul(alone.data(), x.data(), M, *w, true);
        CHECK_MESSAGE(same_bits(*y, alone), fmt::format("{} rows of {} beside the others, M {}, {} threads",
                                                        w->rows, w->format().name, M, threads));
      }
    }
  }
  set_num_threads(threads_before);
  std::vector<float> y(64);
  const quant::PackedMatrix narrow = random_matrix(TensorType::Q8_0, 2, 64, 85).w;
  const quant::PackedProduct mixed[] = {{y.data(), &q}, {y.data(), &narrow}};
  CHECK_THROWS_WITH(quant::packed_matmuls(mixed, y.data(), 1, false),
                    "packed_matmuls: matrices of 576 and 64 columns cannot share x");
}

TEST_CASE("pack_matrix rounds each weight within half a step of its block, and refuses partial blocks") {
  const std::size_t rows = 3, cols = 64;
  const std::vector<float> w = test::random_vector(rows * cols, 21);
  for (TensorType type : kFormats) {
    if (is_k_quant(type)) {
      const std::string refusal = fmt::format("pack_matrix: no conversion to {}", quant::block_format(type).name);
      CHECK_THROWS_WITH(quant::pack_matrix(w.data(), 1, 256, type), refusal.c_str());
      continue;
    }
    const quant::PackedMatrix packed = quant::pack_matrix(w.data(), rows, cols, type);
    std::vector<float> back(rows * cols);
    quant::dequantize_rows(packed, 0, rows, back.data());
    for (std::size_t b = 0; b < rows * cols / 32; ++b) {
      float lo = w[32 * b], hi = w[32 * b];
      for (std::size_t k = 32 * b; k < 32 * b + 32; ++k) lo = std::min(lo, w[k]), hi = std::max(hi, w[k]);
      const float amax = std::max(std::fabs(lo), std::fabs(hi));
      const float step = type == TensorType::Q8_0   ? amax / 127
                         : type == TensorType::Q4_0 ? amax / 8
                         : type == TensorType::Q5_0 ? amax / 16
                         : type == TensorType::Q4_1 ? (hi - lo) / 15
                                                    : amax / 128;  // bf16: 8 bits of mantissa
      // Q4_0's codes reach -8 d but only 7 d (Q5_0's -16 d and 15 d): the value of opposite sign to
      // the largest may lose a step.
      const bool asymmetric = type == TensorType::Q4_0 || type == TensorType::Q5_0;
      const float bound = (asymmetric ? 1.01f : 0.51f) * step + 1e-3f * amax;
      for (std::size_t k = 32 * b; k < 32 * b + 32; ++k)
        CHECK_MESSAGE(std::fabs(back[k] - w[k]) <= bound,
                      fmt::format("{}: weight {} is {}, back {}", packed.format().name, k, w[k], back[k]));
    }
  }
  CHECK_THROWS_WITH(quant::pack_matrix(w.data(), 2, 48, TensorType::Q8_0),
                    "pack_matrix: a (2, 48) matrix cannot be q8_0 (its rows must be whole blocks of 32)");
}

TEST_CASE("pack_transposed packs a Linear's (in, out) weight as pack_matrix packs its transpose, byte for byte") {
  // 37 rows: two whole groups of 16 gathered columns and a partial one.
  const std::size_t rows = 37, cols = 64;
  const std::vector<float> w = test::random_vector(cols * rows, 22);  // (cols, rows)
  std::vector<float> t(rows * cols);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) t[r * cols + c] = w[c * rows + r];
  for (TensorType type : kFormats) {
    if (is_k_quant(type)) continue;  // no conversion to K-quants
    CAPTURE(quant::block_format(type).name);
    const quant::PackedMatrix expected = quant::pack_matrix(t.data(), rows, cols, type);
    const quant::PackedMatrix packed = quant::pack_transposed(w.data(), rows, cols, type);
    CHECK(packed.rows == rows);
    CHECK(packed.cols == cols);
    CHECK(std::ranges::equal(packed.bytes, expected.bytes));
  }
  CHECK_THROWS_WITH(quant::pack_transposed(w.data(), 2, 48, TensorType::Q8_0),
                    "pack_matrix: a (2, 48) matrix cannot be q8_0 (its rows must be whole blocks of 32)");
}
