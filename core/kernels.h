// The math of the model, forward and backward side by side, as plain functions on raw row-major
// buffers (llm.c style). Training (core/ops) and inference (nn/kv_cache) call these same
// functions. Templates on T are instantiated for float (the framework) and double (the
// gradient checks in tests/core). Backward kernels accumulate (+=) into every gradient they get;
// a null gradient pointer means "not needed".
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tapegrad {

/// Threads used by the kernels (OpenMP row loops and split matmuls; BLAS itself runs on one
/// thread, so only one parallel runtime is ever active). n = 0 means "all cores".
void set_num_threads(int n);
/// The number of threads the kernels use.
int num_threads();

namespace kernels {

// ---- the kernels' types ----------------------------------------------------------------------

/// RoPE, interleaved pairs (RoFormer, Su et al. 2021, Eq. 15): cos and sin of m * theta^(-2i/Dh)
/// for m < max_len, i < Dh/2, computed in double and rounded once.
template <class T> struct RopeTable {
  std::size_t max_len = 0;  ///< positions
  std::size_t half = 0;     ///< pairs per head, Dh / 2
  std::vector<T> cos;       ///< (max_len, half)
  std::vector<T> sin;       ///< (max_len, half)
};
/// The RopeTable of max_len positions for heads of head_dim (even) with base theta.
template <class T> RopeTable<T> make_rope_table(std::size_t max_len, std::size_t head_dim, double theta = 10000.0);

/// The sizes of one attention call: batch sequences of q_len queries attending to kv_len keys.
struct AttentionShape {
  std::size_t batch = 1;     ///< sequences
  std::size_t q_len = 0;     ///< queries per sequence
  std::size_t kv_len = 0;    ///< keys per sequence; q_offset + q_len <= kv_len
  std::size_t n_heads = 1;   ///< heads per sequence
  std::size_t head_dim = 0;  ///< Dh, the size of one head
  std::size_t q_offset = 0;  ///< absolute position of query 0; query i sees keys 0..q_offset+i
  std::size_t model_dim() const { return n_heads * head_dim; }  ///< n_heads * head_dim
};

/// Positions per block of a KV cache's keys (cached_attention_forward): block b holds keys
/// b*key_block..(b+1)*key_block-1 transposed, (H*Dh, key_block). A multiple of every SIMD width
/// (4, 8 and 16 floats), so that the layout does not depend on the level in use.
inline constexpr std::size_t key_block = 16;

#include "core/kernel_functions.h"

// ---- kernels with no SIMD code of their own (plain loops, compiled once) -----------------------

/// LayerNorm over rows of dim: y = (x - mean) * rstd * w + b with the biased variance and
/// rstd = 1 / sqrt(var + eps), both accumulated in double; writes mean and rstd (rows) if non-null.
template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, std::size_t rows, std::size_t dim,
                        T eps);
/// From the saved mean and rstd: dx += rstd (g w - mean(g w) - xhat mean(g w xhat)); dw += g xhat;
/// db += g. Any gradient pointer may be null.
template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                         std::size_t rows, std::size_t dim);
/// GPT-2's gelu: y = x s with s = sigmoid(2 c (x + 0.044715 x^3)) = (1 + tanh(c (x + 0.044715 x^3))) / 2,
/// c = sqrt(2 / pi); writes s if non-null (all that backward needs besides x).
template <class T> void gelu_tanh_forward(T* y, T* s, const T* x, std::size_t n);
/// dx += dy (s + 2 x s (1 - s) c (1 + 3 * 0.044715 x^2)).
template <class T> void gelu_tanh_backward(T* dx, const T* dy, const T* x, const T* s, std::size_t n);

}  // namespace kernels
}  // namespace tapegrad
