// Elementwise kernels: xtensor expressions (noalias into the output, evaluated with xsimd) for the
// arithmetic, xsimd batches for SiLU/SwiGLU whose exp xtensor cannot fuse as well.
#include <xtensor/xnoalias.hpp>

#include "core/kernels.h"
#include "core/parallel.h"
#include "core/xtensor_interop.h"

namespace tapegrad::kernels {

// Runs f(begin, count) over blocks of [0, n), on threads for big n.
template <class F> static void in_blocks(std::size_t n, F f) {
  constexpr std::size_t block = 16384;
  detail::parallel_for((n + block - 1) / block, block, [&](std::size_t b) {
    f(b * block, std::min(block, n - b * block));
  });
}
template <class T> void add_forward(T* y, const T* a, const T* b, std::size_t n) {
  in_blocks(n, [&](std::size_t i, std::size_t m) { xt::noalias(flat_view(y + i, m)) = flat_view(a + i, m) + flat_view(b + i, m); });
}
template <class T> void accumulate(T* dst, const T* src, std::size_t n) {
  in_blocks(n, [&](std::size_t i, std::size_t m) { xt::noalias(flat_view(dst + i, m)) += flat_view(src + i, m); });
}
template <class T> void mul_forward(T* y, const T* a, const T* b, std::size_t n) {
  in_blocks(n, [&](std::size_t i, std::size_t m) { xt::noalias(flat_view(y + i, m)) = flat_view(a + i, m) * flat_view(b + i, m); });
}
template <class T> void mul_backward(T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n) {
  if (da) xt::noalias(flat_view(da, n)) += flat_view(dy, n) * flat_view(b, n);
  if (db) xt::noalias(flat_view(db, n)) += flat_view(dy, n) * flat_view(a, n);
}
template <class T> void scale_forward(T* y, const T* x, T s, std::size_t n) {
  xt::noalias(flat_view(y, n)) = s * flat_view(x, n);
}
template <class T> void scale_backward(T* dx, const T* dy, T s, std::size_t n) {
  xt::noalias(flat_view(dx, n)) += s * flat_view(dy, n);
}

template <class T> void add_bias_forward(T* y, const T* x, const T* bias, std::size_t rows, std::size_t cols) {
  auto b = flat_view(bias, cols);
  for (std::size_t r = 0; r < rows; ++r) xt::noalias(flat_view(y + r * cols, cols)) = flat_view(x + r * cols, cols) + b;
}
template <class T> void add_bias_backward(T* dx, T* dbias, const T* dy, std::size_t rows, std::size_t cols) {
  if (dx) accumulate(dx, dy, rows * cols);
  if (!dbias) return;
  auto db = flat_view(dbias, cols);
  for (std::size_t r = 0; r < rows; ++r) xt::noalias(db) += flat_view(dy + r * cols, cols);
}

// silu(a) = a * s, s = sigmoid(a) = 1 / (1 + exp(-a)).
template <class T> static detail::Batch<T> sigmoid(detail::Batch<T> a) {
  return T(1) / (T(1) + xsimd::exp(-a));
}
template <class T> static T sigmoid(T a) { return T(1) / (T(1) + std::exp(-a)); }

// Applies f(i, width) to SIMD blocks then the scalar tail, on threads for big n.
template <class T, class Vector, class Scalar>
static void simd_map(std::size_t n, Vector vector_op, Scalar scalar_op) {
  constexpr std::size_t W = detail::Batch<T>::size;
  constexpr std::size_t block = 1024;  // elements per parallel work item (a multiple of W)
  detail::parallel_for((n + block - 1) / block, block * 8, [&](std::size_t blk) {
    std::size_t begin = blk * block, end = std::min(n, begin + block), i = begin;
    for (; i + W <= end; i += W) vector_op(i);
    for (; i < end; ++i) scalar_op(i);
  });
}

template <class T> void silu_forward(T* y, const T* a, std::size_t n) {
  using B = detail::Batch<T>;
  simd_map<T>(
      n, [&](std::size_t i) { B x = B::load_unaligned(a + i); (x * sigmoid(x)).store_unaligned(y + i); },
      [&](std::size_t i) { y[i] = a[i] * sigmoid(a[i]); });
}

// d silu / da = s + a s (1 - s) = s (1 + a (1 - s)).
template <class T> void silu_backward(T* da, const T* dy, const T* a, std::size_t n) {
  using B = detail::Batch<T>;
  simd_map<T>(
      n,
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
  using B = detail::Batch<T>;
  simd_map<T>(
      n,
      [&](std::size_t i) {
        B x = B::load_unaligned(a + i);
        (x * sigmoid(x) * B::load_unaligned(b + i)).store_unaligned(y + i);
      },
      [&](std::size_t i) { y[i] = a[i] * sigmoid(a[i]) * b[i]; });
}

// y = silu(a) b: da += dy b silu'(a); db += dy silu(a).
template <class T> void swiglu_backward(T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n) {
  using B = detail::Batch<T>;
  simd_map<T>(
      n,
      [&](std::size_t i) {
        B x = B::load_unaligned(a + i), s = sigmoid(x), g = B::load_unaligned(dy + i);
        if (da) (B::load_unaligned(da + i) + g * B::load_unaligned(b + i) * s * (T(1) + x * (T(1) - s))).store_unaligned(da + i);
        if (db) (B::load_unaligned(db + i) + g * x * s).store_unaligned(db + i);
      },
      [&](std::size_t i) {
        T s = sigmoid(a[i]);
        if (da) da[i] += dy[i] * b[i] * s * (T(1) + a[i] * (T(1) - s));
        if (db) db[i] += dy[i] * a[i] * s;
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
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, std::size_t);
TAPEGRAD_INSTANTIATE(float)
TAPEGRAD_INSTANTIATE(double)
#undef TAPEGRAD_INSTANTIATE

}  // namespace tapegrad::kernels
