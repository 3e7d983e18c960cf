// ModelPass: the ops a model description may use (Note [One description], nn/tape_pass.h), as
// the concept that TapePass and CachePass satisfy and every run<P> requires; and
// ModelPassArchetype, a pass with exactly those ops, on which each description is instantiated
// so that a description using an op the concept lacks fails to compile, naming the op.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/kernels.h"
#include "core/ops.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/rms_norm.h"

namespace tapegrad::nn {

/// What a pass's block() is given: a block's description, (inner pass, x) -> the block's output.
template <class P>
struct BlockDescription {
  /// Declared only: the concept asks whether block() accepts it.
  typename P::Value operator()(P& inner, const typename P::Value& x) const;
};

/// T is the pass P's value type: what every op of a description returns.
template <class T, class P>
concept ValueOf = std::same_as<T, typename P::Value>;

/// A pass that runs a model description: its values (P::Value) and the ops on them. A pass that
/// lacks one, or gives it another signature, is refused with the op's expression in the message.
template <class P>
concept ModelPass = requires(P& p, const typename P::Value& x, const typename P::Value& y,
                             const typename P::Value& z, const Embedding& table, const RMSNorm& rms,
                             const LayerNorm& norm, const Linear& layer, const Dropout& drop,
                             const std::shared_ptr<const kernels::RopeTable<float>>& rope_table,
                             std::size_t n_heads, AttentionHeads heads, bool remat, std::uint64_t dropout_seed,
                             BlockDescription<P> describe) {
  requires std::copyable<typename P::Value>;  // assigned, as in x = p.block(x, ...)
  { p.embed(table) } -> ValueOf<P>;                             // the ids' rows of the table
  { p.positions(table) } -> ValueOf<P>;                         // the rows of the tokens' positions
  { p.add(x, y) } -> ValueOf<P>;                                // x + y
  { p.dropout(x, drop) } -> ValueOf<P>;                         // drop(x)
  { p.rms_norm(x, rms) } -> ValueOf<P>;                         // rms(x)
  { p.layer_norm(x, norm) } -> ValueOf<P>;                      // norm(x)
  { p.linear(x, layer) } -> ValueOf<P>;                         // x W (+ b)
  { p.head(x, layer) } -> ValueOf<P>;                           // the logits x W (+ b) (a loss pass: their loss)
  { p.tied_head(x, table) } -> ValueOf<P>;                      // the logits x E^T (a loss pass: their loss)
  { p.rope(x, rope_table, n_heads) } -> ValueOf<P>;             // RoPE at each row's position
  { p.attention(x, y, z, heads, drop) } -> ValueOf<P>;          // causal attention of q, k, v
  { p.residual(x, y, layer, drop) } -> ValueOf<P>;              // x + drop(y W (+ b))
  { p.output_residual(x, y, layer, drop) } -> ValueOf<P>;       // residual() as a block's last op
  { p.swiglu(x, y) } -> ValueOf<P>;                             // silu(gate) * up
  { p.gelu_tanh(x) } -> ValueOf<P>;                             // GELU, tanh approximation
  { p.block(x, remat, dropout_seed, describe) } -> ValueOf<P>;  // describe(inner pass, x)
};

/// The ops of ModelPass and nothing else, on values that offer nothing of their own. Each model
/// instantiates its run() on it (never to call it): a description that uses an op missing here,
/// or a Var's own operators, fails to compile
/// ("'struct ModelPassArchetype' has no member named 'op'"). Its list is ModelPass's; the
/// static_assert below keeps it from lacking one.
struct ModelPassArchetype {
  /// A value with no operations.
  struct Value {};
  /// @{ The ops of ModelPass, doing nothing.
  Value embed(const Embedding&) { return {}; }
  Value positions(const Embedding&) { return {}; }
  Value add(const Value&, const Value&) { return {}; }
  Value dropout(const Value&, const Dropout&) { return {}; }
  Value rms_norm(const Value&, const RMSNorm&) { return {}; }
  Value layer_norm(const Value&, const LayerNorm&) { return {}; }
  Value linear(const Value&, const Linear&) { return {}; }
  Value head(const Value&, const Linear&) { return {}; }
  Value tied_head(const Value&, const Embedding&) { return {}; }
  Value rope(const Value&, const std::shared_ptr<const kernels::RopeTable<float>>&, std::size_t) { return {}; }
  Value attention(const Value&, const Value&, const Value&, AttentionHeads, const Dropout&) { return {}; }
  Value residual(const Value&, const Value&, const Linear&, const Dropout&) { return {}; }
  Value output_residual(const Value&, const Value&, const Linear&, const Dropout&) { return {}; }
  Value swiglu(const Value&, const Value&) { return {}; }
  Value gelu_tanh(const Value&) { return {}; }
  template <class Describe>
  Value block(const Value& x, bool, std::uint64_t, Describe&& describe) {
    return describe(*this, x);
  }
  /// @}
};
static_assert(ModelPass<ModelPassArchetype>);

/// x through `blocks` in order as p.block()s: block i (from 1) with its own dropout stream of
/// (seed, step, i) and recomputed in backward when remat is set; each Block has run(inner pass, x).
/// The trunk every description shares.
template <ModelPass P, class Block>
typename P::Value run_blocks(P& p, typename P::Value x, const std::vector<Block>& blocks, bool remat,
                             std::uint64_t seed, std::uint64_t step) {
  for (std::size_t i = 0; i < blocks.size(); ++i)
    x = p.block(x, remat, dropout_seed(seed, step, i + 1),
                [&block = blocks[i]](auto& inner, const auto& h) { return block.run(inner, h); });
  return x;
}

}  // namespace tapegrad::nn
