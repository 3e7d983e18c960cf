// rope: the rotation of interleaved pairs, its angle table, and its gradient by central differences.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "core/ops.h"
#include "support/checks.h"

using namespace tapegrad;

TEST_CASE("rope rotates interleaved pairs by m * 10000^(-2i/Dh) at position offset + t") {
  const std::size_t B = 2, T = 3, H = 2, Dh = 4, D = H * Dh, offset = 5;
  auto table = std::make_shared<kernels::RopeTable<float>>(kernels::make_rope_table<float>(16, Dh));
  Tensor x = test::random_tensor({B, T, D}, 1);
  Tensor y = rope(Var(x), table, H, offset).value();
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < Dh / 2; ++i) {
          double a = double(offset + t) * std::pow(10000.0, -2.0 * double(i) / double(Dh));
          std::size_t at = (b * T + t) * D + h * Dh + 2 * i;
          double x0 = x[at], x1 = x[at + 1];
          CHECK(y[at] == doctest::Approx(x0 * std::cos(a) - x1 * std::sin(a)).epsilon(1e-5));
          CHECK(y[at + 1] == doctest::Approx(x0 * std::sin(a) + x1 * std::cos(a)).epsilon(1e-5));
        }
  // Position 0 is the identity.
  Tensor y0 = rope(Var(x), table, H, 0).value();
  for (std::size_t j = 0; j < D; ++j) CHECK(y0[j] == x[j]);
}

TEST_CASE("the rope table rounds angles computed in double once") {
  auto table = kernels::make_rope_table<float>(300, 8);
  double a = 257.0 * std::pow(10000.0, -2.0 * 3 / 8.0);
  CHECK(table.cos[257 * 4 + 3] == float(std::cos(a)));
  CHECK(table.sin[257 * 4 + 3] == float(std::sin(a)));
}

TEST_CASE("rope backward matches central differences in double and in float") {
  const std::size_t B = 2, T = 3, H = 2, Dh = 4, D = H * Dh;
  auto table = kernels::make_rope_table<double>(8, Dh);
  auto x = test::random_vector<double>(B * T * D, 1), R = test::random_vector<double>(B * T * D, 2);
  std::vector<double> dx(x.size()), written(x.size(), std::numeric_limits<double>::quiet_NaN());
  kernels::rope_backward<double>(dx.data(), R.data(), table, B, T, H, Dh, 2, false);
  kernels::rope_backward<double>(written.data(), R.data(), table, B, T, H, Dh, 2, true);  // every element written
  CHECK(written == dx);
  test::check_double("rope", x, [&] {
    std::vector<double> y(x.size());
    kernels::rope_forward<double>(y.data(), x.data(), table, B, T, H, Dh, 2);
    return y;
  }, R, dx);
  auto ftable = std::make_shared<kernels::RopeTable<float>>(kernels::make_rope_table<float>(8, Dh));
  test::check_float_op("rope", [&](const std::vector<Var>& v) { return rope(v[0], ftable, H, 3); },
                       {test::random_tensor({B, T, D}, 3)});
}

TEST_CASE("rope refuses odd head sizes and positions beyond its table") {
  auto table = std::make_shared<kernels::RopeTable<float>>(kernels::make_rope_table<float>(4, 4));
  CHECK(test::contains(test::error_of([&] { rope(Var(Tensor({1, 2, 6})), table, 2); }), "2 heads of even size, got [1, 2, 6]"));
  CHECK(test::contains(test::error_of([&] { rope(Var(Tensor({1, 3, 8})), table, 2, 2); }),
                       "positions 2..5 with head size 4 do not fit a table of 4 positions"));
}
