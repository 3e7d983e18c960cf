// Elementwise ops: unary (silu among them), binary with numpy broadcasting (add_bias: a row
// added to every row), scalar forms (scale) and Var's operators.
// Each runs its SIMD kernel (core/kernel_list.h) over contiguous values; a broadcast input's
// gradient is reduced to its shape in one place (sum_to).
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "core/kernels.h"
#include "core/ops.h"

namespace tapegrad {

namespace {

// A unary op y = f(x) with dx += dy * g(x, y): both as plain functions of one element.
template <class F, class G>
Var unary(const char* name, const Var& x, F f, G g) {
  Op op(name, {x});
  const float* xv = x.value().data();
  Tensor y = Tensor::uninitialized(x.shape());
  float* yp = y.data();
  for (std::size_t i = 0, n = y.size(); i < n; ++i) yp[i] = f(xv[i]);
  return op.finish(std::move(y), [x, g](const Tensor& dy, const Tensor& yv) {
    float* dx = grad_ptr(x);
    if (!dx) return;
    const float *xp = x.value().data(), *yp = yv.data(), *d = dy.data();
    for (std::size_t i = 0, n = dy.size(); i < n; ++i) dx[i] += d[i] * g(xp[i], yp[i]);
  });
}

// A binary op y = f(a, b) broadcast, with partials da = ga(a, b, y), db = gb(a, b, y) per
// element; each input's gradient is reduced to its shape by accumulate_grad (sum_to).
template <class F, class GA, class GB>
Var binary(const char* name, const Var& a, const Var& b, F f, GA ga, GB gb) {
  Shape shape = broadcast_shapes(name, a.shape(), b.shape());
  Op op(name, {a, b});
  Tensor av = expand_to(a.value(), shape), bv = expand_to(b.value(), shape);
  Tensor y = Tensor::uninitialized(shape);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = f(av[i], bv[i]);
  return op.finish(std::move(y), [a, b, ga, gb, shape](const Tensor& dy, const Tensor& yv) {
    bool need_a = a.requires_grad(), need_b = b.requires_grad();
    Tensor ea = expand_to(a.value(), shape), eb = expand_to(b.value(), shape);
    if (need_a) {
      Tensor g = Tensor::uninitialized(shape);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = dy[i] * ga(ea[i], eb[i], yv[i]);
      accumulate_grad(a, g);
    }
    if (need_b) {
      Tensor g = Tensor::uninitialized(shape);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = dy[i] * gb(ea[i], eb[i], yv[i]);
      accumulate_grad(b, g);
    }
  });
}

float sigmoid_of(float x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }

}  // namespace

Var neg(const Var& x) {
  return unary("neg", x, [](float v) { return -v; }, [](float, float) { return -1.0f; });
}
// d e^x = e^x = y
Var exp(const Var& x) {
  return unary("exp", x, [](float v) { return std::exp(v); }, [](float, float y) { return y; });
}
// d ln x = 1 / x
Var log(const Var& x) {
  return unary("log", x, [](float v) { return std::log(v); }, [](float v, float) { return 1 / v; });
}
// d sqrt(x) = 1 / (2 y)
Var sqrt(const Var& x) {
  return unary("sqrt", x, [](float v) { return std::sqrt(v); }, [](float, float y) { return 0.5f / y; });
}
// d x^(-1/2) = -1/2 x^(-3/2) = -y^3 / 2
Var rsqrt(const Var& x) {
  return unary("rsqrt", x, [](float v) { return 1 / std::sqrt(v); }, [](float, float y) { return -0.5f * y * y * y; });
}
Var abs(const Var& x) {
  return unary("abs", x, [](float v) { return std::fabs(v); },
               [](float v, float) { return v > 0 ? 1.0f : v < 0 ? -1.0f : 0.0f; });
}
// d tanh = 1 - y^2
Var tanh(const Var& x) {
  return unary("tanh", x, [](float v) { return std::tanh(v); }, [](float, float y) { return 1 - y * y; });
}
// d sigmoid = y (1 - y)
Var sigmoid(const Var& x) {
  return unary("sigmoid", x, sigmoid_of, [](float, float y) { return y * (1 - y); });
}
Var relu(const Var& x) {
  return unary("relu", x, [](float v) { return v > 0 ? v : 0.0f; }, [](float v, float) { return v > 0 ? 1.0f : 0.0f; });
}
// exact: d x Phi(x) = Phi(x) + x phi(x). tanh form, with u = c (x + k x^3) and 0.5 (1 + tanh u) =
// sigmoid(2u) = s (one exp instead of a tanh): y = x s, dy/dx = s + 2 x s (1 - s) c (1 + 3 k x^2).
Var gelu(const Var& x, bool approximate_tanh) {
  constexpr double inv_sqrt2 = 0.7071067811865476, inv_sqrt_2pi = 0.3989422804014327;
  if (approximate_tanh) {
    // Not through unary(): the forward saves s (one exp per element in all, none in backward).
    Op op("gelu", {x});
    Tensor y = Tensor::uninitialized(x.shape()), sig = Tensor::uninitialized(x.shape());
    kernels::gelu_tanh_forward(y.data(), sig.data(), x.value().data(), y.size());
    std::size_t bytes = op.recording() ? sig.bytes() : 0;
    return op.finish(std::move(y), [x, sig = std::move(sig)](const Tensor& dy, const Tensor&) {
      if (GradTarget dx = grad_target(x); dx.data)
        kernels::gelu_tanh_backward(dx.data, dy.data(), x.value().data(), sig.data(), dy.size(), dx.overwrite);
    }, bytes);
  }
  return unary("gelu", x, [](float v) { return float(0.5 * v * (1 + std::erf(v * inv_sqrt2))); },
               [](float v, float) {
                 double d = v;
                 return float(0.5 * (1 + std::erf(d * inv_sqrt2)) + d * inv_sqrt_2pi * std::exp(-0.5 * d * d));
               });
}
Var silu(const Var& x) {
  Op op("silu", {x});
  Tensor y = Tensor::uninitialized(x.shape());
  kernels::silu_forward(y.data(), x.value().data(), x.value().size());
  // dx += dy * sigmoid(x) (1 + x (1 - sigmoid(x)))
  return op.finish(std::move(y), [x](const Tensor& dy, const Tensor&) {
    if (float* dx = grad_ptr(x)) kernels::silu_backward(dx, dy.data(), x.value().data(), dy.size());
  });
}

// d x^p = p x^(p-1)
Var pow(const Var& x, float p) {
  return unary("pow", x, [p](float v) { return std::pow(v, p); },
               [p](float v, float) { return p == 0 ? 0.0f : p * std::pow(v, p - 1); });
}
Var square(const Var& x) {
  return unary("square", x, [](float v) { return v * v; }, [](float v, float) { return 2 * v; });
}

// Whether `part` broadcasts against `whole` as whole rows: its shape, leading 1s aside, ends
// whole's (positions (T, D) against tokens (B, T, D), a bias (D) against (N, D)).
static bool repeats_as_rows(const Shape& whole, const Shape& part) {
  std::size_t lead = 0;
  while (lead < part.size() && part[lead] == 1) ++lead;
  std::size_t n = part.size() - lead;
  return part.size() <= whole.size() && std::equal(part.begin() + lead, part.end(), whole.end() - n);
}

// a + b where b repeats over a's rows: the bias kernels (db sums the rows in row order, as
// accumulate_grad's broadcast sum does, so the result is the same to the bit).
static Var add_rows(const char* name, const Var& a, const Var& b) {
  std::size_t cols = b.value().size(), rows = cols == 0 ? 0 : a.value().size() / cols;
  Op op(name, {a, b});
  Tensor y = Tensor::uninitialized(a.shape());
  kernels::add_bias_forward(y.data(), a.value().data(), b.value().data(), rows, cols);
  return op.finish(std::move(y), [a, b, rows, cols](const Tensor& dy, const Tensor&) {
    kernels::add_bias_backward(grad_ptr(a), grad_ptr(b), dy.data(), rows, cols);
  });
}

Var add(const Var& a, const Var& b) {
  if (a.shape() != b.shape()) {
    if (repeats_as_rows(a.shape(), b.shape())) return add_rows("add", a, b);
    if (repeats_as_rows(b.shape(), a.shape())) return add_rows("add", b, a);
  }
  if (a.shape() == b.shape()) {  // the common case, on the vectorised kernel
    Op op("add", {a, b});
    Tensor y = Tensor::uninitialized(a.shape());
    kernels::add_forward(y.data(), a.value().data(), b.value().data(), y.size());
    // da += dy; db += dy
    return op.finish(std::move(y), [a, b](const Tensor& dy, const Tensor&) {
      if (float* da = grad_ptr(a)) kernels::accumulate(da, dy.data(), dy.size());
      if (float* db = grad_ptr(b)) kernels::accumulate(db, dy.data(), dy.size());
    });
  }
  return binary("add", a, b, [](float u, float v) { return u + v; }, [](float, float, float) { return 1.0f; },
                [](float, float, float) { return 1.0f; });
}
Var add_bias(const Var& x, const Var& bias) {
  if (x.shape().empty()) throw std::invalid_argument("add_bias: expected at least one axis, got a scalar");
  expect_shape("add_bias", "bias", bias.shape(), Shape{x.shape().back()});
  return add_rows("add_bias", x, bias);
}

Var sub(const Var& a, const Var& b) {
  return binary("sub", a, b, [](float u, float v) { return u - v; }, [](float, float, float) { return 1.0f; },
                [](float, float, float) { return -1.0f; });
}
Var mul(const Var& a, const Var& b) {
  if (a.shape() == b.shape()) {
    Op op("mul", {a, b});
    Tensor y = Tensor::uninitialized(a.shape());
    kernels::mul_forward(y.data(), a.value().data(), b.value().data(), y.size());
    // da += dy b; db += dy a
    return op.finish(std::move(y), [a, b](const Tensor& dy, const Tensor&) {
      kernels::mul_backward(grad_ptr(a), grad_ptr(b), dy.data(), a.value().data(), b.value().data(), dy.size());
    });
  }
  return binary("mul", a, b, [](float u, float v) { return u * v; }, [](float, float v, float) { return v; },
                [](float u, float, float) { return u; });
}
// d(a/b)/da = 1/b; d(a/b)/db = -a/b^2
Var div(const Var& a, const Var& b) {
  return binary("div", a, b, [](float u, float v) { return u / v; }, [](float, float v, float) { return 1 / v; },
                [](float u, float v, float) { return -u / (v * v); });
}
Var maximum(const Var& a, const Var& b) {
  return binary("maximum", a, b, [](float u, float v) { return u >= v ? u : v; },
                [](float u, float v, float) { return u >= v ? 1.0f : 0.0f; },
                [](float u, float v, float) { return u >= v ? 0.0f : 1.0f; });
}

Var scale(const Var& x, float s) {
  Op op("scale", {x});
  Tensor y = Tensor::uninitialized(x.shape());
  kernels::scale_forward(y.data(), x.value().data(), s, y.size());
  // dx += s dy
  return op.finish(std::move(y), [x, s](const Tensor& dy, const Tensor&) {
    kernels::scale_backward(grad_ptr(x), dy.data(), s, dy.size());
  });
}

Var add(const Var& a, float b) {
  return unary("add", a, [b](float v) { return v + b; }, [](float, float) { return 1.0f; });
}
Var sub(const Var& a, float b) { return add(a, -b); }
Var sub(float a, const Var& b) {
  return unary("sub", b, [a](float v) { return a - v; }, [](float, float) { return -1.0f; });
}
Var mul(const Var& a, float b) { return scale(a, b); }
Var div(const Var& a, float b) { return scale(a, 1 / b); }
// d(a/x) = -a/x^2 = -y/x
Var div(float a, const Var& b) {
  return unary("div", b, [a](float v) { return a / v; }, [](float v, float y) { return -y / v; });
}
Var maximum(const Var& a, float b) {
  return unary("maximum", a, [b](float v) { return v >= b ? v : b; }, [b](float v, float) { return v >= b ? 1.0f : 0.0f; });
}

Var expand(const Var& x, const Shape& shape) {
  if (!broadcastable_to(x.shape(), shape))
    throw std::invalid_argument(
        fmt::format("expand: x {} cannot be broadcast to {}", to_string(x.shape()), to_string(shape)));
  Op op("expand", {x});
  // dx += sum_to(dy, x's shape)
  return op.finish(expand_to(x.value(), shape), [x](const Tensor& dy, const Tensor&) { accumulate_grad(x, dy); });
}

Var operator+(const Var& a, const Var& b) { return add(a, b); }
Var operator-(const Var& a, const Var& b) { return sub(a, b); }
Var operator*(const Var& a, const Var& b) { return mul(a, b); }
Var operator/(const Var& a, const Var& b) { return div(a, b); }
Var operator+(const Var& a, float b) { return add(a, b); }
Var operator-(const Var& a, float b) { return sub(a, b); }
Var operator*(const Var& a, float b) { return mul(a, b); }
Var operator/(const Var& a, float b) { return div(a, b); }
Var operator+(float a, const Var& b) { return add(b, a); }
Var operator-(float a, const Var& b) { return sub(a, b); }
Var operator*(float a, const Var& b) { return mul(b, a); }
Var operator/(float a, const Var& b) { return div(a, b); }
Var operator-(const Var& x) { return neg(x); }

}  // namespace tapegrad
