// Differentiable ops with PyTorch's names and semantics. Each validates its inputs, runs its
// forward and records its backward through core/op_recording.h, the API users' own ops use too.
// Two tiers: general primitives (broadcasting elementwise ops, axis reductions, views), from
// which any layer composes with no backward of its own; and fused ops (rms_norm, layer_norm,
// attention, cross_entropy, rope, swiglu) that pay for themselves, each tested against its
// composition (tests/core/test_fused_vs_composed.cpp).
// Shapes: leading axes of activations are flattened into rows ("(.., D)" = any number of rows).
// An axis argument may be negative (counted from the end, as in PyTorch).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/kernels.h"
#include "core/op_recording.h"
#include "core/tape.h"

namespace tapegrad {

class Rng;

// ---- Fused and BLAS ops ---------------------------------------------------------------------

/// y = op(a) op(b). a (.., K) with b (K, N) -> (.., N); a (K, M) with transpose_a; batched
/// a (B, M, K), b (B, K, N) with the flags on the last two axes; or, as torch.matmul, any
/// a (.., M, K), b (.., K, N) whose leading axes broadcast. Saves a and b (no copies).
Var matmul(const Var& a, const Var& b, bool transpose_a = false, bool transpose_b = false);
/// y = r + x w (torch.addmm): x (.., K), w (K, N), r of the shape of x w (a residual) or a bias
/// (N) added to every row. One gemm with beta = 1, the form of every residual projection and of
/// a linear layer with a bias. Saves x and w. known_y, if given, is
/// this very call's output, computed before (rematerialisation, Note [Remat]): it is copied
/// rather than recomputed, since backward reads x and w but never y.
Var add_matmul(const Var& r, const Var& x, const Var& w, const Tensor* known_y = nullptr);
/// y = x + bias on every row; x (.., C), bias (C).
Var add_bias(const Var& x, const Var& bias);
/// y = s x.
Var scale(const Var& x, float s);

/// y (N, D) = table (V, D)[ids]; every id must be < V. Saves the ids.
Var embedding(const Var& table, std::span<const std::int32_t> ids);
/// y = x * rsqrt(mean(x^2) + eps) * w; x (.., D), w (D) -> (.., D); saves rstd (rows).
Var rms_norm(const Var& x, const Var& weight, float eps = 1e-5f);
/// Interleaved-pair rotary embedding of every head; x (B, T, H*Dh), row t at position offset + t.
Var rope(const Var& x, std::shared_ptr<const kernels::RopeTable<float>> table, std::size_t n_heads,
         std::size_t offset = 0);
/// y = silu(a) * b, same shapes. Saves a and b.
Var swiglu(const Var& a, const Var& b);
/// The heads of an attention: n_heads query heads reading n_kv_heads heads of keys and values
/// (grouped-query attention, Ainslie et al. 2023: query head h reads KV head h / (n_heads /
/// n_kv_heads)). A bare count is multi-head attention, n_kv_heads = n_heads.
struct AttentionHeads {
  std::size_t n_heads = 1;     ///< query heads: q and the output are (.., n_heads * Dh)
  std::size_t n_kv_heads = 1;  ///< key and value heads, dividing n_heads: k and v are (.., n_kv_heads * Dh)
  /// Multi-head attention: `heads` heads of queries, keys and values (implicit: a count is MHA).
  AttentionHeads(std::size_t heads) : n_heads(heads), n_kv_heads(heads) {}  // NOLINT(google-explicit-constructor)
  /// Grouped-query attention: `heads` query heads over `kv_heads` key and value heads.
  AttentionHeads(std::size_t heads, std::size_t kv_heads) : n_heads(heads), n_kv_heads(kv_heads) {}
};

/// Causal attention; q (B, T, H*Dh), k and v (B, T, KVH*Dh) -> (B, T, H*Dh); saves lse (B, H, T)
/// and uses its output. A KV head's gradient sums its query heads' in a fixed order.
Var attention(const Var& q, const Var& k, const Var& v, AttentionHeads heads);
/// Mean over rows of -log softmax(logits)[target]; logits (.., V), one target per row; saves
/// logsumexp (rows). Every target must be < V.
Var cross_entropy(const Var& logits, std::span<const std::int32_t> targets);
/// Mean over the rows whose target is not ignore_index of -log softmax(logits)[target]
/// (torch's ignore_index); at least one row must count. Saves the softmax (rows, V).
Var cross_entropy(const Var& logits, std::span<const std::int32_t> targets, std::int32_t ignore_index);
/// cross_entropy(x op(w) (+ bias), targets) without holding the logits: a language model's head
/// and loss. x (.., D); weight (D, V), or (V, D) with transpose_weight (a tied embedding); bias (V)
/// or undefined; one target per row, each < V. The logits are made a chunk of rows at a time (at
/// most 48 MiB of them); when recording, the gradients of the inputs that need one are made then
/// too and saved (their sizes), and backward scales them by the result's gradient.
Var linear_cross_entropy(const Var& x, const Var& weight, std::span<const std::int32_t> targets,
                         bool transpose_weight = false, const Var& bias = Var());
/// y = (x - mean) * rsqrt(var + eps) * w + b over the last axis (biased variance); x (.., D),
/// w, b (D). Saves mean and rstd (rows).
Var layer_norm(const Var& x, const Var& weight, const Var& bias, float eps = 1e-5f);

// ---- Elementwise, unary (any shape; y has x's shape) -----------------------------------------
Var neg(const Var& x);                       ///< -x
Var exp(const Var& x);                       ///< e^x; saves y
Var log(const Var& x);                       ///< ln x; saves x
Var sqrt(const Var& x);                      ///< sqrt(x); saves y
Var rsqrt(const Var& x);                     ///< 1 / sqrt(x); saves y
Var abs(const Var& x);                       ///< |x|, derivative sign(x) (0 at 0); saves x
Var tanh(const Var& x);                      ///< tanh x; saves y
Var sigmoid(const Var& x);                   ///< 1 / (1 + e^-x); saves y
Var relu(const Var& x);                      ///< max(x, 0), derivative 0 at 0; saves x
/// x Phi(x) with the exact erf, or with approximate_tanh 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))
/// (torch's approximate="tanh"). Saves x.
Var gelu(const Var& x, bool approximate_tanh = false);
Var silu(const Var& x);                      ///< x sigmoid(x); saves x
Var pow(const Var& x, float exponent);       ///< x^p; saves x
Var square(const Var& x);                    ///< x^2; saves x

// ---- Elementwise, binary with numpy broadcasting; y has broadcast(a, b)'s shape -------------
// Gradients reach a and b through sum_to (core/op_recording.h), the one place broadcasts are
// undone.
Var add(const Var& a, const Var& b);         ///< a + b; keeps a and b (to reach their gradients)
Var sub(const Var& a, const Var& b);         ///< a - b; keeps a and b (to reach their gradients)
Var mul(const Var& a, const Var& b);         ///< a * b; saves a and b
Var div(const Var& a, const Var& b);         ///< a / b; saves a and b
Var maximum(const Var& a, const Var& b);     ///< max(a, b); ties send the gradient to a; saves a and b
Var add(const Var& a, float b);              ///< a + b for a scalar b
Var sub(const Var& a, float b);              ///< a - b for a scalar b
Var sub(float a, const Var& b);              ///< a - b for a scalar a
Var mul(const Var& a, float b);              ///< a * b for a scalar b
Var div(const Var& a, float b);              ///< a / b for a scalar b
Var div(float a, const Var& b);              ///< a / b for a scalar a; saves y and b
Var maximum(const Var& a, float b);          ///< max(a, b) for a scalar b (ties to a); saves a
/// x repeated along its size-1 (or missing leading) axes to shape (torch.broadcast_to).
Var expand(const Var& x, const Shape& shape);

Var operator+(const Var& a, const Var& b);   ///< add(a, b)
Var operator-(const Var& a, const Var& b);   ///< sub(a, b)
Var operator*(const Var& a, const Var& b);   ///< mul(a, b)
Var operator/(const Var& a, const Var& b);   ///< div(a, b)
Var operator+(const Var& a, float b);        ///< add(a, b)
Var operator-(const Var& a, float b);        ///< sub(a, b)
Var operator*(const Var& a, float b);        ///< mul(a, b)
Var operator/(const Var& a, float b);        ///< div(a, b)
Var operator+(float a, const Var& b);        ///< add(b, a)
Var operator-(float a, const Var& b);        ///< sub(a, b)
Var operator*(float a, const Var& b);        ///< mul(b, a)
Var operator/(float a, const Var& b);        ///< div(a, b)
Var operator-(const Var& x);                 ///< neg(x)

// ---- Reductions ------------------------------------------------------------------------------
// Over every element -> shape [], or over one axis (keepdim keeps it with size 1). max sends the
// gradient to the first maximum (torch.max(x, dim).values) and saves its index.
Var sum(const Var& x);                                      ///< The sum of every element -> []
Var mean(const Var& x);                                     ///< The mean of every element -> [] (sum, then scale)
Var max(const Var& x);                                      ///< The largest element -> []; saves its index
Var sum(const Var& x, int axis, bool keepdim = false);      ///< The sum along axis
Var mean(const Var& x, int axis, bool keepdim = false);     ///< The mean along axis
Var max(const Var& x, int axis, bool keepdim = false);      ///< The largest along axis; saves the indices

// ---- Views and shapes (copies: a Tensor is always contiguous) --------------------------------
/// The same values under another shape with as many elements (every size given; view infers one).
Var reshape(const Var& x, Shape shape);
/// reshape with signed sizes (torch.Tensor.view): one size may be -1 (inferred).
Var view(const Var& x, std::vector<std::int64_t> shape);
/// y's axis i is x's axis dims[i].
Var permute(const Var& x, std::vector<int> dims);
/// Swaps two axes.
Var transpose(const Var& x, int axis0, int axis1);
/// x[.., start:end, ..] along axis (torch.narrow(x, axis, start, end - start)).
Var slice(const Var& x, int axis, std::size_t start, std::size_t end);
/// Joins along axis; every other size must agree (torch.cat).
Var cat(const std::vector<Var>& xs, int axis);
/// cat under its other name (torch.concat).
Var concat(const std::vector<Var>& xs, int axis);
/// Pieces of split_size along axis (the last may be shorter).
std::vector<Var> split(const Var& x, std::size_t split_size, int axis);
/// Pieces of the given sizes along axis (they must add up to its size).
std::vector<Var> split(const Var& x, const std::vector<std::size_t>& sizes, int axis);

// ---- Normalisation, probabilities, losses, dropout -------------------------------------------
/// y = exp(x) / sum(exp(x)) along axis (max-subtracted); saves y.
Var softmax(const Var& x, int axis = -1);
/// y = x - log(sum(exp(x))) along axis; saves y.
Var log_softmax(const Var& x, int axis = -1);
/// mean((a - b)^2); composed from primitives (no backward of its own).
Var mse_loss(const Var& a, const Var& b);
/// In training: each element zeroed with probability p, the rest scaled by 1 / (1 - p), the
/// mask drawn from rng (in storage order, one uniform() per element); saves the mask. p = 0 or
/// !training: x itself.
Var dropout(const Var& x, float p, bool training, Rng& rng);

}  // namespace tapegrad
