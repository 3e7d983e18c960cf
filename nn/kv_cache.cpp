// The inference pass: prefill and step. It calls the same forward kernels as the training ops,
// on the parameter tensors as they are at the time of the call, with no tape.
#include "nn/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "core/kernels.h"
#include "nn/rotary_decoder.h"

namespace tapegrad::nn {

KVCache::KVCache(std::size_t n_blocks, std::size_t max_len, std::size_t d_model)
    : n_blocks_(n_blocks),
      max_len_(max_len),
      d_model_(d_model),
      keys_(n_blocks * max_len * d_model),
      values_(n_blocks * max_len * d_model) {}

void KVCache::reset() { position_ = 0; }

KVCache RotaryDecoder::make_cache() const { return KVCache(config_.n_blocks, config_.max_len, config_.d_model); }

namespace {

template <class T>
void ensure_size(std::vector<T>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

const float* RotaryDecoder::run_cached(std::span<const std::int32_t> tokens, KVCache& cache) const {
  const DecoderConfig& c = config_;
  const std::size_t rows = tokens.size(), D = c.d_model, F = c.ffn_dim(), V = c.vocab, H = c.n_heads;
  const std::size_t pos = cache.position_;
  if (cache.n_blocks_ != c.n_blocks || cache.max_len_ != c.max_len || cache.d_model_ != D)
    throw std::invalid_argument(fmt::format("KVCache: made for {} blocks x {} positions x d_model {}, but the model "
                                            "has {} x {} x {}; use model.make_cache()",
                                            cache.n_blocks_, cache.max_len_, cache.d_model_, c.n_blocks, c.max_len, D));
  if (rows == 0) throw std::invalid_argument("KVCache: no tokens to write");
  if (pos + rows > c.max_len)
    throw std::out_of_range(fmt::format("KVCache: {} tokens at position {} run past max_len {}; reset() to start "
                                        "a new sequence",
                                        rows, pos, c.max_len));
  for (std::size_t i = 0; i < rows; ++i)
    if (tokens[i] < 0 || std::size_t(tokens[i]) >= V)
      throw std::out_of_range(fmt::format("KVCache: token id {} at index {} is outside the vocabulary of size {}",
                                          tokens[i], i, V));
  std::uint64_t version = weights_version();
  if (pos > 0 && version != cache.weights_version_)
    throw std::logic_error(fmt::format("KVCache: the weights changed since this cache was filled (version {} -> "
                                       "{}); call reset() and prefill again",
                                       cache.weights_version_, version));
  cache.weights_version_ = version;

  if (rows > cache.capacity_rows_) {  // the first call, or a longer prefill: size the scratch once
    cache.capacity_rows_ = rows;
    ensure_size(cache.x_, rows * D);
    ensure_size(cache.normed_, rows * D);
    ensure_size(cache.q_, rows * D);
    ensure_size(cache.attended_, rows * D);
    ensure_size(cache.gate_, rows * F);
    ensure_size(cache.up_, rows * F);
    ensure_size(cache.logits_, rows * V);
  }

  float *x = cache.x_.data(), *xn = cache.normed_.data(), *q = cache.q_.data(), *att = cache.attended_.data();
  const std::size_t Dh = c.head_dim(), kv_len = pos + rows;
  kernels::embedding_forward(x, embed.weight.value().data(), tokens.data(), rows, D);
  for (std::size_t l = 0; l < blocks.size(); ++l) {
    const DecoderBlock& b = blocks[l];
    float* K = cache.keys_.data() + l * c.max_len * D;
    float* Vv = cache.values_.data() + l * c.max_len * D;
    kernels::rms_norm_forward<float>(xn, nullptr, x, b.attn_norm.weight.value().data(), rows, D, b.attn_norm.eps);
    kernels::matmul_forward(q, xn, b.attn.wq.weight.value().data(), rows, D, D);
    kernels::matmul_forward(K + pos * D, xn, b.attn.wk.weight.value().data(), rows, D, D);
    kernels::matmul_forward(Vv + pos * D, xn, b.attn.wv.weight.value().data(), rows, D, D);
    kernels::rope_forward(q, q, *rope_, 1, rows, H, Dh, pos);
    kernels::rope_forward(K + pos * D, K + pos * D, *rope_, 1, rows, H, Dh, pos);
    kernels::attention_forward<float>(att, nullptr, q, K, Vv, {1, rows, kv_len, H, Dh, pos});
    kernels::add_matmul_forward(x, x, att, b.attn.wo.weight.value().data(), rows, D, D);  // x += att Wo
    kernels::rms_norm_forward<float>(xn, nullptr, x, b.ffn_norm.weight.value().data(), rows, D, b.ffn_norm.eps);
    kernels::matmul_forward(cache.gate_.data(), xn, b.ffn.w1.weight.value().data(), rows, D, F);
    kernels::matmul_forward(cache.up_.data(), xn, b.ffn.w3.weight.value().data(), rows, D, F);
    kernels::swiglu_forward(cache.gate_.data(), cache.gate_.data(), cache.up_.data(), rows * F);
    // x += hidden W2
    kernels::add_matmul_forward(x, x, cache.gate_.data(), b.ffn.w2.weight.value().data(), rows, F, D);
  }
  kernels::rms_norm_forward<float>(xn, nullptr, x, norm.weight.value().data(), rows, D, norm.eps);
  kernels::matmul_forward(cache.logits_.data(), xn, head.weight.value().data(), rows, D, V);
  kernels::add_bias_forward(cache.logits_.data(), cache.logits_.data(), head.bias.value().data(), rows, V);
  cache.position_ = kv_len;
  return cache.logits_.data();
}

Tensor RotaryDecoder::prefill(std::span<const std::int32_t> tokens, KVCache& cache) const {
  const float* logits = run_cached(tokens, cache);
  return Tensor({tokens.size(), config_.vocab}, std::vector<float>(logits, logits + tokens.size() * config_.vocab));
}

std::span<const float> RotaryDecoder::step(std::int32_t token, KVCache& cache) const {
  return {run_cached(std::span<const std::int32_t>(&token, 1), cache), config_.vocab};
}

}  // namespace tapegrad::nn
