// KVCache: sequence slots, their positions, and the weights they were filled under.
#include "nn/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace tapegrad::nn {

namespace {

// Floats per K (and per V) buffer: layers x sequences x max_len x width (max_len in whole key
// blocks for the keys), refused past 2^30 floats (4 GiB each) before anything is allocated, so that
// a request for too many sequences is one clear error rather than an allocation failure or the
// out-of-memory killer.
std::size_t checked_buffer_floats(std::size_t layers, std::size_t max_len, std::size_t width, std::size_t sequences) {
  constexpr std::size_t limit = std::size_t(1) << 30;
  if (sequences == 0) throw std::invalid_argument("KVCache: a cache holds at least one sequence");
  std::size_t floats = 1;
  for (std::size_t factor : {layers, max_len, width, sequences})
    if (factor != 0 && floats > limit / factor)
      throw std::invalid_argument(fmt::format("KVCache: {} sequences x {} layers x {} positions x {} floats is more "
                                              "than the supported {} floats (4 GiB) for the keys; decode fewer "
                                              "sequences at once",
                                              sequences, layers, max_len, width, limit));
    else floats *= factor;
  return floats;
}

}  // namespace

KVCache::KVCache(std::size_t layers, std::size_t max_len, std::size_t width, std::size_t sequences,
                 std::size_t kv_heads)
    : layers_(layers),
      max_len_(max_len),
      width_(width),
      kv_heads_(kv_heads != 0 && width % kv_heads == 0
                    ? kv_heads
                    : throw std::invalid_argument(
                          fmt::format("KVCache: rows of {} floats do not hold {} KV heads", width, kv_heads))),
      key_positions_((max_len + kernels::key_block - 1) / kernels::key_block * kernels::key_block),
      values_(checked_buffer_floats(layers, max_len, width, sequences)),
      keys_(checked_buffer_floats(layers, key_positions_, width, sequences)),
      positions_(sequences, 0),
      active_(sequences, 1) {}

void KVCache::reset() {
  for (std::size_t s = 0; s < sequences(); ++s) restart(s);
}

void KVCache::restart(std::size_t sequence) {
  if (sequence >= sequences())
    throw std::out_of_range(fmt::format("KVCache: sequence {} of a cache of {}", sequence, sequences()));
  positions_[sequence] = 0;
  active_[sequence] = 1;
}

void KVCache::drop(std::size_t sequence) {
  if (sequence >= sequences())
    throw std::out_of_range(fmt::format("KVCache: sequence {} of a cache of {}", sequence, sequences()));
  active_[sequence] = 0;
}

void KVCache::write(std::size_t layer, std::size_t sequence, std::size_t position, std::size_t count, const float* k,
                    const float* v) {
  const std::size_t first = (layer * sequences() + sequence) * key_positions_ * width_;
  for (std::size_t t = 0; t < count; ++t) {
    const std::size_t pos = position + t;
    // Position pos is column pos % key_block of block pos / key_block: one float per row of it.
    float* column = keys_.data() + first + pos / kernels::key_block * width_ * kernels::key_block + pos % kernels::key_block;
    for (std::size_t c = 0; c < width_; ++c) column[c * kernels::key_block] = k[t * width_ + c];
  }
  const std::size_t head_dim = width_ / kv_heads_;
  float* planes = values_.data() + (layer * sequences() + sequence) * max_len_ * width_;
  for (std::size_t t = 0; t < count; ++t)
    for (std::size_t g = 0; g < kv_heads_; ++g)
      std::copy_n(v + t * width_ + g * head_dim, head_dim, planes + (g * max_len_ + position + t) * head_dim);
}

void KVCache::bind(const void* model, std::vector<Var> params) {
  model_ = model;
  params_ = std::move(params);
}

std::uint64_t KVCache::weights_version() const {
  std::uint64_t v = 0;
  for (const Var& p : params_) v += p.version();
  return v;
}

float* KVCache::Scratch::take(std::size_t floats) {
  if (next_ == buffers_.size()) buffers_.emplace_back();
  AlignedVector<float>& buffer = buffers_[next_++];
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

}  // namespace tapegrad::nn
