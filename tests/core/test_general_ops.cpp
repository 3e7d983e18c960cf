// The general primitives: each forward against a naive reference written here,
// each gradient by central differences (test::check_float_op: float ops, eps 1e-2, atol 2e-3 +
// rtol 2e-3, see support/checks.h), the usual broadcast cases, and error messages
// naming the op and the shapes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "core/ops.h"
#include "core/random.h"
#include "support/checks.h"

using namespace tapegrad;
using test::contains;
using test::error_of;

namespace {

// Element flat of out's shape read from t under numpy broadcasting (the naive reference).
float broadcast_at(const Tensor& t, const Shape& out, std::size_t flat) {
  std::vector<std::size_t> index(out.size());
  for (std::size_t i = out.size(); i-- > 0;) {
    index[i] = flat % out[i];
    flat /= out[i];
  }
  std::size_t offset = 0, lead = out.size() - t.rank();
  for (std::size_t i = 0; i < t.rank(); ++i) offset = offset * t.shape()[i] + (t.shape()[i] == 1 ? 0 : index[lead + i]);
  return t[offset];
}

// Values away from the kinks of relu, abs and maximum (|x| >= 0.1), so that central differences
// with eps 1e-2 never straddle one.
Tensor away_from_zero(Shape shape, std::uint64_t seed) {
  Tensor t = test::random_tensor(std::move(shape), seed);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] += t[i] >= 0 ? 0.1f : -0.1f;
  return t;
}

Tensor positive(Shape shape, std::uint64_t seed) {  // in [0.5, 2)
  Tensor t(std::move(shape));
  Rng rng(seed);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.5f + 1.5f * rng.uniform();
  return t;
}


}  // namespace

TEST_CASE("unary ops match their formulas and their gradients match central differences") {
  struct Case {
    const char* name;
    std::function<Var(const Var&)> op;
    std::function<double(double)> ref;
    bool positive_only;
  };
  const double pi = 3.14159265358979323846;
  std::vector<Case> cases = {
      {"neg", [](const Var& x) { return neg(x); }, [](double v) { return -v; }, false},
      {"exp", [](const Var& x) { return exp(x); }, [](double v) { return std::exp(v); }, false},
      {"log", [](const Var& x) { return log(x); }, [](double v) { return std::log(v); }, true},
      {"sqrt", [](const Var& x) { return sqrt(x); }, [](double v) { return std::sqrt(v); }, true},
      {"rsqrt", [](const Var& x) { return rsqrt(x); }, [](double v) { return 1 / std::sqrt(v); }, true},
      {"abs", [](const Var& x) { return abs(x); }, [](double v) { return std::fabs(v); }, false},
      {"tanh", [](const Var& x) { return tanh(x); }, [](double v) { return std::tanh(v); }, false},
      {"sigmoid", [](const Var& x) { return sigmoid(x); }, [](double v) { return 1 / (1 + std::exp(-v)); }, false},
      {"relu", [](const Var& x) { return relu(x); }, [](double v) { return v > 0 ? v : 0; }, false},
      {"gelu", [](const Var& x) { return gelu(x); }, [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }, false},
      {"gelu_tanh", [](const Var& x) { return gelu(x, true); },
       [pi](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / pi) * (v + 0.044715 * v * v * v))); }, false},
      {"silu", [](const Var& x) { return silu(x); }, [](double v) { return v / (1 + std::exp(-v)); }, false},
      {"pow", [](const Var& x) { return pow(x, 2.5f); }, [](double v) { return std::pow(v, 2.5); }, true},
      {"square", [](const Var& x) { return square(x); }, [](double v) { return v * v; }, false},
      {"add scalar", [](const Var& x) { return x + 1.5f; }, [](double v) { return v + 1.5; }, false},
      {"scalar sub", [](const Var& x) { return 1.5f - x; }, [](double v) { return 1.5 - v; }, false},
      {"mul scalar", [](const Var& x) { return 3.0f * x; }, [](double v) { return 3 * v; }, false},
      {"div scalar", [](const Var& x) { return x / 4.0f; }, [](double v) { return v / 4; }, false},
      {"scalar div", [](const Var& x) { return 2.0f / x; }, [](double v) { return 2 / v; }, true},
      {"maximum scalar", [](const Var& x) { return maximum(x, 0.25f); }, [](double v) { return std::max(v, 0.25); }, false},
      {"unary minus", [](const Var& x) { return -x; }, [](double v) { return -v; }, false},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    Tensor x = c.positive_only ? positive({3, 5}, 11) : away_from_zero({3, 5}, 11);
    if (std::string(c.name) == "maximum scalar")
      for (std::size_t i = 0; i < x.size(); ++i)
        if (std::fabs(x[i] - 0.25f) < 0.05f) x[i] += 0.1f;
    Tensor y = c.op(Var(x)).value();
    REQUIRE(y.shape() == x.shape());
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(y[i] == doctest::Approx(c.ref(x[i])).epsilon(1e-5));
    test::check_float_op(c.name, [&](const std::vector<Var>& v) { return c.op(v[0]); }, {x});
  }
}

