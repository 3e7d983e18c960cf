// A tiny language model built from core ops (embedding, matmul, bias, cross-entropy) and the
// helpers the optimizer tests share: fresh parameters from a seed, one training step, bitwise equality.
#pragma once

#include <cstring>
#include <vector>

#include "core/ops.h"
#include "core/parameter.h"
#include "optim/optimizer.h"
#include "support/helpers.h"

namespace tapegrad::test {

struct TinyModel {
  static constexpr std::size_t vocab = 16, dim = 8;
  ParameterList params;  // embed.weight (V, D), head.weight (D, V), head.bias (V)

  explicit TinyModel(std::uint64_t seed) {
    params.push_back({"embed.weight", Var(random_tensor({vocab, dim}, seed, 0.5f), true)});
    params.push_back({"head.weight", Var(random_tensor({dim, vocab}, seed + 1, 0.5f), true)});
    params.push_back({"head.bias", Var(Tensor({vocab}), true)});
  }

  /// Mean cross-entropy of head(embed(ids)) against targets, recorded on the current tape.
  Var loss(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets) const {
    Var logits = add_bias(matmul(embedding(params[0].var, ids), params[1].var), params[2].var);  // (N, V)
    return cross_entropy(logits, targets);
  }
};

/// One batch the model can fit exactly: every id appears once (a permutation), so each row's
/// target is learnable independently of the others.
struct TinyBatch {
  std::vector<std::int32_t> ids, targets;
  TinyBatch() {
    Rng rng(7);
    for (std::int32_t i = 0; i < std::int32_t(TinyModel::vocab); ++i) ids.push_back((i * 5 + 3) % 16);
    for (std::size_t i = 0; i < ids.size(); ++i) targets.push_back(std::int32_t(rng.below(TinyModel::vocab)));
  }
};

/// zero_grad, forward, backward, optimizer step at lr; returns the loss before the step.
inline float train_step(const TinyModel& model, const TinyBatch& batch, optim::Optimizer& opt, float lr) {
  opt.zero_grad();
  Tape tape;
  Var loss = model.loss(batch.ids, batch.targets);
  tape.backward(loss);
  opt.set_lr(lr);
  opt.step();
  return loss.value().item();
}

/// True when both tensors have the same shape and the same bytes (bit-identical).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

}  // namespace tapegrad::test
