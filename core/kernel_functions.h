// The kernel functions, declared without a namespace of their own: core/kernels.h includes this
// file into namespace tapegrad::kernels (the public API), and core/kernel_level.h includes it again
// into each SIMD level's namespace, where core/kernels_*.cpp define them. No include guard on
// purpose; the types it uses are in core/kernels.h.

// ---- matmul (BLAS) --------------------------------------------------------------------------

/// C (M, N) = alpha * op(A) op(B) + beta * C, row-major with leading dimensions; op(X) is X or
/// X^T by the flags. Splits the larger output dimension across threads when worth it; runs BLAS or
/// packed_gemm, whichever measured faster for this CPU and shape.
template <class T>
void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
          std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc);

/// gemm's own kernel, without BLAS: packed panels of op(B), a 6-row by 2- or 4-vector register
/// tile. gemm calls it where it measured faster than the BLAS; tests call it directly.
template <class T>
void packed_gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
                 std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc);

/// y = x w; x (M, K), w (K, N) -> y (M, N).
template <class T>
void matmul_forward(T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N);
/// dx += dy w^T (M, K); dw += x^T dy (K, N). With dx_fresh, dx = dy w^T instead: dx's buffer
/// holds no values yet (an input's first gradient), so it needs no zero-fill first.
template <class T>
void matmul_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                     std::size_t N, bool dx_fresh = false);
/// y = r + x w, the residual add folded into the matmul (one gemm with beta = 1); r and y (M, N)
/// may be the same buffer.
template <class T>
void add_matmul_forward(T* y, const T* r, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N);
/// y (M, N) = x w + b on every row: y starts as the bias rows, then one gemm with beta = 1.
template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, std::size_t M, std::size_t K, std::size_t N);
/// dx += dy w^T; dw += x^T dy; db += sum over rows of dy (in row order). Any pointer may be null.
/// dx_fresh as in matmul_backward.
template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                     std::size_t N, bool dx_fresh = false);
/// y (M, N) = x w (+ y when accumulating), x (M, K), w (K, N), without BLAS and row-stable: each
/// element is one FMA chain over k in order, so a row of y has the same bits whatever M is and
/// whichever rows share the call (batched decoding gives each sequence what it gets alone).
template <class T>
void row_stable_matmul(T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N, bool accumulate);
/// dr += dy (dr = dy when dr_fresh); then as matmul_backward.
template <class T>
void add_matmul_backward(T* dr, T* dx, T* dw, const T* dy, const T* x, const T* w, std::size_t M, std::size_t K,
                         std::size_t N, bool dr_fresh = false, bool dx_fresh = false);

// ---- elementwise ----------------------------------------------------------------------------

template <class T> void add_forward(T* y, const T* a, const T* b, std::size_t n);        // y = a + b
template <class T> void accumulate(T* dst, const T* src, std::size_t n);                 // dst += src
template <class T> void mul_forward(T* y, const T* a, const T* b, std::size_t n);        // y = a * b
/// da += dy * b; db += dy * a.
template <class T> void mul_backward(T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n);
template <class T> void scale_forward(T* y, const T* x, T s, std::size_t n);             // y = s x
template <class T> void scale_backward(T* dx, const T* dy, T s, std::size_t n);          // dx += s dy
/// y (R, C) = x (R, C) + bias (C) on every row.
template <class T> void add_bias_forward(T* y, const T* x, const T* bias, std::size_t rows, std::size_t cols);
/// dx += dy; dbias += sum over rows of dy.
template <class T>
void add_bias_backward(T* dx, T* dbias, const T* dy, std::size_t rows, std::size_t cols);

// ---- embedding ------------------------------------------------------------------------------

/// y (N, D) = table (V, D)[ids (N)]; ids must already be checked against V.
template <class T> void embedding_forward(T* y, const T* table, const std::int32_t* ids, std::size_t n, std::size_t dim);
/// dtable[ids[i]] += dy[i], in order (deterministic).
template <class T>
void embedding_backward(T* dtable, const T* dy, const std::int32_t* ids, std::size_t n, std::size_t dim);

// ---- RMSNorm (Zhang & Sennrich 2019) --------------------------------------------------------

/// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); x (R, D), w (D); writes rstd (R) if non-null.
template <class T>
void rms_norm_forward(T* y, T* rstd, const T* x, const T* w, std::size_t rows, std::size_t dim, T eps);
/// g = dy * w: dx += rstd * g - x * rstd^3 * mean(g * x); dw += sum over rows of dy * x * rstd.
template <class T>
void rms_norm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, std::size_t rows,
                       std::size_t dim);

// ---- RoPE, interleaved pairs (RoFormer, Su et al. 2021, Eq. 15) -----------------------------

