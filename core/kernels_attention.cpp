// Causal multi-head attention (Vaswani et al. 2017) over packed heads: head h of a row is columns
// [h*Dh, (h+1)*Dh) of the (.., H*Dh) q, k, v tensors, read in place through BLAS leading
// dimensions. Each (batch, head) pair is independent and runs on its own thread; within it,
// queries go in row blocks that only touch the keys their causal window reaches.
#include <cmath>
#include <vector>

#include "core/kernel_level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

constexpr std::size_t row_block = 64;

struct HeadView {  // one (batch, head) pair's slices
  std::size_t q_row0, kv_row0, col0, probs0;
};

HeadView head_view(const AttentionShape& s, std::size_t pair) {
  std::size_t b = pair / s.n_heads, h = pair % s.n_heads;
  return {b * s.q_len, b * s.kv_len, h * s.head_dim, pair * s.q_len * s.kv_len};
}

}  // namespace

template <class T>
void attention_forward(T* out, T* probs, const T* q, const T* k, const T* v, const AttentionShape& s) {
  const std::size_t D = s.model_dim(), Dh = s.head_dim, Tq = s.q_len, Tk = s.kv_len;
  const T scale = T(1) / std::sqrt(T(Dh));
  detail::parallel_for(s.batch * s.n_heads, Tq * Tk * Dh * 2, [&](std::size_t pair) {
    HeadView hv = head_view(s, pair);
    const T* qh = q + hv.q_row0 * D + hv.col0;
    const T* kh = k + hv.kv_row0 * D + hv.col0;
    const T* vh = v + hv.kv_row0 * D + hv.col0;
    T* oh = out + hv.q_row0 * D + hv.col0;
    T* ph = probs + hv.probs0;
    for (std::size_t i0 = 0; i0 < Tq; i0 += row_block) {
      std::size_t rows = std::min(row_block, Tq - i0), keys = s.q_offset + i0 + rows;
      T* p = ph + i0 * Tk;
      // scores (rows, keys) = q_blk k^T / sqrt(Dh)
      gemm<T>(false, true, rows, keys, Dh, scale, qh + i0 * D, D, kh, D, T(0), p, Tk);
      for (std::size_t i = 0; i < rows; ++i) {
        T* pr = p + i * Tk;
        std::size_t visible = s.q_offset + i0 + i + 1;  // masked scores are -inf: probability exactly 0
        T inv = T(1) / detail::exp_shifted_sum<Batch<T>>(pr, visible, detail::max_of<Batch<T>>(pr, visible));
        for (std::size_t j = 0; j < visible; ++j) pr[j] *= inv;
        std::fill(pr + visible, pr + Tk, T(0));
      }
      // out_blk (rows, Dh) = P_blk v
      gemm<T>(false, false, rows, Dh, keys, T(1), p, Tk, vh, D, T(0), oh + i0 * D, D);
    }
  });
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* probs, const T* q, const T* k, const T* v,
                        const AttentionShape& s) {
  const std::size_t D = s.model_dim(), Dh = s.head_dim, Tq = s.q_len, Tk = s.kv_len;
  const T scale = T(1) / std::sqrt(T(Dh));
  detail::parallel_for(s.batch * s.n_heads, Tq * Tk * Dh * 4, [&](std::size_t pair) {
    thread_local std::vector<T> scratch;
    scratch.resize(row_block * Tk);
    HeadView hv = head_view(s, pair);
    const T* qh = q + hv.q_row0 * D + hv.col0;
    const T* kh = k + hv.kv_row0 * D + hv.col0;
    const T* vh = v + hv.kv_row0 * D + hv.col0;
    const T* doh = dout + hv.q_row0 * D + hv.col0;
    const T* ph = probs + hv.probs0;
    for (std::size_t i0 = 0; i0 < Tq; i0 += row_block) {
      std::size_t rows = std::min(row_block, Tq - i0), keys = s.q_offset + i0 + rows;
      const T* p = ph + i0 * Tk;
      T* ds = scratch.data();  // (rows, keys)
      if (dv) gemm<T>(true, false, keys, Dh, rows, T(1), p, Tk, doh + i0 * D, D, T(1), dv + hv.kv_row0 * D + hv.col0, D);
      if (!dq && !dk) continue;
      // dP = dout_blk v^T; dS = P * (dP - sum_j dP_j P_j), with the 1/sqrt(Dh) of the scores folded in.
      gemm<T>(false, true, rows, keys, Dh, T(1), doh + i0 * D, D, vh, D, T(0), ds, keys);
      for (std::size_t i = 0; i < rows; ++i) {
        const T* pr = p + i * Tk;
        T* dr = ds + i * keys;
        T centre = detail::dot<Batch<T>>(dr, pr, keys);
        for (std::size_t j = 0; j < keys; ++j) dr[j] = pr[j] * (dr[j] - centre) * scale;
      }
      if (dq) gemm<T>(false, false, rows, Dh, keys, T(1), ds, keys, kh, D, T(1), dq + (hv.q_row0 + i0) * D + hv.col0, D);
      if (dk) gemm<T>(true, false, keys, Dh, rows, T(1), ds, keys, qh + i0 * D, D, T(1), dk + hv.kv_row0 * D + hv.col0, D);
    }
  });
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*, const AttentionShape&);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const AttentionShape&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const AttentionShape&);
template void attention_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, const AttentionShape&);

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
