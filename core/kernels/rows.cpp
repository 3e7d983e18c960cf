// Row-wise kernels: embedding, RMSNorm, LayerNorm, RoPE and cross-entropy. Loops over contiguous
// rows, rows spread over threads; cross-row sums (dw, dtable) run serially in row order so results
// are identical for every thread count. Within a row, the last partial vector is padded (the rule
// of core/kernels/simd_helpers.h): a row's result depends on that row alone.
#include <cmath>
#include <numbers>

#include "core/kernels/level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

// ---- embedding ----

template <class T> void embedding_forward(T* y, const T* table, const std::int32_t* ids, std::size_t n, std::size_t dim) {
  detail::parallel_for(n, dim, [&](std::size_t i) { std::copy_n(table + std::size_t(ids[i]) * dim, dim, y + i * dim); });
}
TAPEGRAD_INSTANTIATE_KERNEL(embedding_forward)

template <class T>
void embedding_backward(T* dtable, const T* dy, const std::int32_t* ids, std::size_t n, std::size_t dim) {
  for (std::size_t i = 0; i < n; ++i) {
    T* row = dtable + std::size_t(ids[i]) * dim;
    const T* g = dy + i * dim;
    for (std::size_t j = 0; j < dim; ++j) row[j] += g[j];
  }
}
TAPEGRAD_INSTANTIATE_KERNEL(embedding_backward)

// The sum over a row of dim of term(j, count) for the vector at j, count = min(W, dim - j) (its
// padding lanes are dropped): vector v into accumulator v % 2, then one horizontal sum.
template <class T, class Term>
static T row_sum(std::size_t dim, Term term) {
  using B = Batch<T>;
  constexpr std::size_t W = B::size;
  B acc0(T(0)), acc1(T(0));
  std::size_t j = 0;
  for (; j + 2 * W <= dim; j += 2 * W) {
    acc0 += term(j, W);
    acc1 += term(j + W, W);
  }
  if (j + W <= dim) acc0 += term(j, W), j += W;
  B& last = j % (2 * W) == 0 ? acc0 : acc1;
  if (j < dim) last += detail::first_lanes(term(j, dim - j), dim - j);
  return hadd(acc0 + acc1);
}

// ---- RMSNorm ----

template <class T>
void rms_norm_forward(T* y, T* rstd, const T* x, const T* w, std::size_t rows, std::size_t dim, T eps) {
  detail::parallel_for(rows, dim * 3, [&](std::size_t r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    T s = T(1) / std::sqrt(detail::dot<Batch<T>>(xr, xr, dim) / T(dim) + eps);
    if (rstd) rstd[r] = s;
    for (std::size_t j = 0; j < dim; ++j) yr[j] = xr[j] * s * w[j];
  });
}
TAPEGRAD_INSTANTIATE_KERNEL(rms_norm_forward)

// y_j = x_j r w_j, r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / D.
// With g = dy * w: dx_j = r g_j - x_j r^3 sum_k(g_k x_k) / D;  dw_j = sum over rows of dy_j x_j r.
template <class T>
void rms_norm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, std::size_t rows,
                       std::size_t dim) {
  if (dx) {
    detail::parallel_for(rows, dim * 6, [&](std::size_t r) {
      const T* xr = x + r * dim;
      const T* gr = dy + r * dim;
      T* dxr = dx + r * dim;
      T s = rstd[r];
      T gx = row_sum<T>(dim, [&](std::size_t j, std::size_t count) {
        using B = Batch<T>;
        return detail::load_lanes<B>(gr + j, count) * detail::load_lanes<B>(w + j, count) *
               detail::load_lanes<B>(xr + j, count);
      });
      T c = s * s * s * gx / T(dim);
      for (std::size_t j = 0; j < dim; ++j) dxr[j] += s * gr[j] * w[j] - c * xr[j];
    });
  }
  if (dw)
    detail::column_sums(dw, rows, dim, 3, [=](std::size_t r, std::size_t j) {
      return dy[r * dim + j] * x[r * dim + j] * rstd[r];
    });
}
TAPEGRAD_INSTANTIATE_KERNEL(rms_norm_backward)

