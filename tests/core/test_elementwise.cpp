// The elementwise ops: their formulas, large magnitudes, and gradients by central differences.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "core/ops.h"
#include "support/checks.h"

using namespace tapegrad;
using test::contains;
using test::error_of;

TEST_CASE("elementwise ops match their formulas") {
  Tensor a = test::random_tensor({3, 5}, 1), b = test::random_tensor({3, 5}, 2), bias = test::random_tensor({5}, 3);
  Tensor s = add(Var(a), Var(b)).value(), p = mul(Var(a), Var(b)).value(), k = scale(Var(a), -2.5f).value();
  Tensor ab = add_bias(Var(a), Var(bias)).value(), si = silu(Var(a)).value(), sw = swiglu(Var(a), Var(b)).value();
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(s[i] == a[i] + b[i]);
    CHECK(p[i] == a[i] * b[i]);
    CHECK(k[i] == -2.5f * a[i]);
    CHECK(ab[i] == a[i] + bias[i % 5]);
    double silu_ref = a[i] / (1 + std::exp(-double(a[i])));
    CHECK(si[i] == doctest::Approx(silu_ref).epsilon(1e-6));
    CHECK(sw[i] == doctest::Approx(silu_ref * b[i]).epsilon(1e-6));
  }
  double total = 0;
  for (std::size_t i = 0; i < a.size(); ++i) total += a[i];
  CHECK(sum(Var(a)).value().item() == doctest::Approx(total).epsilon(1e-6));
  CHECK(mean(Var(a)).value().item() == doctest::Approx(total / 15).epsilon(1e-6));
  CHECK(reshape(Var(a), {5, 3}).shape() == Shape{5, 3});
}

TEST_CASE("silu and swiglu handle large magnitudes without overflow") {
  Tensor x({4}, {-100.0f, -20.0f, 20.0f, 100.0f});
  Tensor y = silu(Var(x)).value();
  CHECK(y[0] == doctest::Approx(0.0).epsilon(1e-6).scale(1));
  CHECK(y[3] == 100.0f);
  for (std::size_t i = 0; i < 4; ++i) CHECK(std::isfinite(y[i]));
}

TEST_CASE("elementwise kernels match central differences in double") {
  const std::size_t n = 37;  // not a multiple of any SIMD width: exercises the padded last vectors
  auto a = test::random_vector<double>(n, 1, 2.0), b = test::random_vector<double>(n, 2), R = test::random_vector<double>(n, 3);
  std::vector<double> da(n), db(n), da_written(n, std::numeric_limits<double>::quiet_NaN()), db_written = da_written;
  kernels::swiglu_backward<double>(da.data(), db.data(), R.data(), a.data(), b.data(), n, false);
  kernels::swiglu_backward<double>(da_written.data(), db_written.data(), R.data(), a.data(), b.data(), n, true);
  CHECK(da_written == da);  // overwrite writes every element, as adding to zeros would
  CHECK(db_written == db);
  auto sw = [&] {
    std::vector<double> y(n);
    kernels::swiglu_forward<double>(y.data(), a.data(), b.data(), n);
    return y;
  };
  test::check_double("swiglu da", a, sw, R, da);
  test::check_double("swiglu db", b, sw, R, db);

  std::vector<double> dsilu(n);
  kernels::silu_backward<double>(dsilu.data(), R.data(), a.data(), n);
  test::check_double("silu", a, [&] {
    std::vector<double> y(n);
    kernels::silu_forward<double>(y.data(), a.data(), n);
    return y;
  }, R, dsilu);

  std::vector<double> dma(n), dmb(n);
  kernels::mul_backward<double>(dma.data(), dmb.data(), R.data(), a.data(), b.data(), n);
  auto mulf = [&] {
    std::vector<double> y(n);
    kernels::mul_forward<double>(y.data(), a.data(), b.data(), n);
    return y;
  };
  test::check_double("mul da", a, mulf, R, dma);
  test::check_double("mul db", b, mulf, R, dmb);

  const std::size_t rows = 4, cols = 5;
  auto x = test::random_vector<double>(rows * cols, 4), bias = test::random_vector<double>(cols, 5);
  auto Rb = test::random_vector<double>(rows * cols, 6);
  std::vector<double> dx(rows * cols), dbias(cols);
  kernels::add_bias_backward<double>(dx.data(), dbias.data(), Rb.data(), rows, cols);
  auto biasf = [&] {
    std::vector<double> y(rows * cols);
    kernels::add_bias_forward<double>(y.data(), x.data(), bias.data(), rows, cols);
    return y;
  };
  test::check_double("add_bias dx", x, biasf, Rb, dx);
  test::check_double("add_bias dbias", bias, biasf, Rb, dbias);
}

TEST_CASE("elementwise ops pass gradcheck, broadcasts included") {
  auto a = test::random_tensor({2, 3, 4}, 1), b = test::random_tensor({2, 3, 4}, 2);
  test::check_float_op("add", [](const std::vector<Var>& v) { return add(v[0], v[1]); }, {a, b});
  test::check_float_op("mul", [](const std::vector<Var>& v) { return mul(v[0], v[1]); }, {a, b});
  test::check_float_op("scale", [](const std::vector<Var>& v) { return scale(v[0], 0.7f); }, {a});
  test::check_float_op("add_bias", [](const std::vector<Var>& v) { return add_bias(v[0], v[1]); },
                       {a, test::random_tensor({4}, 3)});
  test::check_float_op("silu", [](const std::vector<Var>& v) { return silu(v[0]); }, {a});
  test::check_float_op("swiglu", [](const std::vector<Var>& v) { return swiglu(v[0], v[1]); }, {a, b});
  test::check_float_op("sum", [](const std::vector<Var>& v) { return sum(v[0]); }, {a});
  test::check_float_op("mean", [](const std::vector<Var>& v) { return mean(v[0]); }, {a});
  test::check_float_op("reshape", [](const std::vector<Var>& v) { return mul(reshape(v[0], {6, 4}), v[1]); },
                       {a, test::random_tensor({6, 4}, 4)});
}

TEST_CASE("elementwise ops name the shapes that disagree") {
  CHECK(error_of([] { add(Var(Tensor({2, 3})), Var(Tensor({3, 2}))); }) ==
        "add: cannot broadcast a [2, 3] with b [3, 2] (axis 0 has sizes 2 and 3)");
  CHECK(error_of([] { mul(Var(Tensor({2})), Var(Tensor({3}))); }) ==
        "mul: cannot broadcast a [2] with b [3] (axis 0 has sizes 2 and 3)");
  CHECK(error_of([] { add_bias(Var(Tensor({2, 3})), Var(Tensor({2}))); }) ==
        "add_bias: expected bias to be [3], got [2]");
  CHECK(error_of([] { swiglu(Var(Tensor({2, 3})), Var(Tensor({2, 4}))); }) ==
        "swiglu: expected b to be [2, 3], got [2, 4]");
}
