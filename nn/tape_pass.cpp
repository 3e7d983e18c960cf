// TapePass: the ops of a model description as recorded ops on the tape.
#include "nn/tape_pass.h"

#include <fmt/format.h>

#include <stdexcept>

#include "core/ops.h"
#include "nn/causal_attention.h"

namespace tapegrad::nn {

TapePass::TapePass(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len,
                   std::uint64_t dropout_seed)
    : ids_(ids), batch_(batch), seq_len_(seq_len), rng_(dropout_seed) {
  if (batch == 0 || seq_len == 0 || ids.size() != batch * seq_len)
    throw std::invalid_argument(fmt::format("forward: {} ids for batch {} x seq_len {}", ids.size(), batch, seq_len));
}

Var TapePass::embed(const Embedding& table) const { return table.forward(ids_, batch_, seq_len_); }

Var TapePass::positions(const Embedding& table) const { return slice(table.weight, 0, 0, seq_len_); }

Var TapePass::matmul_transposed(const Var& x, const Var& weight) const {
  return matmul(x, weight, false, /*transpose_b=*/true);
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