TEST_CASE("binary ops broadcast like numpy: values and gradients") {
  struct Case {
    Shape a, b, out;
  };
  // scalar vs tensor, (1, C) vs (N, C), (B, 1, T) vs (B, H, T), a size-1 axis on both sides,
  // a missing leading axis.
  std::vector<Case> shapes = {{{}, {3, 4}, {3, 4}},          {{3, 4}, {}, {3, 4}},
                              {{1, 4}, {3, 4}, {3, 4}},      {{2, 1, 5}, {2, 3, 5}, {2, 3, 5}},
                              {{3, 1}, {1, 4}, {3, 4}},      {{4}, {2, 3, 4}, {2, 3, 4}},
                              {{2, 3}, {2, 3}, {2, 3}}};
  struct Op2 {
    const char* name;
    std::function<Var(const Var&, const Var&)> op;
    std::function<double(double, double)> ref;
  };
  std::vector<Op2> ops = {
      {"add", [](const Var& a, const Var& b) { return a + b; }, [](double u, double v) { return u + v; }},
      {"sub", [](const Var& a, const Var& b) { return a - b; }, [](double u, double v) { return u - v; }},
      {"mul", [](const Var& a, const Var& b) { return a * b; }, [](double u, double v) { return u * v; }},
      {"div", [](const Var& a, const Var& b) { return a / b; }, [](double u, double v) { return u / v; }},
      {"maximum", [](const Var& a, const Var& b) { return maximum(a, b); }, [](double u, double v) { return std::max(u, v); }},
  };
  for (const auto& s : shapes)
    for (const auto& o : ops) {
      CAPTURE(o.name);
      CAPTURE(to_string(s.a));
      CAPTURE(to_string(s.b));
      // a in about +-1.1, b in [0.5, 2) (away from div's pole); for maximum, a's values are
      // kept 0.1 from b's by construction (a = b + offset would need equal shapes, so shift).
      Tensor a = away_from_zero(s.a, 21), b = positive(s.b, 22);
      if (std::string(o.name) == "maximum")
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = a[i] > 0 ? 2.2f + a[i] : a[i];  // > 2 or < 0: never ties b
      Tensor y = o.op(Var(a), Var(b)).value();
      REQUIRE(y.shape() == s.out);
      for (std::size_t i = 0; i < y.size(); ++i)
        CHECK(y[i] == doctest::Approx(o.ref(broadcast_at(a, s.out, i), broadcast_at(b, s.out, i))).epsilon(1e-6));
      test::check_float_op(o.name, [&](const std::vector<Var>& v) { return o.op(v[0], v[1]); }, {a, b});
    }
}

TEST_CASE("add of a tensor repeated over rows (the bias kernels) equals the general broadcast to the bit") {
  // a + b against a - (-b), which takes the general broadcasting path: negation and the sum are
  // exact, so values and both gradients must agree bit for bit, with threads on the column sums.
  for (auto [a_shape, b_shape] : {std::pair{Shape{4, 600, 24}, Shape{600, 24}}, std::pair{Shape{2048, 40}, Shape{1, 40}},
                                  std::pair{Shape{3, 5}, Shape{}}}) {
    CAPTURE(to_string(a_shape));
    CAPTURE(to_string(b_shape));
    Tensor a = test::random_tensor(a_shape, 31), b = test::random_tensor(b_shape, 32);
    Tensor weights = test::random_tensor(a_shape, 33);
    auto run = [&](bool fast) {
      Var va(a, true), vb(b, true);
      Tape tape;
      Var y = fast ? va + vb : va - neg(vb);
      tape.backward(sum(y * Var(weights)));
      return std::tuple{y.value(), va.grad(), vb.grad()};
    };
    auto [y_fast, da_fast, db_fast] = run(true);
    auto [y_general, da_general, db_general] = run(false);
    auto same_bits = [](const Tensor& x, const Tensor& y) {
      return x.shape() == y.shape() && std::memcmp(x.data(), y.data(), x.bytes()) == 0;
    };
    CHECK(same_bits(y_fast, y_general));
    CHECK(same_bits(da_fast, da_general));
    CHECK(same_bits(db_fast, db_general));
  }
}

