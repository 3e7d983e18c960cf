// bf16 matrix products (core/kernels/matmul_bf16.cpp, core/precision.h): the rounding, the
// kernel against a float64 reference of the rounded inputs and against a scalar model of its
// contract (AMX's TDPBF16PS), hand-made cases of that contract, its bits at every level, at
// emulated16 and by every path (AMX, VDPBF16PS, fused multiply-adds), and the matmul ops under a
// bf16 precision scope.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/kernels.h"
#include "core/kernels/kernel_table.h"
#include "core/ops.h"
#include "core/precision.h"
#include "core/random.h"
#include "core/simd.h"
#include "core/tape.h"
#include "support/bf16_contract.h"
#include "support/helpers.h"

using namespace tapegrad;

namespace {

struct LevelGuard {  // restores the level in use when a test that switches levels ends
  SimdLevel saved = simd_level();
  ~LevelGuard() { set_simd_level(saved); }
};

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

// op(X)(i, j) of a row-major X with leading dimension ld.
float element(const std::vector<float>& X, bool trans, std::size_t ld, std::size_t i, std::size_t j) {
  return trans ? X[j * ld + i] : X[i * ld + j];
}

// One product's operands: op(A) (M, K) and op(B) (K, N) stored transposed or not, and C's start.
struct Product {
  bool transpose_a = false, transpose_b = false;
  std::size_t M = 0, N = 0, K = 0;
  std::vector<float> A, B, C;
  std::size_t lda() const { return transpose_a ? M : K; }
  std::size_t ldb() const { return transpose_b ? K : N; }
  float a(std::size_t i, std::size_t k) const { return element(A, transpose_a, lda(), i, k); }
  float b(std::size_t k, std::size_t j) const { return element(B, transpose_b, ldb(), k, j); }
  // Runs a kernel of bf16_gemm's signature; returns C.
  template <class Kernel>
  std::vector<float> run(Kernel kernel, bool accumulate) const {
    std::vector<float> c = C;
    kernel(transpose_a, transpose_b, M, N, K, A.data(), lda(), B.data(), ldb(), accumulate, c.data(), N);
    return c;
  }
};

Product random_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, std::uint64_t seed) {
  Product p{transpose_a, transpose_b, M, N, K, test::random_vector(M * K, seed), test::random_vector(K * N, seed + 1),
            test::random_vector(M * N, seed + 2)};
  return p;
}

// The contract for element (i, j) (tests/support/bf16_contract.h).
float contract_model(const Product& p, std::size_t i, std::size_t j, bool accumulate) {
  return test::bf16_contract(p.K, [&](std::size_t k) { return p.a(i, k); }, [&](std::size_t k) { return p.b(k, j); },
                             accumulate ? p.C[i * p.N + j] : 0.0f);
}

// Every way to run bf16_gemm at the level in use, named: the kernel and each path.
std::vector<std::pair<std::string, std::function<void(bool, bool, std::size_t, std::size_t, std::size_t, const float*,
                                                      std::size_t, const float*, std::size_t, bool, float*,
                                                      std::size_t)>>>
every_path() {
  const auto& table = kernels::active_table<float>();
  std::vector<std::pair<std::string, std::function<void(bool, bool, std::size_t, std::size_t, std::size_t, const float*,
                                                        std::size_t, const float*, std::size_t, bool, float*,
                                                        std::size_t)>>>
      paths{{fmt::format("{} bf16_gemm", simd_level_name(simd_level())), table.bf16_gemm}};
  for (auto [path, name] : {std::pair{kernels::Bf16Path::amx_tiles, "amx_tiles"},
                            std::pair{kernels::Bf16Path::dot_product_instruction, "dot_product_instruction"},
                            std::pair{kernels::Bf16Path::fma_chain, "fma_chain"}})
    paths.emplace_back(fmt::format("{} {}", simd_level_name(simd_level()), name),
                       [kernels = &table, path](auto... arguments) { kernels->bf16_gemm_via(path, arguments...); });
  return paths;
}

// Whether this CPU has AMX-BF16 (Linux's name for it in /proc/cpuinfo).
bool cpu_has_amx_bf16() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) return line.find(" amx_bf16") != std::string::npos;
  return false;
}

