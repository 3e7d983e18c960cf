// DecoderBlock: the pre-norm residual block, optionally rematerialised.
#include "nn/block.h"

#include "core/ops.h"
#include "core/remat.h"

namespace tapegrad::nn {

DecoderBlock::DecoderBlock(std::size_t d_model_, std::size_t n_heads_, std::size_t d_ff_, float norm_eps, bool remat_,
                           std::shared_ptr<const kernels::RopeTable<float>> rope, float init_std, float out_std,
                           Rng& rng)
    : d_model(d_model_),
      n_heads(n_heads_),
      d_ff(d_ff_),
      remat(remat_),
      attn_norm(d_model_, norm_eps),
      attn(d_model_, n_heads_, std::move(rope), init_std, out_std, rng),
      ffn_norm(d_model_, norm_eps),
      ffn(d_model_, d_ff_, init_std, out_std, rng) {}

Var DecoderBlock::forward_inside(const Var& x) const {
  Var h = add(x, attn.forward(attn_norm.forward(x)));
  return add(h, ffn.forward(ffn_norm.forward(h)));
}

Var DecoderBlock::forward(const Var& x) const {
  if (!remat) return forward_inside(x);
  return rematerialize([this](const Var& input) { return forward_inside(input); }, x);  // Note [Remat]
}

void DecoderBlock::collect_params(const std::string& prefix, ParameterList& out) const {
  attn_norm.collect_params(prefix + "attn_norm.", out);
  attn.collect_params(prefix + "attn.", out);
  ffn_norm.collect_params(prefix + "ffn_norm.", out);
  ffn.collect_params(prefix + "ffn.", out);
}

}  // namespace tapegrad::nn
