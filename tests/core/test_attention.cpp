#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "core/ops.h"
#include "support/checks.h"

using namespace tapegrad;

namespace {
// Plain triple loop: scores with -inf above the diagonal, softmax, weighted sum; per head.
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::size_t B, std::size_t T,
                                    std::size_t H) {
  std::size_t D = q.shape()[2], Dh = D / H;
  std::vector<double> out(B * T * D);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        std::vector<double> s(T);
        double m = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < T; ++j) {
          double dot = 0;
          for (std::size_t d = 0; d < Dh; ++d) dot += double(q[(b * T + i) * D + h * Dh + d]) * k[(b * T + j) * D + h * Dh + d];
          s[j] = j <= i ? dot / std::sqrt(double(Dh)) : -std::numeric_limits<double>::infinity();
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - m));
        for (std::size_t d = 0; d < Dh; ++d) {
          double acc = 0;
          for (std::size_t j = 0; j < T; ++j) acc += s[j] / z * v[(b * T + j) * D + h * Dh + d];
          out[(b * T + i) * D + h * Dh + d] = acc;
        }
      }
  return out;
}
}  // namespace

TEST_CASE("attention matches a plain triple loop with a -inf causal mask") {
  // T = 70 crosses the 64-row block boundary of the kernel.
  for (auto [B, T, H, Dh] : {std::tuple{1, 1, 1, 2}, {2, 5, 1, 4}, {2, 7, 4, 2}, {1, 70, 2, 8}}) {
    std::size_t D = H * Dh;
    Tensor q = test::random_tensor({std::size_t(B), std::size_t(T), D}, 1);
    Tensor k = test::random_tensor({std::size_t(B), std::size_t(T), D}, 2);
    Tensor v = test::random_tensor({std::size_t(B), std::size_t(T), D}, 3);
    Tensor out = attention(Var(q), Var(k), Var(v), H).value();
    auto ref = naive_attention(q, k, v, B, T, H);
    for (std::size_t i = 0; i < ref.size(); ++i) REQUIRE(out[i] == doctest::Approx(ref[i]).epsilon(1e-4).scale(1));
  }
}

TEST_CASE("attention with a query offset (the KV-cache form) equals the matching rows of the full pass") {
  const std::size_t T = 9, H = 2, Dh = 4, D = H * Dh, start = 6;
  auto q = test::random_vector<float>(T * D, 1), k = test::random_vector<float>(T * D, 2), v = test::random_vector<float>(T * D, 3);
  std::vector<float> full(T * D), probs(H * T * T);
  kernels::attention_forward<float>(full.data(), probs.data(), q.data(), k.data(), v.data(), {1, T, T, H, Dh, 0});
  std::vector<float> tail((T - start) * D), tail_probs(H * (T - start) * T);
  kernels::attention_forward<float>(tail.data(), tail_probs.data(), q.data() + start * D, k.data(), v.data(),
                                    {1, T - start, T, H, Dh, start});
  for (std::size_t i = 0; i < tail.size(); ++i) CHECK(tail[i] == full[start * D + i]);
}

// T = 67 crosses the kernel's 64-row query block: dq, dk and dv of rows on both sides are checked.
TEST_CASE("attention backward matches central differences in double and in float") {
  for (auto [B, T, H, Dh] : {std::tuple{1, 1, 1, 2}, {2, 4, 2, 2}, {1, 67, 1, 2}}) {
    kernels::AttentionShape s{std::size_t(B), std::size_t(T), std::size_t(T), std::size_t(H), std::size_t(Dh), 0};
    std::size_t n = B * T * H * Dh;
    auto q = test::random_vector<double>(n, 1), k = test::random_vector<double>(n, 2), v = test::random_vector<double>(n, 3);
    auto R = test::random_vector<double>(n, 4);
    std::vector<double> probs(B * H * T * T), out(n), dq(n), dk(n), dv(n);
    kernels::attention_forward<double>(out.data(), probs.data(), q.data(), k.data(), v.data(), s);
    kernels::attention_backward<double>(dq.data(), dk.data(), dv.data(), R.data(), probs.data(), q.data(), k.data(),
                                        v.data(), s);
    auto forward = [&] {
      std::vector<double> y(n), p(B * H * T * T);
      kernels::attention_forward<double>(y.data(), p.data(), q.data(), k.data(), v.data(), s);
      return y;
    };
    test::check_double("attention dq", q, forward, R, dq);
    test::check_double("attention dk", k, forward, R, dk);
    test::check_double("attention dv", v, forward, R, dv);
  }
  test::check_float_op("attention", [](const std::vector<Var>& v) { return attention(v[0], v[1], v[2], 2); },
                       {test::random_tensor({2, 3, 4}, 5), test::random_tensor({2, 3, 4}, 6),
                        test::random_tensor({2, 3, 4}, 7)});
}

TEST_CASE("attention names the shapes it was given") {
  CHECK(test::error_of([] { attention(Var(Tensor({1, 2, 6})), Var(Tensor({1, 2, 6})), Var(Tensor({1, 2, 6})), 4); }) ==
        "attention: expected q (B, T, H*Dh) with 4 heads, got [1, 2, 6]");
  CHECK(test::error_of([] { attention(Var(Tensor({1, 2, 8})), Var(Tensor({1, 3, 8})), Var(Tensor({1, 2, 8})), 4); }) ==
        "attention: expected k to be [1, 2, 8], got [1, 3, 8]");
}
