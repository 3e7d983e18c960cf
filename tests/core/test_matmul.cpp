// matmul: every transpose flag against a triple loop, batched inputs, splits across threads, and
// which products go to OpenBLAS.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/blas_core.h"
#include "core/ops.h"
#include "core/simd.h"
#include "support/checks.h"

using namespace tapegrad;
using test::contains;
using test::error_of;

namespace {
// Naive reference: C[i, j] = sum_k op(A)[i, k] op(B)[k, j], in double.
std::vector<float> naive_matmul(const float* A, const float* B, std::size_t M, std::size_t K, std::size_t N, bool ta,
                                bool tb) {
  std::vector<float> C(M * N);
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) {
      double s = 0;
      for (std::size_t k = 0; k < K; ++k) s += double(ta ? A[k * M + i] : A[i * K + k]) * double(tb ? B[j * K + k] : B[k * N + j]);
      C[i * N + j] = float(s);
    }
  return C;
}
}  // namespace

TEST_CASE("matmul matches a naive triple loop for every transpose flag, batched or not") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::size_t M = 5, K = 7, N = 3;
      Tensor a = test::random_tensor(ta ? Shape{K, M} : Shape{M, K}, 1);
      Tensor b = test::random_tensor(tb ? Shape{N, K} : Shape{K, N}, 2);
      Var c = matmul(Var(a), Var(b), ta, tb);
      CHECK(c.shape() == Shape{M, N});
      auto ref = naive_matmul(a.data(), b.data(), M, K, N, ta, tb);
      for (std::size_t i = 0; i < ref.size(); ++i) CHECK(c.value()[i] == doctest::Approx(ref[i]).epsilon(1e-5));

      Tensor ba = test::random_tensor(ta ? Shape{2, K, M} : Shape{2, M, K}, 3);
      Tensor bb = test::random_tensor(tb ? Shape{2, N, K} : Shape{2, K, N}, 4);
      Var bc = matmul(Var(ba), Var(bb), ta, tb);
      CHECK(bc.shape() == Shape{2, M, N});
      for (std::size_t batch = 0; batch < 2; ++batch) {
        auto r = naive_matmul(ba.data() + batch * M * K, bb.data() + batch * K * N, M, K, N, ta, tb);
        for (std::size_t i = 0; i < r.size(); ++i)
          CHECK(bc.value()[batch * M * N + i] == doctest::Approx(r[i]).epsilon(1e-5));
      }
    }
}

TEST_CASE("matmul flattens leading axes of a (B, T, K) input against a (K, N) weight") {
  Tensor x = test::random_tensor({2, 3, 4}, 1), w = test::random_tensor({4, 6}, 2);
  Var y = matmul(Var(x), Var(w));
  CHECK(y.shape() == Shape{2, 3, 6});
  auto ref = naive_matmul(x.data(), w.data(), 6, 4, 6, false, false);
  for (std::size_t i = 0; i < ref.size(); ++i) CHECK(y.value()[i] == doctest::Approx(ref[i]).epsilon(1e-5));
}

TEST_CASE("a split matmul is reproducible for a fixed thread count and close across counts") {
  Tensor x = test::random_tensor({512, 128}, 1), w = test::random_tensor({128, 256}, 2);
  set_num_threads(1);
  Tensor one = matmul(Var(x), Var(w)).value();
  set_num_threads(2);
  Tensor two = matmul(Var(x), Var(w)).value();
  Tensor again = matmul(Var(x), Var(w)).value();
  set_num_threads(0);
  CHECK(max_abs_diff(two, again) == 0.0f);
  // OpenBLAS picks its micro-tiles from the row count it is given, so rows near a split point
  // can round differently (measured: about 1e-5 on sums of 128 products of unit normals).
  CHECK(max_abs_diff(one, two) < 1e-4f);
}

