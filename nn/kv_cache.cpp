// KVCache: sequence slots, their positions, and the weights they were filled under.
#include "nn/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace tapegrad::nn {

namespace {

// Bytes per K (and per V) buffer: layers x sequences x max_len x width values (max_len in whole
// key blocks for the keys), refused past 2^30 values (4 GiB each of floats) before anything is
// allocated, so that a request for too many sequences is one clear error rather than an allocation
// failure or the out-of-memory killer.
std::size_t checked_buffer_bytes(std::size_t layers, std::size_t max_len, std::size_t width, std::size_t sequences,
                                 KVCacheType type) {
  constexpr std::size_t limit = std::size_t(1) << 30;
  if (sequences == 0) throw std::invalid_argument("KVCache: a cache holds at least one sequence");
  std::size_t values = 1;
  for (std::size_t factor : {layers, max_len, width, sequences})
    if (factor != 0 && values > limit / factor)
      throw std::invalid_argument(fmt::format("KVCache: {} sequences x {} layers x {} positions x {} floats is more "
                                              "than the supported {} floats (4 GiB) for the keys; decode fewer "
                                              "sequences at once",
                                              sequences, layers, max_len, width, limit));
    else values *= factor;
  return values * (type == KVCacheType::f32 ? sizeof(float) : sizeof(std::uint16_t));
}

}  // namespace

KVCache::KVCache(std::size_t layers, std::size_t max_len, std::size_t width, std::size_t sequences,
                 std::size_t kv_heads, KVCacheType type)
    : layers_(layers),
      max_len_(max_len),
      width_(width),
      kv_heads_(kv_heads != 0 && width % kv_heads == 0
                    ? kv_heads
                    : throw std::invalid_argument(
                          fmt::format("KVCache: rows of {} values do not hold {} KV heads", width, kv_heads))),
      type_(type),
      key_positions_((max_len + kernels::key_block - 1) / kernels::key_block * kernels::key_block),
      values_(checked_buffer_bytes(layers, max_len, width, sequences, type)),
      keys_(checked_buffer_bytes(layers, key_positions_, width, sequences, type)),
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

// Position pos of a sequence-layer's keys is column pos % key_block of block pos / key_block, one
// value a row of it; its values are row pos of each KV head's plane. A 16-bit cache rounds the rows
// on their way in, a stretch of a row at a time (threads write different sequences at once).
void KVCache::write(std::size_t layer, std::size_t sequence, std::size_t position, std::size_t count, const float* k,
                    const float* v) {
  const std::size_t slot = layer * sequences() + sequence, head_dim = width_ / kv_heads_;
  auto lay_out = [&]<class Element>(Element* keys, Element* planes, auto&& store) {
    keys += slot * key_positions_ * width_;
    planes += slot * max_len_ * width_;
    for (std::size_t t = 0; t < count; ++t) {
      const std::size_t pos = position + t;
      Element* column = keys + pos / kernels::key_block * width_ * kernels::key_block + pos % kernels::key_block;
      for (std::size_t c = 0; c < width_; c += stretch) {
        Element row[stretch];
        const std::size_t n = std::min(stretch, width_ - c);
        store(row, k + t * width_ + c, n);
        for (std::size_t i = 0; i < n; ++i) column[(c + i) * kernels::key_block] = row[i];
      }
      for (std::size_t g = 0; g < kv_heads_; ++g)
        store(planes + (g * max_len_ + pos) * head_dim, v + t * width_ + g * head_dim, head_dim);
    }
  };
  if (type_ == KVCacheType::f32)
    lay_out(reinterpret_cast<float*>(keys_.data()), reinterpret_cast<float*>(values_.data()),
            [](float* out, const float* x, std::size_t n) { std::copy_n(x, n, out); });
  else
    lay_out(reinterpret_cast<std::uint16_t*>(keys_.data()), reinterpret_cast<std::uint16_t*>(values_.data()),
            [](std::uint16_t* out, const float* x, std::size_t n) { kernels::round_to_halves(out, x, n); });
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