TEST_CASE("shapes that cannot broadcast are errors naming the op and both shapes") {
  Var a(Tensor({2, 3})), b(Tensor({4, 3}));
  CHECK(contains(error_of([&] { add(a, b); }), "add: cannot broadcast a [2, 3] with b [4, 3]"));
  CHECK(contains(error_of([&] { sub(a, b); }), "sub: cannot broadcast a [2, 3] with b [4, 3]"));
  CHECK(contains(error_of([&] { mul(a, Var(Tensor({3, 2}))); }), "mul: cannot broadcast a [2, 3] with b [3, 2]"));
  CHECK(contains(error_of([&] { div(a, b); }), "div: cannot broadcast a [2, 3] with b [4, 3]"));
  CHECK(contains(error_of([&] { maximum(a, b); }), "maximum: cannot broadcast a [2, 3] with b [4, 3]"));
  CHECK(contains(error_of([&] { expand(a, {3, 3}); }), "expand: x [2, 3] cannot be broadcast to [3, 3]"));
}

TEST_CASE("sum_to undoes a broadcast: the one reduction every broadcasting backward uses") {
  Tensor g = test::random_tensor({2, 3, 4}, 5);
  Tensor r = sum_to(g, {3, 1});
  REQUIRE(r.shape() == Shape{3, 1});
  for (std::size_t j = 0; j < 3; ++j) {
    double total = 0;
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t k = 0; k < 4; ++k) total += g.at({i, j, k});
    CHECK(r[j] == doctest::Approx(total).epsilon(1e-6));
  }
  CHECK(sum_to(g, {}).item() == doctest::Approx(sum(Var(g)).value().item()).epsilon(1e-6));
  CHECK(contains(error_of([&] { sum_to(g, {5}); }), "sum_to: [5] does not broadcast to [2, 3, 4]"));
}

TEST_CASE("reductions over an axis with keepdim match loops, and their gradients check") {
  // Distinct values 0.1 apart (a shuffled ramp): no two within the finite-difference step of
  // each other, so max's choice never flips during the check.
  Tensor x({2, 3, 4});
  Rng rng(31);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * float(i) - 1.2f;
  for (std::size_t i = x.size(); i-- > 1;) std::swap(x[i], x[rng.below(i + 1)]);
  for (int axis : {0, 1, 2, -1}) {
    CAPTURE(axis);
    std::size_t a = axis < 0 ? 2 : std::size_t(axis);
    for (bool keepdim : {false, true}) {
      Tensor s = sum(Var(x), axis, keepdim).value(), m = mean(Var(x), axis, keepdim).value(),
             mx = max(Var(x), axis, keepdim).value();
      Shape expected = x.shape();
      if (keepdim)
        expected[a] = 1;
      else
        expected.erase(expected.begin() + std::ptrdiff_t(a));
      REQUIRE(s.shape() == expected);
      REQUIRE(mx.shape() == expected);
      std::size_t out = 0;
      for (std::size_t i = 0; i < 2; ++i)
        for (std::size_t j = 0; j < 3; ++j)
          for (std::size_t k = 0; k < 4; ++k) {
            std::size_t idx[3] = {i, j, k};
            if (idx[a] != 0) continue;
            double total = 0, best = -1e30;
            for (std::size_t t = 0; t < x.shape()[a]; ++t) {
              idx[a] = t;
              float v = x.at({idx[0], idx[1], idx[2]});
              total += v;
              best = std::max(best, double(v));
            }
            CHECK(s[out] == doctest::Approx(total).epsilon(1e-6));
            CHECK(m[out] == doctest::Approx(total / double(x.shape()[a])).epsilon(1e-6));
            CHECK(mx[out] == float(best));
            ++out;
          }
      test::check_float_op("sum", [&](const std::vector<Var>& v) { return sum(v[0], axis, keepdim); }, {x});
      test::check_float_op("mean", [&](const std::vector<Var>& v) { return mean(v[0], axis, keepdim); }, {x});
      test::check_float_op("max", [&](const std::vector<Var>& v) { return max(v[0], axis, keepdim); }, {x});
    }
  }
  CHECK(max(Var(x)).value().item() == *std::max_element(x.data(), x.data() + x.size()));
  test::check_float_op("max (whole)", [](const std::vector<Var>& v) { return max(v[0]); }, {x});
  test::check_float_op("mean (whole)", [](const std::vector<Var>& v) { return mean(v[0]); }, {x});
  CHECK(contains(error_of([&] { sum(Var(x), 3); }), "sum: axis 3 is out of range for x [2, 3, 4]"));
  CHECK(contains(error_of([&] { max(Var(x), -4); }), "max: axis -4 is out of range for x [2, 3, 4]"));
}

