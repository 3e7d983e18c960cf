// Differentiable ops: each validates its inputs, runs the forward kernel (core/kernels.h), and,
// when a Tape is recording and an input needs a gradient, records its backward on the tape.
// Shapes: leading axes of activations are flattened into rows ("(.., D)" = any number of rows).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/kernels.h"
#include "core/tape.h"

namespace tapegrad {

/// y = op(a) op(b). a (.., K) with b (K, N) -> (.., N); a (K, M) with transpose_a; or batched
/// a (B, M, K), b (B, K, N) with the flags on the last two axes. Saves a and b (no copies).
Var matmul(const Var& a, const Var& b, bool transpose_a = false, bool transpose_b = false);
/// y = r + x w (torch.addmm): x (.., K), w (K, N), r of the shape of x w. One gemm with beta = 1,
/// the form every residual projection of the decoder takes. Saves x and w. known_y, if given, is
/// this very call's output, computed before (rematerialisation, Note [Remat]): it is copied
/// rather than recomputed, since backward reads x and w but never y.
Var add_matmul(const Var& r, const Var& x, const Var& w, const Tensor* known_y = nullptr);
/// y = a + b, same shapes.
Var add(const Var& a, const Var& b);
/// y = x + bias on every row; x (.., C), bias (C).
Var add_bias(const Var& x, const Var& bias);
/// y = a * b elementwise, same shapes. Saves a and b.
Var mul(const Var& a, const Var& b);
/// y = s x.
Var scale(const Var& x, float s);
/// The same values under another shape with as many elements.
Var reshape(const Var& x, Shape shape);

/// y (N, D) = table (V, D)[ids]; every id must be < V. Saves the ids.
Var embedding(const Var& table, std::span<const std::int32_t> ids);
/// y = x * rsqrt(mean(x^2) + eps) * w; x (.., D), w (D) -> (.., D); saves rstd (rows).
Var rms_norm(const Var& x, const Var& weight, float eps = 1e-5f);
/// Interleaved-pair rotary embedding of every head; x (B, T, H*Dh), row t at position offset + t.
Var rope(const Var& x, std::shared_ptr<const kernels::RopeTable<float>> table, std::size_t n_heads,
         std::size_t offset = 0);
/// y = x * sigmoid(x). Saves x.
Var silu(const Var& x);
/// y = silu(a) * b, same shapes. Saves a and b.
Var swiglu(const Var& a, const Var& b);
/// Causal multi-head attention; q, k, v (B, T, H*Dh) -> (B, T, H*Dh); saves lse (B, H, T) and uses its output.
Var attention(const Var& q, const Var& k, const Var& v, std::size_t n_heads);
/// Mean over rows of -log softmax(logits)[target]; logits (.., V), one target per row; saves
/// logsumexp (rows). Every target must be < V.
Var cross_entropy(const Var& logits, std::span<const std::int32_t> targets);
/// Sum and mean of every element -> shape [].
Var sum(const Var& x);
Var mean(const Var& x);

}  // namespace tapegrad