// ---- LayerNorm ----

template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, std::size_t rows, std::size_t dim,
                        T eps) {
  using B = Batch<T>;
  constexpr std::size_t W = B::size;
  detail::parallel_for(rows, dim * 6, [&](std::size_t r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    auto load = [](const T* p, std::size_t count) { return detail::load_lanes<B>(p, count); };
    const T m = row_sum<T>(dim, [&](std::size_t j, std::size_t count) { return load(xr + j, count); }) / T(dim);
    const T var = row_sum<T>(dim, [&](std::size_t j, std::size_t count) {
      B d = load(xr + j, count) - B(m);
      return d * d;
    }) / T(dim);
    const T s = T(1) / std::sqrt(var + eps);
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = s;
    for (std::size_t j = 0; j < dim; j += W) {
      const std::size_t count = std::min(W, dim - j);
      B xhat = (load(xr + j, count) - B(m)) * B(s);
      detail::store_lanes(fma(xhat, load(w + j, count), load(b + j, count)), yr + j, count);
    }
  });
}
TAPEGRAD_INSTANTIATE_KERNEL(layer_norm_forward)

// xhat = (x - mean) rstd, g = dy w: dx = rstd (g - mean(g) - xhat mean(g xhat)); dw = sum over rows
// of dy xhat; db = sum over rows of dy.
template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                         std::size_t rows, std::size_t dim) {
  using B = Batch<T>;
  constexpr std::size_t W = B::size;
  if (dx) {
    detail::parallel_for(rows, dim * 10, [&](std::size_t r) {
      const T *xr = x + r * dim, *gr = dy + r * dim;
      T* dxr = dx + r * dim;
      const T m = mean[r], s = rstd[r];
      auto load = [](const T* p, std::size_t count) { return detail::load_lanes<B>(p, count); };
      auto g = [&](std::size_t j, std::size_t count) { return load(gr + j, count) * load(w + j, count); };
      auto xhat = [&](std::size_t j, std::size_t count) { return (load(xr + j, count) - B(m)) * B(s); };
      const T mean_g = row_sum<T>(dim, g) / T(dim);
      const T mean_gx =
          row_sum<T>(dim, [&](std::size_t j, std::size_t count) { return g(j, count) * xhat(j, count); }) / T(dim);
      for (std::size_t j = 0; j < dim; j += W) {
        const std::size_t count = std::min(W, dim - j);
        B d = B(s) * (g(j, count) - B(mean_g) - xhat(j, count) * B(mean_gx));
        detail::store_lanes(load(dxr + j, count) + d, dxr + j, count);
      }
    });
  }
  if (dw)
    detail::column_sums(dw, rows, dim, 3, [=](std::size_t r, std::size_t j) {
      return dy[r * dim + j] * ((x[r * dim + j] - mean[r]) * rstd[r]);
    });
  if (db) detail::column_sums(db, rows, dim, 1, [=](std::size_t r, std::size_t j) { return dy[r * dim + j]; });
}
TAPEGRAD_INSTANTIATE_KERNEL(layer_norm_backward)

// ---- RoPE ----

// x y + z, fused where the level has FMA. Written out: left to itself, GCC 12 at AVX-512 fuses a
// rotated pair into one vfmaddsub in some copies of the loop and not in others, even with
// -ffp-contract=off (seen in rope_apply<double>), so an element's bits depended on the copy.
template <class T> static T mul_add(T x, T y, T z) {
#ifdef __FMA__
  return std::fma(x, y, z);
#else
  return x * y + z;  // SSE2 has no FMA: nothing to fuse
#endif
}

