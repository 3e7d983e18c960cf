// TapePass: the ops of a model description as recorded ops on the tape.
#include "nn/tape_pass.h"

#include <fmt/format.h>

#include <stdexcept>

#include "core/ops.h"
#include "nn/causal_attention.h"

namespace tapegrad::nn {

TapePass::TapePass(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len,
                   std::uint64_t dropout_seed, std::span<const std::int32_t> targets)
    : ids_(ids), targets_(targets), batch_(batch), seq_len_(seq_len), rng_(dropout_seed) {
  if (batch == 0 || seq_len == 0 || ids.size() != batch * seq_len)
    throw std::invalid_argument(fmt::format("forward: {} ids for batch {} x seq_len {}", ids.size(), batch, seq_len));
  if (!targets.empty() && targets.size() != ids.size())
    throw std::invalid_argument(fmt::format("loss: {} targets for {} ids", targets.size(), ids.size()));
}

Var TapePass::embed(const Embedding& table) const { return table.forward(ids_, batch_, seq_len_); }

Var TapePass::positions(const Embedding& table) const { return slice(table.weight, 0, 0, seq_len_); }

// Note [Loss pass]
// DecoderModel::loss runs the description on a TapePass given the targets. Its head ops then
// return the loss rather than the logits, by linear_cross_entropy: the logits of a chunk of rows
// at a time, never (B*T, vocab) of them (200 MB at SmolLM2's vocabulary and 1024 rows, and as
// much again for their gradient). The head is an op of its own in every description, so that
// the pass knows it without the description knowing about losses.
Var TapePass::head(const Var& x, const Linear& layer) const {
  if (targets_.empty()) return layer.forward(x);
  // An adapter's term is not in the fused op: the logits whole, then their loss.
  if (layer.adapter) return cross_entropy(layer.forward(x), targets_);
  return linear_cross_entropy(x, layer.weight, targets_, /*transpose_weight=*/false, layer.bias);
}

Var TapePass::tied_head(const Var& x, const Embedding& table) const {
  if (targets_.empty()) return matmul(x, table.weight, false, /*transpose_b=*/true);
  return linear_cross_entropy(x, table.weight, targets_, /*transpose_weight=*/true);
}

Var TapePass::rope(const Var& x, const std::shared_ptr<const kernels::RopeTable<float>>& table,
                   std::size_t n_heads) const {
  return tapegrad::rope(x, table, n_heads);
}

Var TapePass::attention(const Var& q, const Var& k, const Var& v, AttentionHeads heads, const Dropout& drop) {
  return causal_attention(q, k, v, heads, drop, rng_);
}

Var TapePass::residual(const Var& x, const Var& h, const Linear& out, const Dropout& drop,
                       const Tensor* known_output) {
  if (drop.active()) return x + drop.forward(out.forward(h), rng_);
  // With an adapter, its add_matmul is the last op: the one whose output a remat re-run knows.
  const Tensor* known_projection = out.adapter ? nullptr : known_output;
  Var y;
  if (!out.bias.defined()) {
    y = add_matmul(x, h, out.weight, known_projection);
  } else {
    auto biased = add_bias(x, out.bias);  // x + b first: then the projection is one add_matmul
    y = add_matmul(biased, h, out.weight, known_projection);
  }
  return out.adapter ? out.adapter->add_to(y, h, known_output) : y;
}

Var TapePass::residual(const Var& x, const Var& h, const Linear& out, const Dropout& drop) {
  return residual(x, h, out, drop, nullptr);
}

Var TapePass::output_residual(const Var& x, const Var& h, const Linear& out, const Dropout& drop) {
  return residual(x, h, out, drop, known_output_);
}

Var TapePass::swiglu(const Var& gate, const Var& up) const { return tapegrad::swiglu(gate, up); }

Var TapePass::gelu_tanh(const Var& x) const { return gelu(x, /*approximate_tanh=*/true); }

}  // namespace tapegrad::nn