TEST_CASE("views: reshape, permute, transpose, slice, cat and split") {
  Tensor x = test::random_tensor({2, 3, 4}, 41);
  SUBCASE("reshape and view") {
    CHECK(view(Var(x), {-1, 4}).shape() == Shape{6, 4});
    CHECK(contains(error_of([&] { reshape(Var(x), {5, 5}); }), "reshape: x [2, 3, 4] has 24 elements, which do not fill [5, 5]"));
    test::check_float_op("reshape", [](const std::vector<Var>& v) { return reshape(v[0], {4, 6}); }, {x});
  }
  SUBCASE("permute and transpose") {
    Tensor p = permute(Var(x), {2, 0, 1}).value();
    REQUIRE(p.shape() == Shape{4, 2, 3});
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t j = 0; j < 3; ++j)
        for (std::size_t k = 0; k < 4; ++k) CHECK(p.at({k, i, j}) == x.at({i, j, k}));
    Tensor t = transpose(Var(x), 0, -1).value();
    REQUIRE(t.shape() == Shape{4, 3, 2});
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t j = 0; j < 3; ++j)
        for (std::size_t k = 0; k < 4; ++k) CHECK(t.at({k, j, i}) == x.at({i, j, k}));
    test::check_float_op("permute", [](const std::vector<Var>& v) { return permute(v[0], {1, 2, 0}); }, {x});
    test::check_float_op("transpose", [](const std::vector<Var>& v) { return transpose(v[0], 1, 2); }, {x});
    CHECK(contains(error_of([&] { permute(Var(x), {0, 0, 1}); }), "permute: dims [0, 0, 1] are not a permutation of the axes of x [2, 3, 4]"));
    CHECK(contains(error_of([&] { permute(Var(x), {0, 1}); }), "permute: dims [0, 1] are not a permutation"));
  }
  SUBCASE("slice, cat and split") {
    Tensor s = slice(Var(x), 1, 1, 3).value();
    REQUIRE(s.shape() == Shape{2, 2, 4});
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t j = 0; j < 2; ++j)
        for (std::size_t k = 0; k < 4; ++k) CHECK(s.at({i, j, k}) == x.at({i, j + 1, k}));
    test::check_float_op("slice", [](const std::vector<Var>& v) { return slice(v[0], -1, 1, 3); }, {x});
    CHECK(contains(error_of([&] { slice(Var(x), 1, 2, 4); }), "slice: [2, 4) is not within axis 1 of x [2, 3, 4] (size 3)"));

    Tensor y = test::random_tensor({2, 1, 4}, 42);
    Tensor c = cat({Var(x), Var(y)}, 1).value();
    REQUIRE(c.shape() == Shape{2, 4, 4});
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t k = 0; k < 4; ++k) {
        for (std::size_t j = 0; j < 3; ++j) CHECK(c.at({i, j, k}) == x.at({i, j, k}));
        CHECK(c.at({i, 3, k}) == y.at({i, 0, k}));
      }
    test::check_float_op("cat", [](const std::vector<Var>& v) { return concat({v[0], v[1], v[0]}, 1); }, {x, y});
    CHECK(contains(error_of([&] { cat({Var(x), Var(y)}, 2); }),
                   "cat: tensor 1 has shape [2, 1, 4], which does not match tensor 0's [2, 3, 4] except along axis 2"));

    std::vector<Var> parts = split(Var(x), 3, -1);
    REQUIRE(parts.size() == 2);
    CHECK(parts[0].shape() == Shape{2, 3, 3});
    CHECK(parts[1].shape() == Shape{2, 3, 1});
    CHECK(max_abs_diff(cat(parts, -1).value(), x) == 0.0f);
    test::check_float_op("split", [](const std::vector<Var>& v) {
      auto p = split(v[0], {1, 2}, 1);
      return mul(p[0], sum(p[1], 1, true));
    }, {x});
    CHECK(contains(error_of([&] { split(Var(x), {1, 1}, 1); }), "split: sizes [1, 1] add up to 2, but axis 1 of x [2, 3, 4] has size 3"));
  }
}

