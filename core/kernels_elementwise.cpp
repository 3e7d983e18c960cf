// Elementwise kernels: SIMD batches over the body, a scalar loop over the tail, blocks of the array
// on threads when it is large. Each output element depends only on the same index of the inputs,
// so results are identical for every thread count.
#include <cmath>

#include "core/kernel_level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

// Runs vector_op(i) on [i, i + W) and scalar_op(i) on the tail, in blocks of a multiple of W
// elements; cost is the scalar operations per element (a hint for the thread split).
template <class T, class Vector, class Scalar>
static void simd_map(std::size_t n, std::size_t cost, Vector vector_op, Scalar scalar_op) {
  constexpr std::size_t W = Batch<T>::size;
  constexpr std::size_t block = 4096;
  detail::parallel_for((n + block - 1) / block, block * cost, [&](std::size_t blk) {
    std::size_t begin = blk * block, end = std::min(n, begin + block), i = begin;
    for (; i + W <= end; i += W) vector_op(i);
    for (; i < end; ++i) scalar_op(i);
  });
}

template <class T> void add_forward(T* y, const T* a, const T* b, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 1, [&](std::size_t i) { (B::load_unaligned(a + i) + B::load_unaligned(b + i)).store_unaligned(y + i); },
      [&](std::size_t i) { y[i] = a[i] + b[i]; });
}
template <class T> void accumulate(T* dst, const T* src, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 1, [&](std::size_t i) { (B::load_unaligned(dst + i) + B::load_unaligned(src + i)).store_unaligned(dst + i); },
      [&](std::size_t i) { dst[i] += src[i]; });
}
template <class T> void mul_forward(T* y, const T* a, const T* b, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 1, [&](std::size_t i) { (B::load_unaligned(a + i) * B::load_unaligned(b + i)).store_unaligned(y + i); },
      [&](std::size_t i) { y[i] = a[i] * b[i]; });
}
template <class T> void mul_backward(T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 2,
      [&](std::size_t i) {
        B g = B::load_unaligned(dy + i);
        if (da) (B::load_unaligned(da + i) + g * B::load_unaligned(b + i)).store_unaligned(da + i);
        if (db) (B::load_unaligned(db + i) + g * B::load_unaligned(a + i)).store_unaligned(db + i);
      },
      [&](std::size_t i) {
        if (da) da[i] += dy[i] * b[i];
        if (db) db[i] += dy[i] * a[i];
      });
}
template <class T> void scale_forward(T* y, const T* x, T s, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 1, [&](std::size_t i) { (B(s) * B::load_unaligned(x + i)).store_unaligned(y + i); },
      [&](std::size_t i) { y[i] = s * x[i]; });
}
template <class T> void scale_backward(T* dx, const T* dy, T s, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 1, [&](std::size_t i) { (B::load_unaligned(dx + i) + B(s) * B::load_unaligned(dy + i)).store_unaligned(dx + i); },
      [&](std::size_t i) { dx[i] += s * dy[i]; });
}

template <class T> void add_bias_forward(T* y, const T* x, const T* bias, std::size_t rows, std::size_t cols) {
  detail::parallel_for(rows, cols, [&](std::size_t r) { add_forward(y + r * cols, x + r * cols, bias, cols); });
}
template <class T> void add_bias_backward(T* dx, T* dbias, const T* dy, std::size_t rows, std::size_t cols) {
  if (dx) accumulate(dx, dy, rows * cols);
  if (dbias)
    detail::column_sums(dbias, rows, cols, 1, [dy, cols](std::size_t r, std::size_t j) { return dy[r * cols + j]; });
}

// silu(a) = a * s, s = sigmoid(a) = 1 / (1 + exp(-a)).
template <class T> static Batch<T> sigmoid(Batch<T> a) { return T(1) / (T(1) + exp(-a)); }
template <class T> static T sigmoid(T a) { return T(1) / (T(1) + std::exp(-a)); }

template <class T> void silu_forward(T* y, const T* a, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 8, [&](std::size_t i) { B x = B::load_unaligned(a + i); (x * sigmoid(x)).store_unaligned(y + i); },
      [&](std::size_t i) { y[i] = a[i] * sigmoid(a[i]); });
}

// d silu / da = s + a s (1 - s) = s (1 + a (1 - s)).
template <class T> void silu_backward(T* da, const T* dy, const T* a, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 8,
      [&](std::size_t i) {
        B x = B::load_unaligned(a + i), s = sigmoid(x);
        B d = B::load_unaligned(da + i) + B::load_unaligned(dy + i) * s * (T(1) + x * (T(1) - s));
        d.store_unaligned(da + i);
      },
      [&](std::size_t i) {
        T s = sigmoid(a[i]);
        da[i] += dy[i] * s * (T(1) + a[i] * (T(1) - s));
      });
}

