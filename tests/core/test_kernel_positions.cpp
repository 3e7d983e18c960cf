// Position independence, bit for bit, at the SIMD level in use (the suite runs at every level and
// at emulated16): element i of an n-element call of a map kernel equals a one-element call on the
// same values, for n = 0 .. 3 * 16 + 1 and at odd offsets; row r of a row kernel equals the kernel
// on that row alone: the position rule of docs/architecture.md, which makes batching change no bit.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/kernels.h"
#include "core/simd.h"
#include "support/helpers.h"

using namespace tapegrad;

namespace {

// An array of a kernel's, per row: per_dim * dim + fixed floats each.
struct Width {
  std::size_t per_dim = 1, fixed = 0;
  std::size_t of(std::size_t dim) const { return per_dim * dim + fixed; }
};

// A kernel over rows [first, first + rows): run gets a pointer per array (to that first row) and
// may use `first` for what is indexed by row outside the arrays (token ids, positions, targets).
struct RowKernel {
  std::string name;
  std::vector<Width> arrays;
  std::function<void(float* const* arrays, std::size_t first, std::size_t rows, std::size_t dim)> run;
};

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Runs `kernel` on `rows` rows starting `offset` floats into each buffer, and on each row alone
// (copied to buffers of its own), and checks every row's arrays bit for bit, and that nothing
// past the rows was written.
void check_rows(const RowKernel& kernel, std::size_t rows, std::size_t dim, std::size_t offset, std::uint64_t seed) {
  const std::size_t guard = 17, count = kernel.arrays.size();
  std::vector<std::vector<float>> together(count);
  std::vector<float*> at(count);
  for (std::size_t a = 0; a < count; ++a) {
    together[a] = test::random_vector<float>(offset + rows * kernel.arrays[a].of(dim) + guard, seed + a);
    at[a] = together[a].data() + offset;
  }
  const auto before = together;
  kernel.run(at.data(), 0, rows, dim);
  for (std::size_t a = 0; a < count; ++a) {
    const std::size_t end = offset + rows * kernel.arrays[a].of(dim);
    CHECK_MESSAGE(same_bits(together[a].data(), before[a].data(), offset), kernel.name, ": wrote before the array");
    CHECK_MESSAGE(same_bits(together[a].data() + end, before[a].data() + end, guard), kernel.name,
                  ": wrote past the array");
  }
  for (std::size_t r = 0; r < rows; ++r) {
    std::vector<std::vector<float>> alone(count);
    std::vector<float*> row(count);
    for (std::size_t a = 0; a < count; ++a) {
      const std::size_t width = kernel.arrays[a].of(dim);
      const float* first = before[a].data() + offset + r * width;
      alone[a].assign(first, first + width);
      row[a] = alone[a].data();
    }
    kernel.run(row.data(), r, 1, dim);
    for (std::size_t a = 0; a < count; ++a) {
      const std::size_t width = kernel.arrays[a].of(dim);
      const bool same = same_bits(alone[a].data(), together[a].data() + offset + r * width, width);
      CHECK_MESSAGE(same, fmt::format("{}: array {} of row {} of {} (dim {}, offset {}) differs from the row alone",
                                      kernel.name, a, r, rows, dim, offset));
    }
  }
}

constexpr Width one{0, 1};  // one float per row: an element of a map, or a row's statistic
constexpr Width row{1, 0};  // dim floats per row

std::vector<RowKernel> map_kernels() {
  using K = RowKernel;
  auto map = [](std::string name, std::size_t arrays, auto f) {
    return K{std::move(name), std::vector<Width>(arrays, one),
             [f](float* const* p, std::size_t, std::size_t n, std::size_t) { f(p, n); }};
  };
  return {
      map("add_forward", 3, [](float* const* p, std::size_t n) { kernels::add_forward(p[0], p[1], p[2], n); }),
      map("accumulate", 2, [](float* const* p, std::size_t n) { kernels::accumulate(p[0], p[1], n); }),
      map("mul_forward", 3, [](float* const* p, std::size_t n) { kernels::mul_forward(p[0], p[1], p[2], n); }),
      map("mul_backward", 5, [](float* const* p, std::size_t n) { kernels::mul_backward(p[0], p[1], p[2], p[3], p[4], n); }),
      map("mul_backward (da and db one buffer, as for x * x)", 4,
          [](float* const* p, std::size_t n) { kernels::mul_backward(p[0], p[0], p[1], p[2], p[3], n); }),
      map("scale_forward", 2, [](float* const* p, std::size_t n) { kernels::scale_forward(p[0], p[1], 0.3f, n); }),
      map("scale_backward", 2, [](float* const* p, std::size_t n) { kernels::scale_backward(p[0], p[1], 0.3f, n); }),
      map("adamw_update", 4,
          [](float* const* p, std::size_t n) {
            for (std::size_t i = 0; i < n; ++i) p[2][i] *= p[2][i];  // a second moment is >= 0
            kernels::adamw_update(p[0], p[1], p[2], p[3], n,
                                  {.decay = 0.999f, .beta1 = 0.9f, .one_minus_beta1 = 0.1f, .beta2 = 0.95f,
                                   .one_minus_beta2 = 0.05f, .step_size = 0.01f, .inv_bc2_sqrt = 3.0f, .eps = 1e-8f});
          }),
      map("silu_forward", 2, [](float* const* p, std::size_t n) { kernels::silu_forward(p[0], p[1], n); }),
      map("silu_backward", 3, [](float* const* p, std::size_t n) { kernels::silu_backward(p[0], p[1], p[2], n); }),
      map("swiglu_forward", 3, [](float* const* p, std::size_t n) { kernels::swiglu_forward(p[0], p[1], p[2], n); }),
      map("swiglu_backward", 5,
          [](float* const* p, std::size_t n) { kernels::swiglu_backward(p[0], p[1], p[2], p[3], p[4], n, false); }),
      map("swiglu_backward (overwrite)", 5,
          [](float* const* p, std::size_t n) { kernels::swiglu_backward(p[0], p[1], p[2], p[3], p[4], n, true); }),
      map("swiglu_backward (da only)", 5,
          [](float* const* p, std::size_t n) { kernels::swiglu_backward<float>(p[0], nullptr, p[2], p[3], p[4], n, false); }),
      map("gelu_tanh_forward", 3, [](float* const* p, std::size_t n) { kernels::gelu_tanh_forward(p[0], p[1], p[2], n); }),
      map("gelu_tanh_forward (no s)", 2,
          [](float* const* p, std::size_t n) { kernels::gelu_tanh_forward<float>(p[0], nullptr, p[1], n); }),
      map("gelu_tanh_backward", 4,
          [](float* const* p, std::size_t n) { kernels::gelu_tanh_backward(p[0], p[1], p[2], p[3], n, false); }),
      map("gelu_tanh_backward (overwrite)", 4,
          [](float* const* p, std::size_t n) { kernels::gelu_tanh_backward(p[0], p[1], p[2], p[3], n, true); }),
  };
}

// The row kernels, with what they share across rows (weights, tables, ids) sized for dim <= 100.
std::vector<RowKernel> row_kernels() {
  using K = RowKernel;
  static const std::vector<float> w = test::random_vector<float>(100 * 100, 90), b = test::random_vector<float>(100, 91);
  static const std::vector<float> table = test::random_vector<float>(13 * 100, 92);
  static const std::vector<std::int32_t> ids = test::random_ids(64, 13, 93);
  static const auto rope = std::make_shared<kernels::RopeTable<float>>(kernels::make_rope_table<float>(80, 200));
  const Width doubled{2, 0};
  return {
      K{"embedding_forward", {row},
        [](float* const* p, std::size_t first, std::size_t rows, std::size_t dim) {
          std::vector<float> t(13 * dim);
          std::copy_n(table.begin(), t.size(), t.begin());
          kernels::embedding_forward(p[0], t.data(), ids.data() + first, rows, dim);
        }},
      K{"add_bias_forward", {row, row},
        [](float* const* p, std::size_t, std::size_t rows, std::size_t dim) {
          kernels::add_bias_forward(p[0], p[1], b.data(), rows, dim);
        }},
      K{"rms_norm_forward", {row, one, row},
        [](float* const* p, std::size_t, std::size_t rows, std::size_t dim) {
          kernels::rms_norm_forward(p[0], p[1], p[2], w.data(), rows, dim, 1e-5f);
        }},
      K{"rms_norm_backward (dx)", {row, row, row, one},
        [](float* const* p, std::size_t, std::size_t rows, std::size_t dim) {
          kernels::rms_norm_backward<float>(p[0], nullptr, p[1], p[2], w.data(), p[3], rows, dim);
        }},
      K{"layer_norm_forward", {row, one, one, row},
        [](float* const* p, std::size_t, std::size_t rows, std::size_t dim) {
          kernels::layer_norm_forward(p[0], p[1], p[2], p[3], w.data(), b.data(), rows, dim, 1e-5f);
        }},
      K{"layer_norm_backward (dx)", {row, row, row, one, one},
        [](float* const* p, std::size_t, std::size_t rows, std::size_t dim) {
          kernels::layer_norm_backward<float>(p[0], nullptr, nullptr, p[1], p[2], w.data(), p[3], p[4], rows, dim);
        }},
      K{"rope_forward (positions by row)", {doubled, doubled},
        [](float* const* p, std::size_t first, std::size_t rows, std::size_t dim) {
          kernels::rope_forward(p[0], p[1], *rope, 1, rows, 1, 2 * dim, 3 + first);
        }},
      K{"rope_backward", {doubled, doubled},
        [](float* const* p, std::size_t first, std::size_t rows, std::size_t dim) {
          kernels::rope_backward(p[0], p[1], *rope, 1, rows, 1, 2 * dim, 3 + first, false);
        }},
      K{"cross_entropy_forward (lse)", {one, row},
        [](float* const* p, std::size_t first, std::size_t rows, std::size_t dim) {
          std::vector<std::int32_t> targets(ids.begin() + first, ids.begin() + first + rows);
          for (auto& t : targets) t %= std::int32_t(dim);
          kernels::cross_entropy_forward(p[0], p[1], targets.data(), rows, dim);
        }},
      K{"cross_entropy_backward", {row, row, one},
        [](float* const* p, std::size_t first, std::size_t rows, std::size_t dim) {
          std::vector<std::int32_t> targets(ids.begin() + first, ids.begin() + first + rows);
          for (auto& t : targets) t %= std::int32_t(dim);
          // dloss / N is each row's scale: N rows with dloss N give every call the same.
          kernels::cross_entropy_backward(p[0], float(rows), p[1], p[2], targets.data(), rows, dim);
        }},
      K{"row_stable_matmul", {row, row},
        [](float* const* p, std::size_t, std::size_t rows, std::size_t dim) {
          kernels::row_stable_matmul(p[0], p[1], w.data(), rows, dim, dim, false);
        }},
      K{"row_stable_matmul (accumulating)", {row, row},
        [](float* const* p, std::size_t, std::size_t rows, std::size_t dim) {
          kernels::row_stable_matmul(p[0], p[1], w.data(), rows, dim, dim, true);
        }},
      // One row of A times B^T: output j is a . row j of B (the decoding products of a tied head).
      K{"gemm, one row times B^T (outputs as rows)", {row, one},
        [](float* const* p, std::size_t, std::size_t rows, std::size_t dim) {
          kernels::gemm<float>(false, true, 1, rows, dim, 1.0f, b.data(), dim, p[0], dim, 0.5f, p[1], rows);
        }},
  };
}

}  // namespace