TEST_CASE("packed_gemm matches a naive loop for every transpose, alpha and beta, across its tile and block edges") {
  // 101 rows: 16 whole 6-row tiles, a block edge at 96 and a partial tile; 37 columns: whole and
  // partial panels at every width; K 1100: two slices or more at every depth (256, 1024).
  const std::size_t M = 101, N = 37, K = 1100;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, {1.0f, 1.0f}, {0.5f, -2.0f}}) {
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(beta);
        auto a = test::random_vector<float>(M * K, 1), b = test::random_vector<float>(K * N, 2);
        auto c = test::random_vector<float>(M * N, 3);
        auto ref = naive_matmul(a.data(), b.data(), M, K, N, ta, tb);
        std::vector<float> got = c;
        kernels::packed_gemm<float>(ta, tb, M, N, K, alpha, a.data(), ta ? M : K, b.data(), tb ? K : N, beta,
                                    got.data(), N);
        double worst = 0;
        for (std::size_t i = 0; i < ref.size(); ++i)
          worst = std::max(worst, double(std::fabs(got[i] - (alpha * ref[i] + beta * c[i])) / (1 + std::fabs(ref[i]))));
        // Float sums of 1100 products of unit normals: about sqrt(1100) * 6e-8 * 33 = 7e-5 (two
        // roundings per term without FMA), so 1e-4 of (1 + |value|).
        CHECK(worst < 1e-4);
      }
}

TEST_CASE("packed_gemm over thousands of columns (a vocabulary) has the bits of its column parts, either layout of B") {
  // 4500 columns run in column blocks at every level (more than 8 x 512), and at AVX-512 (and
  // emulated16) a part whose packed slice outgrows L2_floats in near-equal parts of whole panels:
  // 2048 x 300 floats in 2 parts, and 1000 columns 1100 deep in 3 (the last panel partial), while
  // parts of 200 columns run whole. 13 and 7 rows: partial tiles and panels, K slices, and B^T's
  // 16 x 16 (8 x 8, 4 x 4) register transposes with partial blocks of columns and of k.
  struct Shape { std::size_t M, N, K, part; };
  for (const Shape& shape : {Shape{13, 4500, 300, 2048}, Shape{7, 1000, 1100, 200}}) {
    const std::size_t M = shape.M, N = shape.N, K = shape.K, part = shape.part;  // named: CAPTURE's lambda
    const auto a = test::random_vector<float>(M * K, 1), b = test::random_vector<float>(K * N, 2);
    for (bool tb : {false, true}) {
      CAPTURE(N);
      CAPTURE(tb);
      const std::size_t ldb = tb ? K : N;
      std::vector<float> whole(M * N), parts(M * N);
      kernels::packed_gemm<float>(false, tb, M, N, K, 1.0f, a.data(), K, b.data(), ldb, 0.0f, whole.data(), N);
      for (std::size_t j = 0; j < N; j += part) {
        const std::size_t n = std::min(part, N - j);
        kernels::packed_gemm<float>(false, tb, M, n, K, 1.0f, a.data(), K, b.data() + (tb ? j * ldb : j), ldb, 0.0f,
                                    parts.data() + j, N);
      }
      CHECK(whole == parts);
      const auto ref = naive_matmul(a.data(), b.data(), M, K, N, false, tb);
      double worst = 0;
      for (std::size_t i = 0; i < ref.size(); ++i)
        worst = std::max(worst, double(std::fabs(whole[i] - ref[i]) / (1 + std::fabs(ref[i]))));
      CHECK(worst < 1e-4);  // as in the edge test above
    }
  }
}

TEST_CASE("packed_gemm gives the same bits on 1 and 2 threads; gemm, whichever kernel it picks, matches a naive loop") {
  const std::size_t M = 512, K = 128, N = 256;
  auto a = test::random_vector<float>(M * K, 1), b = test::random_vector<float>(K * N, 2);
  std::vector<float> one(M * N), two(M * N), by_gemm(M * N);
  set_num_threads(1);
  kernels::packed_gemm<float>(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, one.data(), N);
  set_num_threads(2);
  kernels::packed_gemm<float>(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, two.data(), N);
  kernels::gemm<float>(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, by_gemm.data(), N);
  set_num_threads(0);
  CHECK(one == two);
  auto ref = naive_matmul(a.data(), b.data(), M, K, N, false, false);
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, double(std::fabs(by_gemm[i] - ref[i])));
  CHECK(worst < 1e-4);
}

