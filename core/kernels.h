// The math of the model, forward and backward side by side, as plain functions on raw row-major
// buffers (llm.c style). Training (the ops of core/ops.h) and decoding (nn/cache_pass.cpp) call
// these same functions. Templates on T are instantiated for float (the framework) and double (the
// gradient checks in tests/core). The SIMD kernels are named in one list, core/kernel_list.h;
// the products composed from them are declared here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/threads.h"  // set_num_threads was declared here in 0.1

namespace tapegrad {

namespace kernels {

// ---- the kernels' types ----------------------------------------------------------------------

/// The implementations of bf16_gemm, fastest first; all give the same bits (Note [bf16 products]).
enum class Bf16Path {
  amx_tiles,                ///< AMX's TDPBF16PS (AVX-512 level, CPUs with AMX-BF16, Linux)
  dot_product_instruction,  ///< AVX512_BF16's VDPBF16PS (AVX-512 level)
  fma_chain,                ///< fused multiply-adds (every level)
};

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
  /// Heads of k and v (grouped-query attention, Ainslie et al. 2023): query head h reads KV head
  /// h / (n_heads / n_kv_heads); it divides n_heads. 0 means n_heads (multi-head attention).
  std::size_t n_kv_heads = 0;
  std::size_t model_dim() const { return n_heads * head_dim; }  ///< n_heads * head_dim: q's and out's rows
  std::size_t kv_heads() const { return n_kv_heads == 0 ? n_heads : n_kv_heads; }  ///< n_kv_heads, or n_heads
  std::size_t kv_dim() const { return kv_heads() * head_dim; }  ///< kv_heads() * head_dim: k's and v's rows
  std::size_t group() const { return n_heads / kv_heads(); }    ///< query heads per KV head
  /// cached_attention_forward only (the other kernels compute every head): it computes query heads
  /// first_head..first_head+head_count-1, so that threads can share one sequence's heads; a head's
  /// output has the same bits whichever range computes it.
  std::size_t first_head = 0;
  std::size_t head_count = 0;  ///< query heads computed from first_head; 0: through the last
  std::size_t heads_end() const { return head_count == 0 ? n_heads : first_head + head_count; }  ///< past the range
  /// cached_attention_forward only: the positions each KV head's plane of values holds, at least
  /// kv_len (a cache's max_len); 0 means kv_len.
  std::size_t kv_capacity = 0;
  /// The floats between two KV heads' planes of values: kv_capacity (or kv_len) * head_dim.
  std::size_t value_plane() const { return (kv_capacity == 0 ? kv_len : kv_capacity) * head_dim; }
};

/// AdamW's per-step scalars (adamw_update), combined in double by the optimizer and rounded once.
template <class T> struct AdamWScalars {
  T decay = 1;            ///< 1 - lr * weight_decay, or 1 for parameters without decay
  T beta1 = 0;            ///< first-moment decay
  T one_minus_beta1 = 1;  ///< 1 - beta1
  T beta2 = 0;            ///< second-moment decay
  T one_minus_beta2 = 1;  ///< 1 - beta2
  T step_size = 0;        ///< lr / (1 - beta1^t)
  T inv_bc2_sqrt = 1;     ///< 1 / sqrt(1 - beta2^t)
  T eps = 0;              ///< added to the denominator
  T grad_scale = 1;       ///< each gradient is multiplied by it as read: gradient clipping folded in
};

/// Positions per block of a KV cache's keys (cached_attention_forward): block b holds keys
/// b*key_block..(b+1)*key_block-1 transposed, (KVH*Dh, key_block). A multiple of every SIMD width
/// (4, 8 and 16 floats), so that the layout does not depend on the level in use.
inline constexpr std::size_t key_block = 16;

// ---- the SIMD kernels (core/kernel_list.h) ---------------------------------------------------

#define TAPEGRAD_KERNEL(Return, name, parameters, arguments) template <class T> Return name parameters;
#include "core/kernel_list.h"

/// bf16_gemm_path as 0.3 spelled it: `instruction` chose VDPBF16PS over the FMA chain.
template <class T>
[[deprecated("use bf16_gemm_via(Bf16Path, ...)")]] void bf16_gemm_path(
    bool instruction, bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
    std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C, std::size_t ldc) {
  bf16_gemm_via<T>(instruction ? Bf16Path::dot_product_instruction : Bf16Path::fma_chain, transpose_a, transpose_b, M,
                   N, K, A, lda, B, ldb, accumulate, C, ldc);
}

// ---- matrix products composed from gemm ------------------------------------------------------
// Backward adds into every gradient it gets (a null pointer: not needed); with overwrite_dx
// (overwrite_dr), dx (dr) is written instead, its old values not read, as in core/kernel_list.h.

/// C (M, N) = op(A) op(B) (+ C when accumulating) at this thread's matmul precision
/// (core/precision.h): bf16_gemm under bf16 (T = float), gemm otherwise. The products below use it.
template <class T>
void precision_gemm(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const T* A,
                    std::size_t lda, const T* B, std::size_t ldb, bool accumulate, T* C, std::size_t ldc);
/// y = x w; x (M, K), w (K, N) -> y (M, N).
template <class T>
void matmul_forward(T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N);
/// dx += dy w^T (M, K); dw += x^T dy (K, N).
template <class T>
void matmul_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                     std::size_t N, bool overwrite_dx = false);
/// y = r + x w, the residual add folded into the matmul (one gemm with beta = 1); r and y (M, N)
/// may be the same buffer.
template <class T>
void add_matmul_forward(T* y, const T* r, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N);
/// dr += dy; then as matmul_backward.
template <class T>
void add_matmul_backward(T* dr, T* dx, T* dw, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                         std::size_t N, bool overwrite_dr = false, bool overwrite_dx = false);
/// y (M, N) = x w + b on every row: y starts as the bias rows, then one gemm with beta = 1.
template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t M, std::size_t K, std::size_t N);
/// dx += dy w^T; dw += x^T dy; db += sum over rows of dy (in row order). Any pointer may be null.
template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                     std::size_t N, bool overwrite_dx = false);

}  // namespace kernels
}  // namespace tapegrad