template <class T> void swiglu_forward(T* y, const T* a, const T* b, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 8,
      [&](std::size_t i) {
        B x = B::load_unaligned(a + i);
        (x * sigmoid(x) * B::load_unaligned(b + i)).store_unaligned(y + i);
      },
      [&](std::size_t i) { y[i] = a[i] * sigmoid(a[i]) * b[i]; });
}

// y = silu(a) b: da += dy b silu'(a); db += dy silu(a).
template <class T>
void swiglu_backward(T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n, bool overwrite) {
  using B = Batch<T>;
  simd_map<T>(
      n, 8,
      [&](std::size_t i) {
        B x = B::load_unaligned(a + i), s = sigmoid(x), g = B::load_unaligned(dy + i);
        if (da) {
          B t = g * B::load_unaligned(b + i) * s * (T(1) + x * (T(1) - s));
          (overwrite ? t : B::load_unaligned(da + i) + t).store_unaligned(da + i);
        }
        if (db) (overwrite ? g * x * s : B::load_unaligned(db + i) + g * x * s).store_unaligned(db + i);
      },
      [&](std::size_t i) {
        T s = sigmoid(a[i]);
        if (da) da[i] = (overwrite ? T(0) : da[i]) + dy[i] * b[i] * s * (T(1) + a[i] * (T(1) - s));
        if (db) db[i] = (overwrite ? T(0) : db[i]) + dy[i] * a[i] * s;
      });
}

// gelu_tanh(x) = x s, s = sigmoid(2 c u), u = x + k x^3 (c = sqrt(2 / pi), k = 0.044715):
// d/dx = s + x s (1 - s) 2 c (1 + 3 k x^2).
template <class T> static constexpr T gelu_2c = T(2 * 0.7978845608028654);
template <class T> static constexpr T gelu_k = T(0.044715);

template <class T> void gelu_tanh_forward(T* y, T* s, const T* x, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 10,
      [&](std::size_t i) {
        B v = B::load_unaligned(x + i), sig = sigmoid(B(gelu_2c<T>) * fma(B(gelu_k<T>) * v, v * v, v));
        if (s) sig.store_unaligned(s + i);
        (v * sig).store_unaligned(y + i);
      },
      [&](std::size_t i) {
        T v = x[i], sig = sigmoid(gelu_2c<T> * (gelu_k<T> * v * (v * v) + v));
        if (s) s[i] = sig;
        y[i] = v * sig;
      });
}

template <class T>
void gelu_tanh_backward(T* dx, const T* dy, const T* x, const T* s, std::size_t n, bool overwrite) {
  using B = Batch<T>;
  simd_map<T>(
      n, 8,
      [&](std::size_t i) {
        B v = B::load_unaligned(x + i), sig = B::load_unaligned(s + i);
        B slope = fma(v * sig * (T(1) - sig) * B(gelu_2c<T>), fma(B(3 * gelu_k<T>) * v, v, B(T(1))), sig);
        B g = B::load_unaligned(dy + i);
        (overwrite ? g * slope : fma(g, slope, B::load_unaligned(dx + i))).store_unaligned(dx + i);
      },
      [&](std::size_t i) {
        T v = x[i], sig = s[i];
        T slope = v * sig * (T(1) - sig) * gelu_2c<T> * (3 * gelu_k<T> * v * v + T(1)) + sig;
        dx[i] = overwrite ? dy[i] * slope : dx[i] + dy[i] * slope;
      });
}

#define TAPEGRAD_INSTANTIATE(T)                                                                    \
  template void add_forward<T>(T*, const T*, const T*, std::size_t);                               \
  template void accumulate<T>(T*, const T*, std::size_t);                                          \
  template void mul_forward<T>(T*, const T*, const T*, std::size_t);                               \
  template void mul_backward<T>(T*, T*, const T*, const T*, const T*, std::size_t);                \
  template void scale_forward<T>(T*, const T*, T, std::size_t);                                    \
  template void scale_backward<T>(T*, const T*, T, std::size_t);                                   \
  template void add_bias_forward<T>(T*, const T*, const T*, std::size_t, std::size_t);             \
  template void add_bias_backward<T>(T*, T*, const T*, std::size_t, std::size_t);                  \
  template void silu_forward<T>(T*, const T*, std::size_t);                                        \
  template void silu_backward<T>(T*, const T*, const T*, std::size_t);                             \
  template void swiglu_forward<T>(T*, const T*, const T*, std::size_t);                            \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, std::size_t, bool);       \
  template void gelu_tanh_forward<T>(T*, T*, const T*, std::size_t);                                              \
  template void gelu_tanh_backward<T>(T*, const T*, const T*, const T*, std::size_t, bool);
TAPEGRAD_INSTANTIATE(float)
TAPEGRAD_INSTANTIATE(double)
#undef TAPEGRAD_INSTANTIATE

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