TEST_CASE("row_stable_matmul and its transposed form give the same bits on 1, 2 and 3 threads; the transposed one is "
          "gemm's row by row") {
  // (M, K, N): decoding's one row and a few, prefill's many; N past whole vectors and chunks of 64.
  const std::size_t shapes[][3] = {{1, 576, 192}, {1, 300, 1000}, {3, 260, 333}, {7, 576, 1536}, {40, 64, 2050}};
  for (const auto& [M, K, N] : shapes) {
    const auto x = test::random_vector<float>(M * K, 1), w = test::random_vector<float>(K * N, 2);
    const auto bias = test::random_vector<float>(M * N, 3);
    std::vector<std::vector<float>> product, accumulated, transposed;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      product.emplace_back(M * N);
      kernels::row_stable_matmul(product.back().data(), x.data(), w.data(), M, K, N, false);
      accumulated.push_back(bias);
      kernels::row_stable_matmul(accumulated.back().data(), x.data(), w.data(), M, K, N, true);
      transposed.emplace_back(M * N);  // w read as (N, K)
      kernels::row_stable_matmul_transposed(transposed.back().data(), x.data(), w.data(), M, K, N);
    }
    set_num_threads(0);
    INFO("M = ", M, ", K = ", K, ", N = ", N);
    for (std::size_t t = 1; t < 3; ++t) {
      CHECK(product[t] == product[0]);
      CHECK(accumulated[t] == accumulated[0]);
      CHECK(transposed[t] == transposed[0]);
    }
    std::vector<float> row(N);
    for (std::size_t i = 0; i < M; ++i) {
      kernels::gemm<float>(false, true, 1, N, K, 1.0f, x.data() + i * K, K, w.data(), K, 0.0f, row.data(), N);
      CHECK(std::equal(row.begin(), row.end(), transposed[0].begin() + std::ptrdiff_t(i * N)));
    }
    const auto ref = naive_matmul(x.data(), w.data(), M, K, N, false, false);
    double worst = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, double(std::fabs(product[0][i] - ref[i])));
    CHECK(worst < 1e-3);
  }
}

TEST_CASE("matmul kernels match central differences in double") {
  // {7, 260, 9} runs packed_gemm's partial tiles and panels and its two K slices in double where
  // slices are 256 deep (sse2, avx2), {7, 1030, 3} where they are 1024 deep (avx512).
  for (auto [M, K, N] : {std::tuple{1, 1, 1}, {3, 4, 5}, {6, 2, 3}, {7, 260, 9}, {7, 1030, 3}}) {
    auto x = test::random_vector<double>(M * K, 1), w = test::random_vector<double>(K * N, 2);
    auto R = test::random_vector<double>(M * N, 3);
    std::vector<double> dx(M * K), dw(K * N);
    kernels::matmul_backward<double>(dx.data(), dw.data(), R.data(), x.data(), w.data(), M, K, N);
    auto forward = [&] {
      std::vector<double> y(M * N);
      kernels::matmul_forward<double>(y.data(), x.data(), w.data(), M, K, N);
      return y;
    };
    test::check_double("matmul dx", x, forward, R, dx);
    test::check_double("matmul dw", w, forward, R, dw);
  }
}