// M = 101 passes one block of 96 rows of op(A) (the next one partial), N = 131 four panels of 32
// columns and a partial one, K = 301 and 513 slices of 256 and partial ones.
const std::size_t sizes[][3] = {{13, 70, 301}, {6, 64, 256}, {1, 1, 1}, {7, 131, 2}, {20, 17, 513}, {101, 40, 70}};

}  // namespace

TEST_CASE("float32 rounds to bfloat16 to nearest, ties to even, NaN kept quiet") {
  CHECK(to_bf16_bits(1.0f) == 0x3F80);
  CHECK(to_bf16_bits(std::bit_cast<float>(0x3F808000u)) == 0x3F80);  // a tie, down to even
  CHECK(to_bf16_bits(std::bit_cast<float>(0x3F818000u)) == 0x3F82);  // a tie, up to even
  CHECK(to_bf16_bits(std::bit_cast<float>(0x3F808001u)) == 0x3F81);  // above the tie
  CHECK(to_bf16_bits(-std::numeric_limits<float>::max()) == 0xFF80);  // rounds to -infinity
  CHECK(to_bf16_bits(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(to_bf16_bits(std::bit_cast<float>(0x7F800001u)) == 0x7FC0);  // a signalling NaN made quiet
  CHECK(to_bf16_bits(std::bit_cast<float>(0xFFC12345u)) == 0xFFC1);
  CHECK(from_bf16_bits(0xC0A0) == -5.0f);
  CHECK(round_to_bf16(1.00390625f) == 1.0f);  // 1 + 2^-8: a tie, to even
}

TEST_CASE("a bf16 product equals a float64 reference of the rounded inputs within float32 accumulation error") {
  // |c - ref| <= (K + 1) u sum_k |a_k b_k| (+ |C| when accumulating), u = 2^-24: a chain of K + 1
  // roundings; the reference sums the rounded inputs exactly enough in double.
  const double u = std::ldexp(1.0, -24);
  for (const auto& [M, N, K] : sizes)
    for (int form = 0; form < 8; ++form) {
      const bool transpose_a = form & 1, transpose_b = form & 2, accumulate = form & 4;
      Product p = random_product(transpose_a, transpose_b, M, N, K, 10 + form);
      std::vector<float> c = p.run(kernels::bf16_gemm<float>, accumulate);
      double worst = 0;
      for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j) {
          double ref = accumulate ? p.C[i * N + j] : 0.0, magnitude = std::fabs(ref);
          for (std::size_t k = 0; k < K; ++k) {
            double term = double(round_to_bf16(p.a(i, k))) * double(round_to_bf16(p.b(k, j)));
            ref += term;
            magnitude += std::fabs(term);
          }
          worst = std::max(worst, std::fabs(c[i * N + j] - ref) / ((K + 1) * u * magnitude));
        }
      CAPTURE(M);
      CAPTURE(N);
      CAPTURE(K);
      CAPTURE(form);
      CHECK(worst <= 1.0);
    }
}

TEST_CASE("a bf16 product is its contract: blocks of 32 k, per block an even and an odd chain, their sum added") {
  // Products of bf16 values with sums near each other's size make the order and the roundings show.
  for (const auto& [M, N, K] : sizes)
    for (int form = 0; form < 8; ++form) {
      const bool accumulate = form & 4;
      Product p = random_product(form & 1, form & 2, M, N, K, 30 + form);
      std::vector<float> c = p.run(kernels::bf16_gemm<float>, accumulate);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j) differ += bits_of(c[i * N + j]) != bits_of(contract_model(p, i, j, accumulate));
      CAPTURE(M);
      CAPTURE(N);
      CAPTURE(K);
      CAPTURE(form);
      CHECK(differ == 0);
    }
}

