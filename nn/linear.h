// Linear: y = x W (+ b), W stored (in, out), as checkpoints store every matrix; with a LoRA
// adapter (Hu et al. 2021, nn/lora.h) y = x W (+ b) + (alpha / r) (x A) B.
#pragma once

#include <memory>
#include <optional>

#include "core/quant/packed_matrix.h"
#include "nn/module.h"

namespace tapegrad {
class Rng;
}

namespace tapegrad::nn {

/// A low-rank adapter of a Linear: it adds (alpha / r) (x A) B to the layer's output.
struct LoraAdapter {
  Var a;            ///< (in, r): PEFT's lora_A.weight transposed
  Var b;            ///< (r, out), zero at the start: PEFT's lora_B.weight transposed
  float alpha = 1;  ///< PEFT's lora_alpha
  float scale() const { return alpha / float(a.shape()[1]); }  ///< alpha / r
  /// y + scale (x A) B; x (.., in), y (.., out). known_output as add_matmul's (Note [Remat]).
  Var add_to(const Var& y, const Var& x, const Tensor* known_output = nullptr) const;
};

/// A dense layer y = x W (+ b), W stored (in, out) (torch.nn.Linear stores its transpose).
class Linear : public Module {
 public:
  /// W ~ N(0, init_std^2); b (when present) starts at zero.
  Linear(std::size_t in, std::size_t out, bool bias, float init_std, Rng& rng);
  /// x (.., in) -> (.., out), the adapter's term added when there is one.
  Var forward(const Var& x) const;
  void members(Members& m) override;

  std::size_t in() const { return packed ? packed->cols : weight.shape()[0]; }   ///< The input size.
  std::size_t out() const { return packed ? packed->rows : weight.shape()[1]; }  ///< The output size.
  Var weight;  ///< (in, out); undefined when the layer is packed
  /// Inference only: W^T (out, in) in a block format (nn/packed_weights.h), which decoding
  /// (CachePass) uses instead of weight; never a parameter, never trained.
  std::shared_ptr<const quant::PackedMatrix> packed;
  Var bias;    ///< (out) or undefined
  /// Named lora_a and lora_b when present (nn/lora.h adds, loads and merges it).
  std::optional<LoraAdapter> adapter;
};

}  // namespace tapegrad::nn
