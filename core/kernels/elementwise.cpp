// Elementwise kernels: one formula per kernel, on SIMD batches, and blocks of the array on threads
// when it is large; the last, partial batch as the position rule has it (docs/architecture.md,
// "Position independence"): each output element depends only on the same index of the inputs.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/kernels/level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

// The batch op on arrays[0:count] (count < W), run as op(0, ...) on zero-padded copies:
// every array is copied in (a null one stays null; arrays at one address share one copy, as
// mul_backward's da and db do for x * x), and the writable ones (T*) copied back out.
template <class T, class Op, class... Arrays>
static void padded_batch(std::size_t count, const Op& op, Arrays... arrays) {
  constexpr std::size_t W = Batch<T>::size, n = sizeof...(Arrays);
  alignas(64) T lanes[n][W] = {};
  const void* address[n] = {arrays...};
  auto copy_of = [&](std::size_t a) {
    std::size_t first = 0;
    while (address[first] != address[a]) ++first;
    return lanes[first];
  };
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    auto copy_in = [&](auto* array, T* padded) {
      if (array) std::copy_n(array, count, padded);
      return array ? decltype(array)(padded) : array;
    };
    op(0, copy_in(arrays, copy_of(I))...);
    auto copy_out = [&](auto* array, const T* padded) {
      if constexpr (!std::is_const_v<std::remove_pointer_t<decltype(array)>>)
        if (array) std::copy_n(padded, count, array);
    };
    (copy_out(arrays, copy_of(I)), ...);
  }(std::index_sequence_for<Arrays...>{});
}

// op(i, arrays...) computes the batch [i, i + W) of the arrays; simd_map runs it over [0, n), in
// blocks of a multiple of W elements on the kernel threads, the last partial batch padded. cost is
// the scalar operations per element (a hint for the thread split). The arrays are T* (written, and
// read where op reads them) or const T* (read); any may be null where op allows it.
template <class T, class Op, class... Arrays>
static void simd_map(std::size_t n, std::size_t cost, const Op& op, Arrays... arrays) {
  constexpr std::size_t W = Batch<T>::size, block = 4096;
  static_assert(block % W == 0, "every block but the last holds whole batches");
  detail::parallel_for((n + block - 1) / block, block * cost, [&](std::size_t blk) {
    std::size_t begin = blk * block, end = std::min(n, begin + block), i = begin;
    for (; i + W <= end; i += W) op(i, arrays...);
    if (i < end) padded_batch<T>(end - i, op, (arrays ? arrays + i : arrays)...);
  });
}

template <class T> void add_forward(T* y, const T* a, const T* b, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 1,
      [](std::size_t i, T* y, const T* a, const T* b) {
        (B::load_unaligned(a + i) + B::load_unaligned(b + i)).store_unaligned(y + i);
      },
      y, a, b);
}
TAPEGRAD_INSTANTIATE_KERNEL(add_forward)
template <class T> void accumulate(T* dst, const T* src, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 1,
      [](std::size_t i, T* dst, const T* src) {
        (B::load_unaligned(dst + i) + B::load_unaligned(src + i)).store_unaligned(dst + i);
      },
      dst, src);
}
TAPEGRAD_INSTANTIATE_KERNEL(accumulate)
template <class T> void mul_forward(T* y, const T* a, const T* b, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 1,
      [](std::size_t i, T* y, const T* a, const T* b) {
        (B::load_unaligned(a + i) * B::load_unaligned(b + i)).store_unaligned(y + i);
      },
      y, a, b);
}
TAPEGRAD_INSTANTIATE_KERNEL(mul_forward)
template <class T> void mul_backward(T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 2,
      [](std::size_t i, T* da, T* db, const T* dy, const T* a, const T* b) {
        B g = B::load_unaligned(dy + i);
        if (da) (B::load_unaligned(da + i) + g * B::load_unaligned(b + i)).store_unaligned(da + i);
        if (db) (B::load_unaligned(db + i) + g * B::load_unaligned(a + i)).store_unaligned(db + i);
      },
      da, db, dy, a, b);
}
TAPEGRAD_INSTANTIATE_KERNEL(mul_backward)
template <class T> void scale_forward(T* y, const T* x, T s, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 1, [s](std::size_t i, T* y, const T* x) { (B(s) * B::load_unaligned(x + i)).store_unaligned(y + i); }, y, x);
}
TAPEGRAD_INSTANTIATE_KERNEL(scale_forward)
template <class T> void scale_backward(T* dx, const T* dy, T s, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 1,
      [s](std::size_t i, T* dx, const T* dy) {
        (B::load_unaligned(dx + i) + B(s) * B::load_unaligned(dy + i)).store_unaligned(dx + i);
      },
      dx, dy);
}
TAPEGRAD_INSTANTIATE_KERNEL(scale_backward)