TEST_CASE("every lane of a packed operand rounds as the contract says: ties, and float32 subnormals near 2^-126") {
  // One operand holds the values, each at many positions of a vector; the other picks one k per
  // row or column (a one, zeros elsewhere), so that C shows each value as a bf16 operand. The
  // instruction's conversion reads float32 subnormals as zero: 0x007FFFFF and 0x807F8000 (a tie)
  // must still round up to +-2^-126, 0x007F7FFF down to a flushed subnormal.
  const std::uint32_t values[] = {0x3F808000u, 0x3F818000u, 0xBF80C000u, 0x007FFFFFu, 0x807F8000u,
                                  0x007F7FFFu, 0x00400000u, 0x80000001u, 0x00800000u, 0x00808000u,
                                  0x3F800001u, 0x7F7F7FFFu, 0xC2F6E979u};
  constexpr std::size_t count = std::size(values), rows = 21, picks = 37, K = 64;
  for (SimdLevel level : testable_simd_levels()) {
    LevelGuard guard;
    set_simd_level(level);
    for (int form = 0; form < 8; ++form) {
      const bool values_in_a = !(form & 4);
      Product p{bool(form & 1), bool(form & 2), values_in_a ? rows : picks, values_in_a ? picks : rows, K};
      p.A.resize(p.M * K), p.B.resize(K * p.N), p.C.assign(p.M * p.N, 0.0f);
      auto value = [&](std::size_t row, std::size_t k) { return std::bit_cast<float>(values[(row + k) % count]); };
      auto pick = [](std::size_t row, std::size_t k) { return k == row % K ? 1.0f : 0.0f; };
      for (std::size_t i = 0; i < p.M; ++i)
        for (std::size_t k = 0; k < K; ++k)
          p.A[p.transpose_a ? k * p.lda() + i : i * p.lda() + k] = values_in_a ? value(i, k) : pick(i, k);
      for (std::size_t k = 0; k < K; ++k)
        for (std::size_t j = 0; j < p.N; ++j)
          p.B[p.transpose_b ? j * p.ldb() + k : k * p.ldb() + j] = values_in_a ? pick(j, k) : value(j, k);
      for (const auto& [name, run] : every_path()) {
        const std::vector<float> c = p.run(run, false);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < p.M; ++i)
          for (std::size_t j = 0; j < p.N; ++j)
            differ += bits_of(c[i * p.N + j]) != bits_of(contract_model(p, i, j, false));
        CAPTURE(name);
        CAPTURE(form);
        CHECK(differ == 0);
      }
    }
  }
}

TEST_CASE("hand-made cases pin the bf16 contract's order, blocks, signed zeros and flushes at every level and path") {
  struct Case {
    const char* what;
    std::vector<float> a, b;  // one row of op(A), one column of op(B): K = a.size()
    float c;                  // C, accumulated into
    float expected;
  };
  const float tiny = 0x1p-126f;
  std::vector<Case> cases = {
      {"C = 1 plus 2^-24 on each chain: the chains' sum is added once", {0x1p-12f, 0x1p-12f}, {0x1p-12f, 0x1p-12f}, 1.0f,
       1.0f + 0x1p-23f},
      {"2^-24 twice after 1 on one chain: each step rounds (a tie, to even)", {1, 0, 0x1p-12f, 0, 0x1p-12f},
       {1, 0, 0x1p-12f, 0, 0x1p-12f}, 0.0f, 1.0f},
      {"a second block starts its chains from +0", [] { std::vector<float> v(34, 0.0f); v[0] = 1, v[32] = v[33] = 0x1p-12f; return v; }(),
       [] { std::vector<float> v(34, 0.0f); v[0] = 1, v[32] = v[33] = 0x1p-12f; return v; }(), 0.0f, 1.0f + 0x1p-23f},
      {"a full block of negative underflows keeps C = -0", std::vector<float>(32, -0x1p-70f), std::vector<float>(32, 0x1p-70f),
       -0.0f, -0.0f},
      {"a padded block's +0 turns a chain's -0 into +0", std::vector<float>(31, -0x1p-70f), std::vector<float>(31, 0x1p-70f),
       -0.0f, 0.0f},
      {"2^-126 - 2^-150 is tiny after rounding: flushed", {0x1p-63f, 0, -0x1p-75f}, {0x1p-63f, 0, 0x1p-75f}, 0.0f, 0.0f},
      {"2^-126 - 2^-152 rounds to 2^-126: kept", {0x1p-63f, 0, -0x1p-76f}, {0x1p-63f, 0, 0x1p-76f}, 0.0f, tiny},
      {"a subnormal C is read as zero", {0x1p-63f}, {0x1p-63f}, 0x1p-140f, tiny},
      {"a subnormal operand is read as zero", {1e-40f, 1.0f}, {0x1p120f, 1.0f}, 0.0f, 1.0f},
      {"a float32 subnormal within half an ulp of 2^-126 rounds to it", {std::bit_cast<float>(0x007FFFFFu)}, {0x1p100f},
       0.0f, 0x1p-26f},
      {"... a tie too, of either sign, in either operand", {0x1p100f}, {std::bit_cast<float>(0x807F8000u)}, 0.0f,
       -0x1p-26f},
      {"one just under it rounds to a bf16 subnormal: read as zero", {std::bit_cast<float>(0x007F7FFFu)}, {0x1p100f},
       0.0f, 0.0f},
      {"a product past float's range is infinite on its chain", {0x1p100f, 0, -0x1p100f}, {0x1p100f, 0, 0x1p100f}, 0.0f,
       std::numeric_limits<float>::infinity()},
  };
  for (SimdLevel level : testable_simd_levels()) {
    LevelGuard guard;
    set_simd_level(level);
    for (const auto& [name, run] : every_path())
      for (const Case& test : cases)
        for (int form = 0; form < 4; ++form) {  // a row and a column: the same floats stored either way
          const bool transpose_a = form & 1, transpose_b = form & 2;
          const std::size_t K = test.a.size();
          float c = test.c;
          run(transpose_a, transpose_b, 1, 1, K, test.a.data(), transpose_a ? 1 : K, test.b.data(), transpose_b ? K : 1,
              true, &c, 1);
          CAPTURE(name);
          CAPTURE(test.what);
          CAPTURE(form);
          CHECK(bits_of(c) == bits_of(test.expected));
        }
  }
}

