// KVCache: sequence slots, their positions, and the weights they were filled under.
#include "nn/kv_cache.h"

#include <fmt/format.h>

#include <stdexcept>

namespace tapegrad::nn {

KVCache::KVCache(std::size_t layers, std::size_t max_len, std::size_t width, std::size_t sequences)
    : layers_(layers),
      max_len_(max_len),
      width_(width),
      positions_(sequences, 0),
      active_(sequences, 1),
      keys_(layers * sequences * max_len * width),
      values_(layers * sequences * max_len * width) {
  if (sequences == 0) throw std::invalid_argument("KVCache: a cache holds at least one sequence");
}

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
  std::vector<float>& buffer = buffers_[next_++];
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

}  // namespace tapegrad::nn