TEST_CASE("a map kernel's element i equals the kernel on that element alone, for every length and offset") {
  CAPTURE(simd_level_name(simd_level()));
  for (const RowKernel& kernel : map_kernels())
    for (std::size_t n = 0; n <= 3 * 16 + 1; ++n)
      for (std::size_t offset : {0, 1, 3}) check_rows(kernel, n, 1, offset, 7 * n + offset);
}

TEST_CASE("a row kernel's row r equals the kernel on that row alone, at widths no SIMD width divides") {
  CAPTURE(simd_level_name(simd_level()));
  for (const RowKernel& kernel : row_kernels())
    for (std::size_t dim : {1, 3, 8, 15, 16, 17, 24, 33, 40, 48, 72, 100})
      for (std::size_t offset : {0, 1}) check_rows(kernel, 7, dim, offset, dim + offset);
}

TEST_CASE("gemm's one-row product: output column j equals the product with column j alone") {
  // op(B) = B (K, N) row-major: column j is strided, so it is copied out for the one-column call.
  CAPTURE(simd_level_name(simd_level()));
  for (std::size_t K : {1, 7, 16, 20, 64})
    for (std::size_t N = 1; N <= 3 * 16 + 1; ++N) {
      auto a = test::random_vector<float>(K, 1), B = test::random_vector<float>(K * N, 2);
      std::vector<float> c = test::random_vector<float>(N, 3), before = c;
      kernels::gemm<float>(false, false, 1, N, K, 0.5f, a.data(), K, B.data(), N, 1.0f, c.data(), N);
      for (std::size_t j = 0; j < N; ++j) {
        std::vector<float> column(K);
        for (std::size_t k = 0; k < K; ++k) column[k] = B[k * N + j];
        float alone = before[j];
        kernels::gemm<float>(false, false, 1, 1, K, 0.5f, a.data(), K, column.data(), 1, 1.0f, &alone, 1);
        CHECK_MESSAGE(same_bits(&alone, &c[j], 1), fmt::format("K {} N {} column {}", K, N, j));
      }
    }
}