TEST_CASE("matmul broadcasts its leading axes like torch.matmul") {
  Tensor a = test::random_tensor({2, 1, 3, 4}, 51), b = test::random_tensor({5, 4, 2}, 52);
  Tensor y = matmul(Var(a), Var(b)).value();
  REQUIRE(y.shape() == Shape{2, 5, 3, 2});
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 5; ++j)
      for (std::size_t m = 0; m < 3; ++m)
        for (std::size_t n = 0; n < 2; ++n) {
          double total = 0;
          for (std::size_t k = 0; k < 4; ++k) total += double(a.at({i, 0, m, k})) * b.at({j, k, n});
          CHECK(y.at({i, j, m, n}) == doctest::Approx(total).epsilon(1e-5));
        }
  test::check_float_op("matmul (broadcast)", [](const std::vector<Var>& v) { return matmul(v[0], v[1]); }, {a, b});
  test::check_float_op("matmul (broadcast, b transposed)",
                       [](const std::vector<Var>& v) { return matmul(v[0], v[1], false, true); },
                       {test::random_tensor({3, 2, 4}, 53), test::random_tensor({1, 5, 4}, 54)});
  CHECK(contains(error_of([&] { matmul(Var(Tensor({2, 3, 4})), Var(Tensor({3, 4, 2}))); }),
                 "matmul: the leading (batch) axes do not broadcast; a is [2, 3, 4], b is [3, 4, 2]"));
}

TEST_CASE("softmax and log_softmax over any axis") {
  Tensor x = test::random_tensor({3, 4, 2}, 61, 2.0f);
  for (int axis : {0, 1, -1}) {
    CAPTURE(axis);
    std::size_t a = axis < 0 ? 2 : std::size_t(axis);
    Tensor s = softmax(Var(x), axis).value(), l = log_softmax(Var(x), axis).value();
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 4; ++j)
        for (std::size_t k = 0; k < 2; ++k) {
          std::size_t idx[3] = {i, j, k};
          double total = 0;
          for (std::size_t t = 0; t < x.shape()[a]; ++t) {
            std::size_t jdx[3] = {i, j, k};
            jdx[a] = t;
            total += std::exp(double(x.at({jdx[0], jdx[1], jdx[2]})));
          }
          double v = x.at({idx[0], idx[1], idx[2]});
          CHECK(s.at({i, j, k}) == doctest::Approx(std::exp(v) / total).epsilon(1e-5));
          CHECK(l.at({i, j, k}) == doctest::Approx(v - std::log(total)).epsilon(1e-5));
        }
    test::check_float_op("softmax", [&](const std::vector<Var>& v) { return softmax(v[0], axis); }, {x});
    test::check_float_op("log_softmax", [&](const std::vector<Var>& v) { return log_softmax(v[0], axis); }, {x});
  }
  CHECK(contains(error_of([&] { softmax(Var(x), 3); }), "softmax: axis 3 is out of range for x [3, 4, 2]"));
}

TEST_CASE("layer_norm normalises the last axis with the biased variance") {
  Tensor x = test::random_tensor({2, 3, 8}, 71, 2.0f), w = test::random_tensor({8}, 72), b = test::random_tensor({8}, 73);
  Tensor y = layer_norm(Var(x), Var(w), Var(b)).value();
  for (std::size_t r = 0; r < 6; ++r) {
    double m = 0, v = 0;
    for (std::size_t j = 0; j < 8; ++j) m += x[r * 8 + j];
    m /= 8;
    for (std::size_t j = 0; j < 8; ++j) v += (x[r * 8 + j] - m) * (x[r * 8 + j] - m);
    v /= 8;
    for (std::size_t j = 0; j < 8; ++j)
      CHECK(y[r * 8 + j] == doctest::Approx((x[r * 8 + j] - m) / std::sqrt(v + 1e-5) * w[j] + b[j]).epsilon(1e-4));
  }
  test::check_float_op("layer_norm", [](const std::vector<Var>& v) { return layer_norm(v[0], v[1], v[2]); }, {x, w, b});
  CHECK(contains(error_of([&] { layer_norm(Var(x), Var(Tensor({4})), Var(b)); }),
                 "layer_norm: expected weight and bias [8] for x [2, 3, 8], got [4] and [8]"));
}