template <class T> void add_bias_forward(T* y, const T* x, const T* bias, std::size_t rows, std::size_t cols) {
  detail::parallel_for(rows, cols, [&](std::size_t r) { add_forward(y + r * cols, x + r * cols, bias, cols); });
}
TAPEGRAD_INSTANTIATE_KERNEL(add_bias_forward)
template <class T> void add_bias_backward(T* dx, T* dbias, const T* dy, std::size_t rows, std::size_t cols) {
  if (dx) accumulate(dx, dy, rows * cols);
  if (dbias)
    detail::column_sums(dbias, rows, cols, 1, [dy, cols](std::size_t r, std::size_t j) { return dy[r * cols + j]; });
}
TAPEGRAD_INSTANTIATE_KERNEL(add_bias_backward)

// silu(a) = a * s, s = sigmoid(a) = 1 / (1 + exp(-a)).
template <class T> static Batch<T> sigmoid(Batch<T> a) { return T(1) / (T(1) + exp(-a)); }

template <class T> void silu_forward(T* y, const T* a, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 8,
      [](std::size_t i, T* y, const T* a) {
        B x = B::load_unaligned(a + i);
        (x * sigmoid<T>(x)).store_unaligned(y + i);
      },
      y, a);
}
TAPEGRAD_INSTANTIATE_KERNEL(silu_forward)

// d silu / da = s + a s (1 - s) = s (1 + a (1 - s)).
template <class T> void silu_backward(T* da, const T* dy, const T* a, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 8,
      [](std::size_t i, T* da, const T* dy, const T* a) {
        B x = B::load_unaligned(a + i), s = sigmoid<T>(x);
        B d = B::load_unaligned(da + i) + B::load_unaligned(dy + i) * s * (T(1) + x * (T(1) - s));
        d.store_unaligned(da + i);
      },
      da, dy, a);
}
TAPEGRAD_INSTANTIATE_KERNEL(silu_backward)

template <class T> void swiglu_forward(T* y, const T* a, const T* b, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 8,
      [](std::size_t i, T* y, const T* a, const T* b) {
        B x = B::load_unaligned(a + i);
        (x * sigmoid<T>(x) * B::load_unaligned(b + i)).store_unaligned(y + i);
      },
      y, a, b);
}
TAPEGRAD_INSTANTIATE_KERNEL(swiglu_forward)

// y = silu(a) b: da += dy b silu'(a); db += dy silu(a).
template <class T>
void swiglu_backward(T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n, bool overwrite) {
  using B = Batch<T>;
  simd_map<T>(
      n, 8,
      [overwrite](std::size_t i, T* da, T* db, const T* dy, const T* a, const T* b) {
        B x = B::load_unaligned(a + i), s = sigmoid<T>(x), g = B::load_unaligned(dy + i);
        if (da) {
          B t = g * B::load_unaligned(b + i) * s * (T(1) + x * (T(1) - s));
          (overwrite ? t : B::load_unaligned(da + i) + t).store_unaligned(da + i);
        }
        if (db) (overwrite ? g * x * s : B::load_unaligned(db + i) + g * x * s).store_unaligned(db + i);
      },
      da, db, dy, a, b);
}
TAPEGRAD_INSTANTIATE_KERNEL(swiglu_backward)