TEST_CASE("bf16 products have the same bits at every level, at emulated16 and by the instruction") {
  // Values over many exponents (products below float's normal range, none past its largest
  // value: a NaN's payload may differ), a subnormal input and C to accumulate into, and every path:
  // bf16_gemm (whichever is faster here), and the instruction (where the CPU has it) and the chain.
  // Both transpositions of each operand: each is packed along its rows or across them.
  for (bool transposed : {false, true}) {
    Product p = random_product(transposed, !transposed, 19, 75, 515, 50);
    Rng rng(51);
    for (auto* v : {&p.A, &p.B, &p.C})
      for (float& x : *v) x = std::ldexp(x, int(rng.uniform() * 110) - 55);
    p.C[3] = std::bit_cast<float>(0x00012345u);
    p.A[7] = std::bit_cast<float>(0x00400000u);
    p.A[40] = std::bit_cast<float>(0x807FC000u);  // rounds to -2^-126
    p.B[90] = std::bit_cast<float>(0x007F8000u);  // a tie: to 2^-126
    std::vector<std::vector<float>> results;
    std::vector<std::string> names;
    for (bool accumulate : {false, true})
      for (SimdLevel level : testable_simd_levels()) {
        LevelGuard guard;
        set_simd_level(level);
        for (const auto& [name, run] : every_path()) {
          results.push_back(p.run(run, accumulate));
          names.push_back(fmt::format("{}, accumulate {}", name, accumulate));
        }
      }
    const std::size_t per_flag = results.size() / 2;
    for (std::size_t r = 1; r < results.size(); ++r) {
      const auto& reference = results[r / per_flag * per_flag];  // the same accumulate flag
      std::size_t differ = 0;
      for (std::size_t i = 0; i < reference.size(); ++i) differ += bits_of(results[r][i]) != bits_of(reference[i]);
      CAPTURE(names[r]);
      CAPTURE(transposed);
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("AMX tiles give the fused multiply-adds' bits on ragged shapes, every transposition, accumulating or not") {
  // M, N, K from 1 to 70 (partial tiles of rows, columns and blocks, odd K), then N past the
  // columns packed at a time (256), then K past two slabs of k (2,048 each), operands over many
  // exponents. Where the CPU has no AMX, the
  // path falls back to the next and the test says so.
  if (!cpu_has_amx_bf16()) MESSAGE("this CPU has no AMX-BF16: the amx_tiles path runs VDPBF16PS or the chain");
  LevelGuard guard;
  set_simd_level(supported_simd_levels().back());
  const auto& table = kernels::active_table<float>();
  Rng rng(90);
  auto extent = [&] { return std::size_t(1 + rng.uniform() * 69.99); };
  std::size_t differ = 0, shapes = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const bool transpose_a = trial & 1, transpose_b = trial & 2, accumulate = trial & 4, wide = trial >= 40 && trial < 44,
               deep = trial >= 44;
    const std::size_t M = wide ? 45 : deep ? 35 : extent(), N = wide ? 531 : deep ? 40 : extent(),
                      K = deep ? 4173 : trial % 5 == 0 ? 2 * extent() + 1 : extent();
    Product p = random_product(transpose_a, transpose_b, M, N, K, 100 + trial);
    for (auto* v : {&p.A, &p.B, &p.C})
      for (float& x : *v) x = std::ldexp(x, int(rng.uniform() * 60) - 30);
    auto run = [&](kernels::Bf16Path path) {
      return p.run([&](auto... arguments) { table.bf16_gemm_via(path, arguments...); }, accumulate);
    };
    std::vector<float> tiles = run(kernels::Bf16Path::amx_tiles), chain = run(kernels::Bf16Path::fma_chain);
    for (std::size_t i = 0; i < tiles.size(); ++i) differ += bits_of(tiles[i]) != bits_of(chain[i]);
    ++shapes;
  }
  CHECK(shapes == 48);
  CHECK(differ == 0);
}

TEST_CASE("bf16_gemm_path, 0.3's spelling, still gives bf16_gemm's product") {
  Product p = random_product(true, false, 5, 9, 40, 95);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  std::vector<float> old = p.run([](auto... arguments) { kernels::bf16_gemm_path<float>(true, arguments...); }, true);
#pragma GCC diagnostic pop
  CHECK(old == p.run(kernels::bf16_gemm<float>, true));
  CHECK(old != p.C);
}

TEST_CASE("a bf16 product's row and column do not depend on the rest of the call nor the thread count") {
  Product p = random_product(true, false, 40, 90, 300, 60);
  std::vector<float> whole = p.run(kernels::bf16_gemm<float>, true);
  // Rows 11..29, columns 5..71: the same operands seen through offsets.
  const std::size_t i0 = 11, rows = 19, j0 = 5, cols = 67;
  std::vector<float> part(rows * p.N);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) part[i * p.N + j] = p.C[(i0 + i) * p.N + j0 + j];
  kernels::bf16_gemm<float>(true, false, rows, cols, p.K, p.A.data() + i0, p.lda(), p.B.data() + j0, p.ldb(), true,
                            part.data(), p.N);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) differ += bits_of(part[i * p.N + j]) != bits_of(whole[(i0 + i) * p.N + j0 + j]);
  CHECK(differ == 0);
  // Products big enough to split over two threads, by columns and by rows, against one thread.
  const int threads = num_threads();
  for (const auto& [transpose_a, M, N, K] : {std::tuple{true, 40, 90, 600}, std::tuple{false, 130, 70, 300}}) {
    CAPTURE(M);
    Product q = random_product(transpose_a, !transpose_a, std::size_t(M), std::size_t(N), std::size_t(K), 61);
    set_num_threads(2);
    const std::vector<float> many = q.run(kernels::bf16_gemm<float>, true);
    set_num_threads(1);
    const std::vector<float> one_thread = q.run(kernels::bf16_gemm<float>, true);
    set_num_threads(threads);
    differ = 0;
    for (std::size_t i = 0; i < many.size(); ++i) differ += bits_of(many[i]) != bits_of(one_thread[i]);
    CHECK(differ == 0);
  }
}

