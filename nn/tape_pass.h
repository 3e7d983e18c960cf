// TapePass: runs a model description on the tape, for training and the full forward.
//
// Note [One description]
// A model is described once, as a member template over the pass that runs it:
//
//   template <ModelPass P> typename P::Value run(P& p) const;
//
// written with the ops of the ModelPass concept (nn/model_pass.h: embed, linear, attention,
// residual, ...) and, for each block, p.block(x, remat, dropout_seed, describe_block) (run_blocks
// loops over a model's blocks so). Each model
// also instantiates run on ModelPassArchetype, so that an op the concept lacks does not compile.
// TapePass (this file) records the public ops on the tape (values are Vars): that is the
// training forward, with remat and dropout. CachePass (nn/cache_pass.h) runs the same ops as
// kernel calls on rows through a KVCache: that is prefill and the cached step, for one sequence
// or many. DecoderModel (nn/decoder_model.h) derives forward, loss, make_cache, prefill and step
// from run(), so a new architecture gets all of them, the KV cache included, by writing run()
// once. Write each op's result into a named local rather than nesting two ops as arguments of a
// third: C++ leaves the order of arguments unspecified, and the tape's order decides the bits of
// the gradients.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/kernels.h"
#include "core/random.h"
#include "core/remat.h"
#include "nn/model_pass.h"

namespace tapegrad::nn {

/// Runs a model description as recorded ops on the tape (training and the full forward).
class TapePass {
 public:
  using Value = Var;  ///< What the description's ops take and return.
  /// ids (batch * seq_len, row-major); dropout masks, when a Dropout is active, come from
  /// Rng(dropout_seed). With targets (one per id) it is a loss pass: the head returns the mean
  /// cross-entropy of its logits against them, fused (linear_cross_entropy), so that the logits
  /// are never held whole (Note [Loss pass]). Throws std::invalid_argument when the sizes disagree.
  TapePass(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len, std::uint64_t dropout_seed,
           std::span<const std::int32_t> targets = {});

  Var embed(const Embedding& table) const;                     ///< The ids' rows: (B, T, D).
  Var positions(const Embedding& table) const;                 ///< Rows 0..T-1: (T, D), broadcast.
  Var add(const Var& a, const Var& b) const { return a + b; }  ///< a + b.
  Var dropout(const Var& x, const Dropout& drop) { return drop.forward(x, rng_); }       ///< drop(x), this pass's mask.
  Var rms_norm(const Var& x, const RMSNorm& norm) const { return norm.forward(x); }      ///< norm(x).
  Var layer_norm(const Var& x, const LayerNorm& norm) const { return norm.forward(x); }  ///< norm(x).
  Var linear(const Var& x, const Linear& layer) const { return layer.forward(x); }       ///< x W (+ b).
  Var head(const Var& x, const Linear& layer) const;  ///< The logits x W (+ b), or in a loss pass their loss.
  Var tied_head(const Var& x, const Embedding& table) const;  ///< The logits x E^T, or in a loss pass their loss.
  /// RoPE on (B, T, D), row t at position t.
  Var rope(const Var& x, const std::shared_ptr<const kernels::RopeTable<float>>& table, std::size_t n_heads) const;
  /// Causal attention; drop (when active) on the probabilities.
  Var attention(const Var& q, const Var& k, const Var& v, AttentionHeads heads, const Dropout& drop);
  /// x + drop(h W (+ b)). Without bias or active dropout, one fused add_matmul.
  Var residual(const Var& x, const Var& h, const Linear& out, const Dropout& drop);
  /// residual() as a block's last op: in a remat re-run its output is already known, and
  /// add_matmul skips computing it (Note [Remat]).
  Var output_residual(const Var& x, const Var& h, const Linear& out, const Dropout& drop);
  Var swiglu(const Var& gate, const Var& up) const;  ///< silu(gate) * up.
  Var gelu_tanh(const Var& x) const;                 ///< GELU, tanh approximation.

  /// describe(inner_pass, x) on a pass of its own whose masks come from dropout_seed; with remat,
  /// as one tape entry that re-runs it in backward with the same masks (Note [Remat]).
  template <class Describe>
  Var block(const Var& x, bool remat, std::uint64_t dropout_seed, Describe describe) const {
    if (!remat) {
      TapePass inner(dropout_seed, nullptr);
      return describe(inner, x);
    }
    return rematerialize([dropout_seed, describe](const Var& input, const Tensor* known_output) {
      TapePass inner(dropout_seed, known_output);
      return describe(inner, input);
    }, x);
  }

 private:
  TapePass(std::uint64_t dropout_seed, const Tensor* known_output) : rng_(dropout_seed), known_output_(known_output) {}
  Var residual(const Var& x, const Var& h, const Linear& out, const Dropout& drop, const Tensor* known_output);

  std::span<const std::int32_t> ids_, targets_;
  std::size_t batch_ = 0, seq_len_ = 0;
  Rng rng_;
  const Tensor* known_output_ = nullptr;
};
static_assert(ModelPass<TapePass>);

}  // namespace tapegrad::nn