// gelu_tanh(x) = x s, s = sigmoid(2 c u), u = x + k x^3 (c = sqrt(2 / pi), k = 0.044715):
// d/dx = s + x s (1 - s) 2 c (1 + 3 k x^2).
template <class T> static constexpr T gelu_2c = T(2 * 0.7978845608028654);
template <class T> static constexpr T gelu_k = T(0.044715);

template <class T> void gelu_tanh_forward(T* y, T* s, const T* x, std::size_t n) {
  using B = Batch<T>;
  simd_map<T>(
      n, 10,
      [](std::size_t i, T* y, T* s, const T* x) {
        B v = B::load_unaligned(x + i), sig = sigmoid<T>(B(gelu_2c<T>) * fma(B(gelu_k<T>) * v, v * v, v));
        if (s) sig.store_unaligned(s + i);
        (v * sig).store_unaligned(y + i);
      },
      y, s, x);
}
TAPEGRAD_INSTANTIATE_KERNEL(gelu_tanh_forward)

template <class T>
void gelu_tanh_backward(T* dx, const T* dy, const T* x, const T* s, std::size_t n, bool overwrite) {
  using B = Batch<T>;
  simd_map<T>(
      n, 8,
      [overwrite](std::size_t i, T* dx, const T* dy, const T* x, const T* s) {
        B v = B::load_unaligned(x + i), sig = B::load_unaligned(s + i);
        B slope = fma(v * sig * (T(1) - sig) * B(gelu_2c<T>), fma(B(3 * gelu_k<T>) * v, v, B(T(1))), sig);
        B g = B::load_unaligned(dy + i);
        (overwrite ? g * slope : fma(g, slope, B::load_unaligned(dx + i))).store_unaligned(dx + i);
      },
      dx, dy, x, s);
}
TAPEGRAD_INSTANTIATE_KERNEL(gelu_tanh_backward)

template <class T> void adamw_update(T* p, T* m, T* v, const T* g, std::size_t n, const AdamWScalars<T>& s) {
  using B = Batch<T>;
  simd_map<T>(
      n, 12,
      [&s](std::size_t i, T* p, T* m, T* v, const T* g) {
        using std::sqrt;  // the batch's own sqrt by argument-dependent lookup
        B gb = B(s.grad_scale) * B::load_unaligned(g + i);  // scale_forward's product: clipping's bits
        B mb = s.beta1 * B::load_unaligned(m + i) + s.one_minus_beta1 * gb;
        B vb = s.beta2 * B::load_unaligned(v + i) + s.one_minus_beta2 * gb * gb;
        B pb = B::load_unaligned(p + i) * s.decay - s.step_size * mb / (sqrt(vb) * s.inv_bc2_sqrt + s.eps);
        pb.store_unaligned(p + i);
        mb.store_unaligned(m + i);
        vb.store_unaligned(v + i);
      },
      p, m, v, g);
}
TAPEGRAD_INSTANTIATE_KERNEL(adamw_update)

// The gradients' global norm squared (clip_grad_norm), in double: in each block of 4096, chain c
// adds the squares of elements c, c + 8, ... in order, then the chains are added pairwise. The
// chains are the lanes of the compiler's vectors (omp simd: a lane's operations keep their order),
// so the bits are the same at every level and thread count; scalar, the loop ran at a third of the
// memory's speed (clip took 130 of a SmolLM2 step's 6,400 ms at 1 thread).
template <class T> double sum_squares(const T* x, std::size_t n) {
  constexpr std::size_t block = 4096, chains = 8;
  const std::size_t blocks = (n + block - 1) / block;
  std::vector<double> sums(blocks);
  detail::parallel_for(blocks, block * 2, [&](std::size_t b) {
    const std::size_t begin = b * block, end = std::min(n, begin + block);
    double acc[chains] = {};
    std::size_t i = begin;
    for (; i + chains <= end; i += chains)
#pragma omp simd
      for (std::size_t c = 0; c < chains; ++c) acc[c] += double(x[i + c]) * double(x[i + c]);
    for (std::size_t c = 0; i < end; ++i, ++c) acc[c] += double(x[i]) * double(x[i]);
    sums[b] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  });
  double total = 0;
  for (double s : sums) total += s;
  return total;
}
TAPEGRAD_INSTANTIATE_KERNEL(sum_squares)

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