/// x (B, T, H*Dh) -> y, position of row t = offset + t; y may alias x.
template <class T>
void rope_forward(T* y, const T* x, const RopeTable<T>& table, std::size_t batch, std::size_t seq_len,
                  std::size_t n_heads, std::size_t head_dim, std::size_t offset);
/// The rotation is orthogonal: dx += R(-a) dy; with overwrite, dx = R(-a) dy (dx's old values
/// are not read).
template <class T>
void rope_backward(T* dx, const T* dy, const RopeTable<T>& table, std::size_t batch, std::size_t seq_len,
                   std::size_t n_heads, std::size_t head_dim, std::size_t offset, bool overwrite);

// ---- SiLU and SwiGLU (Shazeer 2020) ---------------------------------------------------------

/// y = a * sigmoid(a).
template <class T> void silu_forward(T* y, const T* a, std::size_t n);
/// da += dy * s * (1 + a * (1 - s)), s = sigmoid(a).
template <class T> void silu_backward(T* da, const T* dy, const T* a, std::size_t n);
/// y = silu(a) * b.
template <class T> void swiglu_forward(T* y, const T* a, const T* b, std::size_t n);
/// da += dy * b * silu'(a); db += dy * silu(a); with overwrite, = instead of += (the old values
/// are not read).
template <class T>
void swiglu_backward(T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n, bool overwrite);

// ---- LayerNorm (Ba et al. 2016) -------------------------------------------------------------

/// LayerNorm over rows of dim: y = (x - mean) * rstd * w + b with the biased variance and
/// rstd = 1 / sqrt(var + eps); writes mean and rstd (rows) if non-null.
template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, std::size_t rows, std::size_t dim,
                        T eps);
/// From the saved mean and rstd: dx += rstd (g w - mean(g w) - xhat mean(g w xhat)); dw += g xhat;
/// db += g. Any gradient pointer may be null.
template <class T>
void layer_norm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                         std::size_t rows, std::size_t dim);

// ---- GELU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2) -------------------------------

/// y = x s with s = sigmoid(2 c (x + 0.044715 x^3)) = (1 + tanh(c (x + 0.044715 x^3))) / 2,
/// c = sqrt(2 / pi); writes s if non-null (all that backward needs besides x).
template <class T> void gelu_tanh_forward(T* y, T* s, const T* x, std::size_t n);
/// dx += dy (s + 2 x s (1 - s) c (1 + 3 * 0.044715 x^2)); with overwrite, dx = that product
/// (dx's buffer holds no values yet).
template <class T> void gelu_tanh_backward(T* dx, const T* dy, const T* x, const T* s, std::size_t n, bool overwrite);

// ---- causal multi-head attention (flash-style: Dao et al. 2022) ------------------------------

/// Per (batch, head): scores = q k^T / sqrt(Dh), -inf where key j > q_offset + i, softmax, times v.
/// q (B, Tq, H*Dh), k and v (B, Tk, H*Dh) -> out (B, Tq, H*Dh); writes lse (B, H, Tq), each row's
/// log-sum-exp of scores, if non-null: with out it is all backward needs (O(T) memory, not O(T^2)).
/// Computed in tiles with an online softmax; causal tiles are skipped.
template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionShape& s);
/// P = exp(scores - lse) recomputed per tile; dv += P^T dout; dS = P * (dP - rowsum(dout * out))
/// with dP = dout v^T; dq += dS k / sqrt(Dh); dk += dS^T q / sqrt(Dh). With overwrite, dq, dk
/// and dv (three distinct buffers holding no values yet) are written rather than added to.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, const AttentionShape& s, bool overwrite);

/// The KV-cache form, for the few query rows of one sequence: query i of q (q_len, H*Dh), at
/// position q_offset + i, attends to that sequence's keys and values 0..q_offset+i (kv_len, the
/// rows held, is at least q_offset + q_len). keys are in blocks of key_block positions, block b
/// (H*Dh, key_block) at keys + b * H*Dh * key_block; values are rows (kv_len, H*Dh). scratch holds
/// n_heads * (round_up(q_offset + q_len, key_block) + 1) elements. A query's result depends only on
/// its row and the cache, never on the other rows of q.
template <class T>
void cached_attention_forward(T* out, const T* q, const T* keys, const T* values, const AttentionShape& s, T* scratch);

// ---- cross-entropy --------------------------------------------------------------

/// Mean over rows of logsumexp(logits[i]) - logits[i, targets[i]]; logits (N, V); writes lse (N).
template <class T>
T cross_entropy_forward(T* lse, const T* logits, const std::int32_t* targets, std::size_t n, std::size_t vocab);
/// dlogits += dloss / N * (softmax(logits) - onehot(targets)).
template <class T>
void cross_entropy_backward(T* dlogits, T dloss, const T* logits, const T* lse, const std::int32_t* targets,
                            std::size_t n, std::size_t vocab);