TEST_CASE("mse_loss and cross_entropy with an ignored target") {
  Tensor a = test::random_tensor({4, 3}, 81), b = test::random_tensor({4, 3}, 82);
  double total = 0;
  for (std::size_t i = 0; i < a.size(); ++i) total += double(a[i] - b[i]) * (a[i] - b[i]);
  CHECK(mse_loss(Var(a), Var(b)).value().item() == doctest::Approx(total / 12).epsilon(1e-6));
  test::check_float_op("mse_loss", [](const std::vector<Var>& v) { return mse_loss(v[0], v[1]); }, {a, b});
  CHECK(contains(error_of([&] { mse_loss(Var(a), Var(Tensor({3, 4}))); }), "mse_loss: a [4, 3] and b [3, 4] must have the same shape"));

  Tensor logits = test::random_tensor({5, 6}, 83);
  std::vector<std::int32_t> targets = {1, -100, 5, 0, -100};
  double loss = 0;
  for (std::size_t r = 0; r < 5; ++r) {
    if (targets[r] == -100) continue;
    double s = 0;
    for (std::size_t j = 0; j < 6; ++j) s += std::exp(double(logits[r * 6 + j]));
    loss += std::log(s) - logits[r * 6 + std::size_t(targets[r])];
  }
  CHECK(cross_entropy(Var(logits), targets, -100).value().item() == doctest::Approx(loss / 3).epsilon(1e-5));
  test::check_float_op("cross_entropy (ignore_index)",
                       [&](const std::vector<Var>& v) { return cross_entropy(v[0], targets, -100); }, {logits});
  std::vector<std::int32_t> none = {-100, -100, -100, -100, -100}, bad = {1, 2, 6, 0, 0};
  CHECK(contains(error_of([&] { cross_entropy(Var(logits), none, -100); }), "cross_entropy: every one of the 5 targets is ignore_index -100"));
  CHECK(contains(error_of([&] { cross_entropy(Var(logits), bad, -100); }), "cross_entropy: target 6 at row 2 is outside the vocabulary of size 6"));
}

TEST_CASE("dropout zeroes about p of the elements, scales the rest, and is the identity in eval") {
  Tensor x(Shape{10000}, 1.0f);
  Rng rng(7);
  Tensor y = dropout(Var(x), 0.25f, true, rng).value();
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (y[i] == 0) ++zeros;
    else CHECK(y[i] == doctest::Approx(1 / 0.75));
  }
  CHECK(zeros > 2300);
  CHECK(zeros < 2700);
  Rng same(7);
  CHECK(max_abs_diff(dropout(Var(x), 0.25f, true, same).value(), y) == 0.0f);  // the seed fixes the mask
  CHECK(max_abs_diff(dropout(Var(x), 0.25f, false, rng).value(), x) == 0.0f);
  Tensor z = test::random_tensor({3, 4}, 91);
  test::check_float_op("dropout", [](const std::vector<Var>& v) {
    Rng fixed(3);  // the same mask on every call
    return dropout(v[0], 0.5f, true, fixed);
  }, {z});
  CHECK(contains(error_of([&] { dropout(Var(x), 1.0f, true, rng); }), "dropout: p = 1 must be in [0, 1)"));
}

TEST_CASE("expand repeats size-1 and missing axes, and its gradient sums them back") {
  Tensor x = test::random_tensor({3, 1}, 101);
  Tensor y = expand(Var(x), {2, 3, 4}).value();
  REQUIRE(y.shape() == Shape{2, 3, 4});
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == broadcast_at(x, {2, 3, 4}, i));
  test::check_float_op("expand", [](const std::vector<Var>& v) { return expand(v[0], {2, 3, 4}); }, {x});
  test::check_float_op("view", [](const std::vector<Var>& v) { return view(v[0], {-1}); }, {x});
  CHECK(contains(error_of([&] { view(Var(x), {-1, -1}); }), "view: size -1 at position 1 is invalid"));
}

TEST_CASE("sigmoid, exp-based ops and softmax stay finite at large magnitudes") {
  Tensor x({4}, {-100.0f, -20.0f, 20.0f, 100.0f});
  Tensor s = sigmoid(Var(x)).value(), g = gelu(Var(x), true).value(), l = log_softmax(Var(x)).value();
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(std::isfinite(s[i]));
    CHECK(std::isfinite(g[i]));
    CHECK(std::isfinite(l[i]));
  }
  CHECK(s[0] == doctest::Approx(0.0).epsilon(1e-6).scale(1));
  CHECK(g[3] == 100.0f);
  CHECK(g[0] == doctest::Approx(0.0).epsilon(1e-6).scale(1));
}