TEST_CASE("matmul gradients pass gradcheck for every flag combination and batching") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      test::check_float_op("matmul", [=](const std::vector<Var>& v) { return matmul(v[0], v[1], ta, tb); },
                           {test::random_tensor(ta ? Shape{4, 3} : Shape{3, 4}, 1),
                            test::random_tensor(tb ? Shape{5, 4} : Shape{4, 5}, 2)});
      test::check_float_op("batched matmul", [=](const std::vector<Var>& v) { return matmul(v[0], v[1], ta, tb); },
                           {test::random_tensor(ta ? Shape{2, 4, 3} : Shape{2, 3, 4}, 3),
                            test::random_tensor(tb ? Shape{2, 5, 4} : Shape{2, 4, 5}, 4)});
    }
  test::check_float_op("matmul (B, T, K) x (K, N)", [](const std::vector<Var>& v) { return matmul(v[0], v[1]); },
                       {test::random_tensor({2, 1, 3}, 5), test::random_tensor({3, 2}, 6)});
  // A first gradient is written, later ones added: one input on both sides, and a weight used twice.
  test::check_float_op("x x^T", [](const std::vector<Var>& v) { return matmul(v[0], v[0], false, true); },
                       {test::random_tensor({3, 4}, 7)});
  test::check_float_op("(x w) w", [](const std::vector<Var>& v) { return matmul(matmul(v[0], v[1]), v[1]); },
                       {test::random_tensor({3, 4}, 8), test::random_tensor({4, 4}, 9)});
}

TEST_CASE("matmul names both shapes when they do not fit") {
  CHECK(error_of([] { matmul(Var(Tensor({4, 3})), Var(Tensor({5, 2}))); }) ==
        "matmul: inner sizes differ; a is [4, 3], b is [5, 2]");
  CHECK(contains(error_of([] { matmul(Var(Tensor({2, 4, 3})), Var(Tensor({3, 3, 2}))); }),
                 "the leading (batch) axes do not broadcast; a is [2, 4, 3], b is [3, 3, 2]"));
}

TEST_CASE("add_matmul is r + x w, in place or not, and its kernels match central differences in double") {
  const std::size_t M = 6, K = 5, N = 3;
  Tensor r = test::random_tensor({2, 3, N}, 1), x = test::random_tensor({2, 3, K}, 2), w = test::random_tensor({K, N}, 3);
  Var y = add_matmul(Var(r), Var(x), Var(w));
  CHECK(y.shape() == Shape{2, 3, N});
  auto xw = naive_matmul(x.data(), w.data(), M, K, N, false, false);
  for (std::size_t i = 0; i < xw.size(); ++i) CHECK(y.value()[i] == doctest::Approx(r[i] + xw[i]).epsilon(1e-5));
  Tensor in_place = r;  // the KV-cache path: y aliases r
  kernels::add_matmul_forward(in_place.data(), in_place.data(), x.data(), w.data(), M, K, N);
  CHECK(max_abs_diff(in_place, y.value()) == 0.0f);

  auto rd = test::random_vector<double>(M * N, 4), xd = test::random_vector<double>(M * K, 5);
  auto wd = test::random_vector<double>(K * N, 6), R = test::random_vector<double>(M * N, 7);
  std::vector<double> dr(M * N), dx(M * K), dw(K * N);
  kernels::add_matmul_backward<double>(dr.data(), dx.data(), dw.data(), R.data(), xd.data(), wd.data(), M, K, N);
  auto forward = [&] {
    std::vector<double> out(M * N);
    kernels::add_matmul_forward<double>(out.data(), rd.data(), xd.data(), wd.data(), M, K, N);
    return out;
  };
  test::check_double("add_matmul dr", rd, forward, R, dr);
  test::check_double("add_matmul dx", xd, forward, R, dx);
  test::check_double("add_matmul dw", wd, forward, R, dw);

  // The first gradient of dr and dx written over buffers holding NaN (no values yet) equals the
  // gradient added to zeros.
  std::vector<double> dr_written(M * N, NAN), dx_written(M * K, NAN), dw_again(K * N);
  kernels::add_matmul_backward<double>(dr_written.data(), dx_written.data(), dw_again.data(), R.data(), xd.data(),
                                       wd.data(), M, K, N, true, true);
  CHECK(dr_written == dr);
  CHECK(dx_written == dx);
  CHECK(dw_again == dw);
}

