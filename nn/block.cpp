// DecoderBlock: the pre-norm residual block, optionally rematerialised.
#include "nn/block.h"

#include "core/ops.h"
#include "core/random.h"
#include "core/remat.h"

namespace tapegrad::nn {

DecoderBlock::DecoderBlock(std::size_t d_model_, std::size_t n_heads_, std::size_t d_ff_, float norm_eps, bool remat_,
                           std::shared_ptr<const kernels::RopeTable<float>> rope, float init_std, float out_std,
                           Rng& rng, float dropout)
    : d_model(d_model_),
      n_heads(n_heads_),
      d_ff(d_ff_),
      remat(remat_),
      attn_norm(d_model_, norm_eps),
      attn(d_model_, n_heads_, std::move(rope), init_std, out_std, rng),
      ffn_norm(d_model_, norm_eps),
      ffn(d_model_, d_ff_, init_std, out_std, rng),
      drop(dropout) {}

// Each residual add is folded into the projection before it (add_matmul: one gemm with beta = 1),
// as in the KV-cache path, so training and decoding run the same kernels.
Var DecoderBlock::forward_inside(const Var& x, const Tensor* known_output, std::uint64_t dropout_seed) const {
  if (drop.active()) {  // the residual adds cannot fold into the projections: dropout comes between
    Rng rng(dropout_seed);  // masks in a fixed order: probabilities, attention branch, FFN branch
    Var h = x + drop.forward(matmul(attn.heads(attn_norm.forward(x), drop, rng), attn.wo.weight), rng);
    return h + drop.forward(matmul(ffn.hidden(ffn_norm.forward(h)), ffn.w2.weight), rng);
  }
  Var h = add_matmul(x, attn.heads(attn_norm.forward(x)), attn.wo.weight);
  return add_matmul(h, ffn.hidden(ffn_norm.forward(h)), ffn.w2.weight, known_output);
}

Var DecoderBlock::forward(const Var& x) const { return forward(x, 0); }

Var DecoderBlock::forward(const Var& x, std::uint64_t dropout_seed) const {
  if (!remat) return forward_inside(x, nullptr, dropout_seed);
  return rematerialize([this, dropout_seed](const Var& input, const Tensor* known_output) {  // Note [Remat]
    return forward_inside(input, known_output, dropout_seed);
  }, x);
}

void DecoderBlock::set_training(bool on) {
  Module::set_training(on);
  drop.set_training(on);
}

void DecoderBlock::collect_params(const std::string& prefix, ParameterList& out) const {
  attn_norm.collect_params(prefix + "attn_norm.", out);
  attn.collect_params(prefix + "attn.", out);
  ffn_norm.collect_params(prefix + "ffn_norm.", out);
  ffn.collect_params(prefix + "ffn.", out);
}

}  // namespace tapegrad::nn
