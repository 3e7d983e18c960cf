// The SIMD kernels, one entry each: TAPEGRAD_KERNEL(return type, name, (parameters), (arguments)),
// templates on the scalar type T. This list is the one place a kernel is named: core/kernels.h
// declares the public kernels from it, core/kernels/level.h each SIMD level's copies,
// core/kernels/kernel_table.h the members of a level's table, core/kernels/table.cpp their fill,
// and core/kernels.cpp the public functions that call the level in use. Adding a kernel is an
// entry here and its definition in a core/kernels/*.cpp file (followed by
// TAPEGRAD_INSTANTIATE_KERNEL). The includer defines TAPEGRAD_KERNEL; this file undefines it, and
// has no include guard on purpose. The types it uses are in core/kernels.h.
//
// Every kernel follows the position rule (docs/architecture.md, "Position independence"), which
// tests/core/test_kernel_positions.cpp checks bit for bit.
//
// Gradient kernels add (+=) into every gradient they get, a null pointer meaning "not needed";
// those with an `overwrite` flag write (=) instead when it is set, without reading the buffer's
// old values (an input's first gradient: its buffer holds no values yet).

// ---- matmul ---------------------------------------------------------------------------------

/// C (M, N) = alpha * op(A) op(B) + beta * C, row-major with leading dimensions; op(X) is X or
/// X^T by the flags. Splits the larger output dimension across threads when worth it; runs BLAS or
/// packed_gemm, whichever measured faster for this CPU and shape.
TAPEGRAD_KERNEL(void, gemm,
                (bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
                 std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc),
                (transpose_a, transpose_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
/// gemm's own kernel, without BLAS: packed panels of op(B), a 6-row by 2- or 4-vector register
/// tile. gemm calls it where it measured faster than the BLAS; tests call it directly.
TAPEGRAD_KERNEL(void, packed_gemm,
                (bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
                 std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc),
                (transpose_a, transpose_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
/// y (M, N) = x w (+ y when accumulating), x (M, K), w (K, N), without BLAS and row-stable: each
/// element is one FMA chain over k in order, so a row of y has the same bits whatever M is and
/// whichever rows share the call (batched decoding gives each sequence what it gets alone), and
/// whatever the thread count (the outputs are split across the threads).
TAPEGRAD_KERNEL(void, row_stable_matmul,
                (T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N, bool accumulate),
                (y, x, w, M, K, N, accumulate))
/// y (M, N) = x w^T, x (M, K), w (N, K) (a head tied to the embedding), row-stable as
/// row_stable_matmul: each element is gemm's for that row alone, whatever M and the thread count.
TAPEGRAD_KERNEL(void, row_stable_matmul_transposed,
                (T* y, const T* x, const T* w, std::size_t M, std::size_t K, std::size_t N), (y, x, w, M, K, N))

/// C (M, N) = op(A) op(B) (+ C when accumulating) with bfloat16 inputs (rounded to nearest even)
/// and float32 accumulation: per element and 32-element block of k, a chain over the even k and one
/// over the odd k, their sum added to C, the arithmetic of AMX's TDPBF16PS (Note [bf16 products],
/// core/kernels/matmul_bf16.cpp), bit for bit at every level: on AMX tiles where the CPU has them
/// (unless TAPEGRAD_AMX=0), by VDPBF16PS where it outruns an FMA chain (timed once), by the chain
/// otherwise. Float whatever T (T = double: the same kernel).
TAPEGRAD_KERNEL(void, bf16_gemm,
                (bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
                 std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C, std::size_t ldc),
                (transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc))
/// bf16_gemm by the path asked for (Bf16Path; where the CPU or level lacks it, the next one down),
/// whatever TAPEGRAD_AMX says: tests compare them.
TAPEGRAD_KERNEL(void, bf16_gemm_via,
                (Bf16Path path, bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K,
                 const float* A, std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C,
                 std::size_t ldc),
                (path, transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc))

// ---- elementwise ----------------------------------------------------------------------------

/// y = a + b.
TAPEGRAD_KERNEL(void, add_forward, (T* y, const T* a, const T* b, std::size_t n), (y, a, b, n))
/// dst += src.
TAPEGRAD_KERNEL(void, accumulate, (T* dst, const T* src, std::size_t n), (dst, src, n))
/// y = a * b.
TAPEGRAD_KERNEL(void, mul_forward, (T* y, const T* a, const T* b, std::size_t n), (y, a, b, n))
/// da += dy * b; db += dy * a.
TAPEGRAD_KERNEL(void, mul_backward, (T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n),
                (da, db, dy, a, b, n))
/// y = s x.
TAPEGRAD_KERNEL(void, scale_forward, (T* y, const T* x, T s, std::size_t n), (y, x, s, n))
/// dx += s dy.
TAPEGRAD_KERNEL(void, scale_backward, (T* dx, const T* dy, T s, std::size_t n), (dx, dy, s, n))
/// y (R, C) = x (R, C) + bias (C) on every row.
TAPEGRAD_KERNEL(void, add_bias_forward, (T* y, const T* x, const T* bias, std::size_t rows, std::size_t cols),
                (y, x, bias, rows, cols))
/// dx += dy; dbias += sum over rows of dy.
TAPEGRAD_KERNEL(void, add_bias_backward, (T* dx, T* dbias, const T* dy, std::size_t rows, std::size_t cols),
                (dx, dbias, dy, rows, cols))

// ---- embedding ------------------------------------------------------------------------------

/// y (N, D) = table (V, D)[ids (N)]; ids must already be checked against V.
TAPEGRAD_KERNEL(void, embedding_forward,
                (T* y, const T* table, const std::int32_t* ids, std::size_t n, std::size_t dim),
                (y, table, ids, n, dim))
/// dtable[ids[i]] += dy[i], in order (deterministic).
TAPEGRAD_KERNEL(void, embedding_backward,
                (T* dtable, const T* dy, const std::int32_t* ids, std::size_t n, std::size_t dim),
                (dtable, dy, ids, n, dim))

// ---- RMSNorm (Zhang & Sennrich 2019) --------------------------------------------------------

/// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); x (R, D), w (D); writes rstd (R) if non-null.
TAPEGRAD_KERNEL(void, rms_norm_forward,
                (T* y, T* rstd, const T* x, const T* w, std::size_t rows, std::size_t dim, T eps),
                (y, rstd, x, w, rows, dim, eps))
/// g = dy * w: dx += rstd * g - x * rstd^3 * mean(g * x); dw += sum over rows of dy * x * rstd.
TAPEGRAD_KERNEL(void, rms_norm_backward,
                (T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, std::size_t rows,
                 std::size_t dim),
                (dx, dw, dy, x, w, rstd, rows, dim))

// ---- LayerNorm (Ba et al. 2016) -------------------------------------------------------------

/// LayerNorm over rows of dim: y = (x - mean) * rstd * w + b with the biased variance and
/// rstd = 1 / sqrt(var + eps); writes mean and rstd (rows) if non-null.
TAPEGRAD_KERNEL(void, layer_norm_forward,
                (T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, std::size_t rows, std::size_t dim,
                 T eps),
                (y, mean, rstd, x, w, b, rows, dim, eps))
/// From the saved mean and rstd: dx += rstd (g w - mean(g w) - xhat mean(g w xhat)); dw += g xhat;
/// db += g. Any gradient pointer may be null.
TAPEGRAD_KERNEL(void, layer_norm_backward,
                (T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                 std::size_t rows, std::size_t dim),
                (dx, dw, db, dy, x, w, mean, rstd, rows, dim))

// ---- RoPE, interleaved pairs (RoFormer, Su et al. 2021, Eq. 15) -----------------------------

/// x (B, T, H*Dh) -> y, position of row t = offset + t; y may alias x.
TAPEGRAD_KERNEL(void, rope_forward,
                (T* y, const T* x, const RopeTable<T>& table, std::size_t batch, std::size_t seq_len,
                 std::size_t n_heads, std::size_t head_dim, std::size_t offset),
                (y, x, table, batch, seq_len, n_heads, head_dim, offset))
/// The rotation is orthogonal: dx += R(-a) dy (dx = R(-a) dy with overwrite).
TAPEGRAD_KERNEL(void, rope_backward,
                (T* dx, const T* dy, const RopeTable<T>& table, std::size_t batch, std::size_t seq_len,
                 std::size_t n_heads, std::size_t head_dim, std::size_t offset, bool overwrite),
                (dx, dy, table, batch, seq_len, n_heads, head_dim, offset, overwrite))

// ---- SiLU and SwiGLU (Shazeer 2020) ---------------------------------------------------------

/// y = a * sigmoid(a).
TAPEGRAD_KERNEL(void, silu_forward, (T* y, const T* a, std::size_t n), (y, a, n))
/// da += dy * s * (1 + a * (1 - s)), s = sigmoid(a).
TAPEGRAD_KERNEL(void, silu_backward, (T* da, const T* dy, const T* a, std::size_t n), (da, dy, a, n))
/// y = silu(a) * b.
TAPEGRAD_KERNEL(void, swiglu_forward, (T* y, const T* a, const T* b, std::size_t n), (y, a, b, n))
/// da += dy * b * silu'(a); db += dy * silu(a) (both written with overwrite).
TAPEGRAD_KERNEL(void, swiglu_backward,
                (T* da, T* db, const T* dy, const T* a, const T* b, std::size_t n, bool overwrite),
                (da, db, dy, a, b, n, overwrite))

// ---- GELU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2) -------------------------------

/// y = x s with s = sigmoid(2 c (x + 0.044715 x^3)) = (1 + tanh(c (x + 0.044715 x^3))) / 2,
/// c = sqrt(2 / pi); writes s if non-null (all that backward needs besides x).
TAPEGRAD_KERNEL(void, gelu_tanh_forward, (T* y, T* s, const T* x, std::size_t n), (y, s, x, n))
/// dx += dy (s + 2 x s (1 - s) c (1 + 3 * 0.044715 x^2)) (written with overwrite).
TAPEGRAD_KERNEL(void, gelu_tanh_backward,
                (T* dx, const T* dy, const T* x, const T* s, std::size_t n, bool overwrite),
                (dx, dy, x, s, n, overwrite))

// ---- causal multi-head attention (flash-style: Dao et al. 2022) ------------------------------

/// Per (batch, head h): scores = q k^T / sqrt(Dh) with k and v of KV head h / s.group(), -inf where
/// key j > q_offset + i, softmax, times v. q (B, Tq, H*Dh), k and v (B, Tk, KVH*Dh) -> out
/// (B, Tq, H*Dh); writes lse (B, H, Tq), each row's log-sum-exp of scores, if non-null: with out it
/// is all backward needs (O(T) memory, not O(T^2)). Computed in tiles with an online softmax; causal
/// tiles are skipped. Throws std::invalid_argument when q_offset + q_len exceeds kv_len or the KV
/// heads do not divide the heads.
TAPEGRAD_KERNEL(void, attention_forward,
                (T* out, T* lse, const T* q, const T* k, const T* v, const AttentionShape& s),
                (out, lse, q, k, v, s))
/// P = exp(scores - lse) recomputed per tile; dv += P^T dout; dS = P * (dP - rowsum(dout * out))
/// with dP = dout v^T; dq += dS k / sqrt(Dh); dk += dS^T q / sqrt(Dh). A KV head's dk and dv sum
/// its query heads' parts in head order, whatever the threads. With overwrite, dq, dk and dv (three
/// distinct buffers) are written. Throws as attention_forward.
TAPEGRAD_KERNEL(void, attention_backward,
                (T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                 const T* v, const AttentionShape& s, bool overwrite),
                (dq, dk, dv, dout, out, lse, q, k, v, s, overwrite))
/// The KV-cache form, for the few query rows of one sequence: query i of q (q_len, H*Dh), at
/// position q_offset + i, attends to that sequence's keys and values 0..q_offset+i (kv_len, the
/// rows held, is at least q_offset + q_len); head h reads KV head h / s.group(). keys are in blocks
/// of key_block positions, block b (KVH*Dh, key_block) at keys + b * KVH*Dh * key_block; values are
/// in a plane per KV head, KV head g's rows 0..kv_len-1 (of s.kv_capacity, Dh each) at values + g *
/// s.value_plane(), so that a head's values are one run of bytes. scratch holds n_heads *
/// (round_up(q_offset + q_len, key_block) + 1) elements; calls on disjoint head ranges
/// (s.first_head, s.head_count) may share it, each using its heads' part. A query's result depends
/// only on its row and the cache, never on the other rows of q, and a head's only on that head.
/// Throws std::invalid_argument for a batch other than 1, q_offset + q_len past kv_len, a
/// kv_capacity below kv_len, KV heads that do not divide the heads, or a head range past the heads.
TAPEGRAD_KERNEL(void, cached_attention_forward,
                (T* out, const T* q, const T* keys, const T* values, const AttentionShape& s, T* scratch),
                (out, q, keys, values, s, scratch))
/// cached_attention_forward over a 16-bit cache: keys and values held as IEEE half bits (rounded by
/// round_to_halves), in the same layout. The bits of cached_attention_forward over a cache holding
/// the halves' values as T.
TAPEGRAD_KERNEL(void, cached_attention_forward_f16,
                (T* out, const T* q, const std::uint16_t* keys, const std::uint16_t* values, const AttentionShape& s,
                 T* scratch),
                (out, q, keys, values, s, scratch))
/// out[i] = x[i] rounded to IEEE half bits, to nearest even as F16C's vcvtps2ph: from 65520 on an
/// infinity, a NaN quiet with its sign and top payload bits (a double rounded to float first).
TAPEGRAD_KERNEL(void, round_to_halves, (std::uint16_t* out, const T* x, std::size_t n), (out, x, n))

// ---- optimizers -----------------------------------------------------------------------------

/// AdamW on n elements (decoupled weight decay, PyTorch's formula), g = grad_scale grad:
/// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p = p decay - step_size m / (sqrt(v) inv_bc2_sqrt + eps).
TAPEGRAD_KERNEL(void, adamw_update, (T* p, T* m, T* v, const T* g, std::size_t n, const AdamWScalars<T>& s),
                (p, m, v, g, n, s))
/// The sum of x[i]^2 in double: blocks of 4096 elements, each in eight chains, the blocks' sums
/// added in order, so that the result does not depend on the thread count or the SIMD level.
TAPEGRAD_KERNEL(double, sum_squares, (const T* x, std::size_t n), (x, n))

// ---- cross-entropy --------------------------------------------------------------------------

/// Mean over rows of logsumexp(logits[i]) - logits[i, targets[i]]; logits (N, V); writes lse (N).
TAPEGRAD_KERNEL(T, cross_entropy_forward,
                (T* lse, const T* logits, const std::int32_t* targets, std::size_t n, std::size_t vocab),
                (lse, logits, targets, n, vocab))
/// dlogits += dloss / N * (softmax(logits) - onehot(targets)).
TAPEGRAD_KERNEL(void, cross_entropy_backward,
                (T* dlogits, T dloss, const T* logits, const T* lse, const std::int32_t* targets, std::size_t n,
                 std::size_t vocab),
                (dlogits, dloss, logits, lse, targets, n, vocab))
/// The mean over rows of the cross-entropy of logits = x op(w) (+ bias) against targets, holding
/// at most chunk_rows rows of logits (in scratch, (chunk_rows, V)): x (N, D); w (D, V), or (V, D)
/// with transpose_w; bias (V) or null. With dx, dw or db, also their gradients of that mean, from
/// each chunk's g = (softmax - onehot(targets)) / N (cross_entropy_backward's bits): dx = g op(w)^T,
/// dw += x^T g (or g^T x transposed), db += the column sums of g. Chunks go in row order, so the
/// sums over rows do not depend on the thread count. With bf16_products (T = float), every product
/// is bf16_gemm's, as precision_gemm's under Precision::bf16.
TAPEGRAD_KERNEL(T, linear_cross_entropy,
                (T* dx, T* dw, T* db, const T* x, const T* w, const T* bias, const std::int32_t* targets,
                 std::size_t n, std::size_t dim, std::size_t vocab, bool transpose_w, std::size_t chunk_rows,
                 T* scratch, bool overwrite, bool bf16_products),
                (dx, dw, db, x, w, bias, targets, n, dim, vocab, transpose_w, chunk_rows, scratch, overwrite,
                 bf16_products))

#undef TAPEGRAD_KERNEL