TEST_CASE("add_matmul passes gradcheck; a known output is taken as is and changes no gradient") {
  Tensor r = test::random_tensor({2, 3, 4}, 1), x = test::random_tensor({2, 3, 5}, 2), w = test::random_tensor({5, 4}, 3);
  test::check_float_op("add_matmul", [](const std::vector<Var>& v) { return add_matmul(v[0], v[1], v[2]); }, {r, x, w});
  // One Var as r and x (and as x and w): its gradients add up, neither written over the other.
  Tensor square = test::random_tensor({4, 4}, 5), other = test::random_tensor({4, 4}, 6);
  test::check_float_op("add_matmul", [](const std::vector<Var>& v) { return add_matmul(v[0], v[0], v[1]); },
                       {square, other});
  test::check_float_op("add_matmul", [](const std::vector<Var>& v) { return add_matmul(v[1], v[0], v[0]); },
                       {square, other});

  // What rematerialisation relies on (Note [Remat]): with known_y the op records the same
  // backward, so the gradients are bit-identical, and its value is known_y itself.
  Tensor c = test::random_tensor({2, 3, 4}, 4);
  auto grads = [&](const Tensor* known) {
    Var rv(r, true), xv(x, true), wv(w, true);
    Tape tape;
    Var y = add_matmul(rv, xv, wv, known);
    tape.backward(sum(mul(y, Var(c))));  // linear in y, so dy does not depend on y's value
    return std::tuple{Tensor(y.value()), Tensor(rv.grad()), Tensor(xv.grad()), Tensor(wv.grad())};
  };
  auto [y0, dr0, dx0, dw0] = grads(nullptr);
  Tensor marked = y0;
  marked[0] += 1.0f;  // a different known value shows that it is taken, not recomputed
  auto [y1, dr1, dx1, dw1] = grads(&marked);
  CHECK(max_abs_diff(y1, marked) == 0.0f);
  CHECK(max_abs_diff(dx0, dx1) == 0.0f);
  CHECK(max_abs_diff(dw0, dw1) == 0.0f);
  CHECK(max_abs_diff(dr0, dr1) == 0.0f);
}

TEST_CASE("add_matmul with a bias is x w + b on every row, and its kernels match central differences in double") {
  const std::size_t M = 7, K = 5, N = 3;
  Tensor b = test::random_tensor({N}, 1), x = test::random_tensor({M, K}, 2), w = test::random_tensor({K, N}, 3);
  Var y = add_matmul(Var(b), Var(x), Var(w));
  CHECK(y.shape() == Shape{M, N});
  auto xw = naive_matmul(x.data(), w.data(), M, K, N, false, false);
  for (std::size_t i = 0; i < xw.size(); ++i) CHECK(y.value()[i] == doctest::Approx(b[i % N] + xw[i]).epsilon(1e-5));
  test::check_float_op("add_matmul (bias)", [](const std::vector<Var>& v) { return add_matmul(v[0], v[1], v[2]); },
                       {b, x, w});

  auto bd = test::random_vector<double>(N, 4), xd = test::random_vector<double>(M * K, 5);
  auto wd = test::random_vector<double>(K * N, 6), R = test::random_vector<double>(M * N, 7);
  std::vector<double> db(N), dx(M * K), dw(K * N);
  kernels::linear_backward<double>(dx.data(), dw.data(), db.data(), R.data(), xd.data(), wd.data(), M, K, N);
  auto forward = [&] {
    std::vector<double> out(M * N);
    kernels::linear_forward<double>(out.data(), xd.data(), wd.data(), bd.data(), M, K, N);
    return out;
  };
  test::check_double("linear db", bd, forward, R, db);
  test::check_double("linear dx", xd, forward, R, dx);
  test::check_double("linear dw", wd, forward, R, dw);
}

