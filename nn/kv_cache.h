// KVCache: the per-sequence decoding state, kept apart from the weights (llama2.c's RunState).
// Per block, K and V buffers of max_len rows by d_model; the next position; the weights
// version it was filled under; scratch buffers for the inference pass, sized once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tapegrad::nn {

class RotaryDecoder;

class KVCache {
 public:
  KVCache(std::size_t n_blocks, std::size_t max_len, std::size_t d_model);

  /// Starts a new sequence (the buffers are kept).
  void reset();
  std::size_t position() const { return position_; }
  std::size_t max_len() const { return max_len_; }
  std::size_t remaining() const { return max_len_ - position_; }

 private:
  friend class RotaryDecoder;
  std::size_t n_blocks_, max_len_, d_model_;
  std::size_t position_ = 0;
  std::uint64_t weights_version_ = 0;  // of the model when position_ last moved from 0
  std::vector<float> keys_, values_;   // (n_blocks, max_len, d_model), rotated keys
  // Scratch for a pass of up to `capacity_rows_` tokens; grows only when a longer prefill comes.
  std::size_t capacity_rows_ = 0;
  std::vector<float> x_, normed_, q_, attended_, gate_, up_, logits_;
};

}  // namespace tapegrad::nn
