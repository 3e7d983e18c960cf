// A pre-norm decoder block: h = x + Attn(RMSNorm_a(x)); out = h + FFN(RMSNorm_f(h)).
// With remat the block is one tape entry that recomputes its inside in backward (Note [Remat]).
#pragma once

#include <fmt/format.h>

#include "nn/attention.h"
#include "nn/rms_norm.h"
#include "nn/swiglu.h"

namespace tapegrad::nn {

class DecoderBlock : public Module {
 public:
  DecoderBlock(std::size_t d_model, std::size_t n_heads, std::size_t d_ff, float norm_eps, bool remat,
               std::shared_ptr<const kernels::RopeTable<float>> rope, float init_std, float out_std, Rng& rng,
               float dropout = 0);
  Var forward(const Var& x) const;  // (B, T, D) -> (B, T, D)
  /// With dropout (when active: training mode, p > 0) on the attention probabilities and each
  /// residual branch, masks from Rng(dropout_seed); a remat re-run draws the same masks.
  Var forward(const Var& x, std::uint64_t dropout_seed) const;
  void set_training(bool on) override;
  void collect_params(const std::string& prefix, ParameterList& out) const override;

  std::size_t d_model, n_heads, d_ff;
  bool remat;
  RMSNorm attn_norm;
  RotaryAttention attn;
  RMSNorm ffn_norm;
  SwiGLU ffn;
  Dropout drop;

 private:
  Var forward_inside(const Var& x, const Tensor* known_output, std::uint64_t dropout_seed) const;
};

}  // namespace tapegrad::nn

/// RotaryDecoderBlock(64, 4, d_ff=256, remat=true)
template <>
struct fmt::formatter<tapegrad::nn::DecoderBlock> : fmt::formatter<std::string_view> {
  auto format(const tapegrad::nn::DecoderBlock& b, format_context& ctx) const {
    return fmt::format_to(ctx.out(), "RotaryDecoderBlock({}, {}, d_ff={}, remat={})", b.d_model, b.n_heads, b.d_ff,
                          b.remat);
  }
};