TEST_CASE("add_matmul names the shapes that do not fit") {
  CHECK(error_of([] { add_matmul(Var(Tensor({4, 2})), Var(Tensor({4, 3})), Var(Tensor({5, 2}))); }) ==
        "add_matmul: expected x (.., K) and w (K, N); x is [4, 3], w is [5, 2]");
  CHECK(error_of([] { add_matmul(Var(Tensor({4, 3})), Var(Tensor({4, 3})), Var(Tensor({3, 2}))); }) ==
        "add_matmul: r must have the shape of x w, [4, 2], or be a bias (2); got [4, 3]");
  CHECK(error_of([] { add_matmul(Var(Tensor({3})), Var(Tensor({4, 3})), Var(Tensor({3, 2}))); }) ==
        "add_matmul: r must have the shape of x w, [4, 2], or be a bias (2); got [3]");
  Tensor wrong({3, 2});
  CHECK(error_of([&] { add_matmul(Var(Tensor({4, 2})), Var(Tensor({4, 3})), Var(Tensor({3, 2})), &wrong); }) ==
        "add_matmul: expected known_y to be [4, 2], got [3, 2]");
}

extern "C" int openblas_get_parallel(void);
extern "C" char* openblas_get_corename(void);

TEST_CASE("the BLAS is OpenBLAS's OpenMP build (OpenMP is the only thread pool)") {
  CHECK(openblas_get_parallel() == 2);  // 0 sequential, 1 pthreads, 2 OpenMP
  MESSAGE("OpenBLAS core: " << std::string(openblas_get_corename()));
}

TEST_CASE("gemm hands OpenBLAS no product when its kernels are narrower than the level or older than the CPU") {
  CHECK(blas_vector_bits("SkylakeX") == 512);
  CHECK(blas_vector_bits("SAPPHIRERAPIDS") == 512);
  CHECK(blas_vector_bits("Haswell") == 256);
  CHECK(blas_vector_bits("Zen") == 256);
  CHECK(blas_vector_bits("Prescott") == 128);
  CHECK(blas_vector_bits("a core from the future") == 128);
  const bool avx2_cpu = true;
  CHECK(blas_serves("SkylakeX", SimdLevel::avx512, avx2_cpu));
  CHECK(!blas_serves("Haswell", SimdLevel::avx512, avx2_cpu));  // half as wide as the level
  CHECK(!blas_serves("Haswell", SimdLevel::emulated16, avx2_cpu));
  CHECK(blas_serves("Haswell", SimdLevel::avx2, avx2_cpu));
  CHECK(blas_serves("Zen", SimdLevel::sse2, avx2_cpu));
  for (SimdLevel level : {SimdLevel::sse2, SimdLevel::avx2, SimdLevel::avx512})  // SSE3 kernels on an AVX2 CPU
    CHECK(!blas_serves("Prescott", level, avx2_cpu));
  CHECK(blas_serves("Prescott", SimdLevel::sse2, false));  // the right kernels for an SSE-only CPU
  // On this machine: where the BLAS does not serve the level, gemm's products are packed_gemm's,
  // bit for bit, also the forms it would otherwise give the BLAS (X^T dY; 256 columns at beta 1).
  MESSAGE(fmt::format("OpenBLAS core {} {} level {}", blas_core_name(),
                      blas_serves(simd_level()) ? "serves" : "does not serve", simd_level_name(simd_level())));
  if (!blas_serves(simd_level())) {
    CHECK(contains(blas_mismatch_warning(), blas_core_name()));
    const std::size_t M = 96, N = 256, K = 80;
    auto a = test::random_vector<float>(M * K, 1), b = test::random_vector<float>(K * N, 2);
    for (bool transpose_a : {true, false}) {
      std::vector<float> c(M * N, 0.5f), packed = c;
      kernels::gemm<float>(transpose_a, false, M, N, K, 1.0f, a.data(), transpose_a ? M : K, b.data(), N, 1.0f, c.data(), N);
      kernels::packed_gemm<float>(transpose_a, false, M, N, K, 1.0f, a.data(), transpose_a ? M : K, b.data(), N, 1.0f,
                                  packed.data(), N);
      CHECK(c == packed);
    }
  }
}