TEST_CASE("a NaN input gives a NaN in its row and column of a bf16 product") {
  Product p = random_product(false, false, 8, 40, 37, 70);
  p.A[2 * p.K + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> c = p.run(kernels::bf16_gemm<float>, false);
  for (std::size_t j = 0; j < p.N; ++j) CHECK(std::isnan(c[2 * p.N + j]));
  CHECK(!std::isnan(c[3 * p.N]));
}

TEST_CASE("under a bf16 scope matmul and add_matmul are bf16 products forward and backward, kept for a later backward") {
  // The op's gradient, by definition (core/precision.h): the float32 product's gradient at the
  // rounded operands, straight through the rounding (whose own derivative is zero almost
  // everywhere, so finite differences of the bf16 op measure nothing). Checked here: each gradient
  // is exactly the bf16 product of the rounded dy and operand that the float32 backward would
  // multiply, and it stays within bf16's error of the float32 op's gradient (which
  // test_matmul.cpp checks by finite differences).
  const std::size_t M = 9, K = 37, N = 21;
  Tensor x = test::random_tensor({M, K}, 80), w = test::random_tensor({K, N}, 81), r = test::random_tensor({M, N}, 82);
  Tensor c = test::random_tensor({M, N}, 83);  // dy = c: the loss sum(y * c) is linear in y
  auto run = [&](Precision precision, bool with_residual) {
    Var rv(r, true), xv(x, true), wv(w, true);
    Tape tape;
    Var y;
    {
      PrecisionScope scope(precision);
      y = with_residual ? add_matmul(rv, xv, wv) : matmul(xv, wv);
    }
    tape.backward(sum(mul(y, Var(c))));  // outside the scope: the ops kept their precision
    return std::tuple{Tensor(y.value()), Tensor(xv.grad()), Tensor(wv.grad())};
  };
  for (bool with_residual : {false, true}) {
    CAPTURE(with_residual);
    auto [y, dx, dw] = run(Precision::bf16, with_residual);
    std::vector<float> y_ref(M * N), dx_ref(M * K, 0.0f), dw_ref(K * N, 0.0f);
    if (with_residual) std::copy_n(r.data(), M * N, y_ref.data());
    kernels::bf16_gemm<float>(false, false, M, N, K, x.data(), K, w.data(), N, with_residual, y_ref.data(), N);
    kernels::bf16_gemm<float>(false, true, M, K, N, c.data(), N, w.data(), N, false, dx_ref.data(), K);
    kernels::bf16_gemm<float>(true, false, K, N, M, x.data(), K, c.data(), N, true, dw_ref.data(), N);
    CHECK(std::equal(y_ref.begin(), y_ref.end(), y.data()));
    CHECK(std::equal(dx_ref.begin(), dx_ref.end(), dx.data()));
    CHECK(std::equal(dw_ref.begin(), dw_ref.end(), dw.data()));
    // Against float32: each operand off by at most 2^-9 relative, so a product's terms by 2^-8.
    auto [y32, dx32, dw32] = run(Precision::f32, with_residual);
    auto close = [](const Tensor& got, const Tensor& want, double scale) {
      double worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got.data()[i]) - want.data()[i]));
      return worst <= scale;
    };
    CHECK(close(y, y32, 4.0 * K * std::ldexp(1.0, -8)));
    CHECK(close(dx, dx32, 4.0 * N * std::ldexp(1.0, -8)));
    CHECK(close(dw, dw32, 4.0 * M * std::ldexp(1.0, -8)));
    CHECK(!close(dw, dw32, 0.0));  // the rounding shows
  }
  CHECK(matmul_precision() == Precision::f32);
}

TEST_CASE("precision scopes nest and restore; a precision is named f32 or bf16") {
  CHECK(matmul_precision() == Precision::f32);
  {
    PrecisionScope outer(Precision::bf16);
    CHECK(matmul_precision() == Precision::bf16);
    {
      PrecisionScope inner(Precision::f32);
      CHECK(matmul_precision() == Precision::f32);
    }
    CHECK(matmul_precision() == Precision::bf16);
  }
  CHECK(matmul_precision() == Precision::f32);
  CHECK(parse_precision("bf16") == Precision::bf16);
  CHECK(precision_name(Precision::bf16) == "bf16");
  std::string message = test::error_of<std::invalid_argument>([] { parse_precision("fp16"); });
  CHECK(test::contains(message, "'fp16'"));
  CHECK(test::contains(message, "f32 or bf16"));
}