// Rotates each pair (x[2i], x[2i+1]) of each head by +angle (sign = 1) or -angle (sign = -1),
// writing (accumulate = false) or adding (accumulate = true) into y.
template <class T>
static void rope_apply(T* y, const T* x, const RopeTable<T>& table, std::size_t batch, std::size_t seq_len,
                       std::size_t n_heads, std::size_t head_dim, std::size_t offset, T sign, bool accumulate) {
  std::size_t dim = n_heads * head_dim, half = head_dim / 2;
  detail::parallel_for(batch * seq_len, dim * 4, [&](std::size_t row) {
    std::size_t pos = offset + row % seq_len;
    const T* c = table.cos.data() + pos * half;
    const T* s = table.sin.data() + pos * half;
    for (std::size_t h = 0; h < n_heads; ++h) {
      const T* xh = x + row * dim + h * head_dim;
      T* yh = y + row * dim + h * head_dim;
      for (std::size_t i = 0; i < half; ++i) {
        T x0 = xh[2 * i], x1 = xh[2 * i + 1], sn = sign * s[i];
        T y0 = mul_add(x0, c[i], -(x1 * sn)), y1 = mul_add(x0, sn, x1 * c[i]);
        if (accumulate) {
          yh[2 * i] += y0;
          yh[2 * i + 1] += y1;
        } else {
          yh[2 * i] = y0;
          yh[2 * i + 1] = y1;
        }
      }
    }
  });
}

template <class T>
void rope_forward(T* y, const T* x, const RopeTable<T>& table, std::size_t batch, std::size_t seq_len,
                  std::size_t n_heads, std::size_t head_dim, std::size_t offset) {
  rope_apply(y, x, table, batch, seq_len, n_heads, head_dim, offset, T(1), false);
}
TAPEGRAD_INSTANTIATE_KERNEL(rope_forward)

template <class T>
void rope_backward(T* dx, const T* dy, const RopeTable<T>& table, std::size_t batch, std::size_t seq_len,
                   std::size_t n_heads, std::size_t head_dim, std::size_t offset, bool overwrite) {
  rope_apply(dx, dy, table, batch, seq_len, n_heads, head_dim, offset, T(-1), !overwrite);
}
TAPEGRAD_INSTANTIATE_KERNEL(rope_backward)

// ---- cross-entropy ----

template <class T>
T cross_entropy_forward(T* lse, const T* logits, const std::int32_t* targets, std::size_t n, std::size_t vocab) {
  detail::parallel_for(n, vocab * 8, [&](std::size_t r) {
    const T* xr = logits + r * vocab;
    T m = detail::max_of<Batch<T>>(xr, vocab);
    lse[r] = m + std::log(detail::sum_exp_shifted<Batch<T>>(xr, vocab, m));
  });
  double total = 0;  // summed in row order for thread-count independence
  for (std::size_t r = 0; r < n; ++r) total += double(lse[r]) - double(logits[r * vocab + std::size_t(targets[r])]);
  return T(total / double(n));
}
TAPEGRAD_INSTANTIATE_KERNEL(cross_entropy_forward)

// loss = mean_r (lse_r - x_{r,t_r}); d loss / d x_{r,j} = (softmax_{r,j} - [j == t_r]) / N.
template <class T>
void cross_entropy_backward(T* dlogits, T dloss, const T* logits, const T* lse, const std::int32_t* targets,
                            std::size_t n, std::size_t vocab) {
  T g = dloss / T(n);
  detail::parallel_for(n, vocab * 8, [&](std::size_t r) {
    const T* xr = logits + r * vocab;
    T* dr = dlogits + r * vocab;
    using B = Batch<T>;
    constexpr std::size_t W = B::size;
    for (std::size_t j = 0; j < vocab; j += W) {
      const std::size_t count = std::min(W, vocab - j);
      B d = fma(B(g), exp(detail::load_lanes<B>(xr + j, count) - B(lse[r])), detail::load_lanes<B>(dr + j, count));
      detail::store_lanes(d, dr + j, count);
    }
    dr[targets[r]] -= g;
  });
}
TAPEGRAD_INSTANTIATE_KERNEL(cross_entropy_backward)

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
