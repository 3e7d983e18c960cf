// KVCache: the decoding state of S sequences, kept apart from the weights (llama2.c's RunState,
// with sequence slots as in llama.cpp). Per attention layer and sequence, K and V buffers of
// max_len positions in the layout of kernels::cached_attention_forward (the keys in transposed
// blocks, the values in a plane of rows per KV head); per sequence its next position and whether
// steps advance it; the weights version the rows were computed under; and the buffers of the
// passes that fill it, which grow on first use and are then reused, so that a step allocates
// nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "core/aligned.h"
#include "core/kernels.h"
#include "core/tape.h"

namespace tapegrad::nn {

/// Tokens appended to one sequence of a cache, from its current position on.
struct TokenRun {
  /// @{ The sequence, the run's first position in it (set when the run is checked), its length.
  std::size_t sequence = 0, position = 0, count = 0;
  /// @}
  const std::int32_t* tokens = nullptr;  ///< count token ids
};

/// Which logits a decoding pass computes: every token's (evaluation), or only the last token's
/// of each run (generation and serving, which sample from that row alone: the head, 49,152 x 576
/// for SmolLM2, then runs on one row per prompt instead of every prompt token). A row gets the
/// same bits either way.
enum class PrefillLogits { every_token, last_token };

/// What a KVCache holds each key and value as: a float (the default: a pass gets the bits of the
/// full forward), or an IEEE half rounded to nearest even (kernels::round_to_halves), half the
/// memory and half the bytes attention reads a token, as llama.cpp's default cache. A 16-bit
/// cache changes the results a little (docs/quantization.md), and still the same for one sequence
/// or many.
enum class KVCacheType { f32, f16 };

/// The K and V rows of S sequences for decoding, with each sequence's position and the scratch
/// buffers of the passes that fill it.
class KVCache {
 public:
  /// `layers` attention layers with K and V rows of `width` values, `kv_heads` heads of keys and
  /// values each (it divides width); `sequences` slots of up to max_len tokens each; the values
  /// held as `type` says. Models make theirs with make_cache(), which also binds it to them.
  KVCache(std::size_t layers, std::size_t max_len, std::size_t width, std::size_t sequences = 1,
          std::size_t kv_heads = 1, KVCacheType type = KVCacheType::f32);

  std::size_t sequences() const { return positions_.size(); }  ///< The number of sequence slots.
  std::size_t layers() const { return layers_; }                ///< The number of attention layers.
  std::size_t max_len() const { return max_len_; }              ///< The most tokens a sequence holds.
  std::size_t width() const { return width_; }                  ///< Values per K (or V) row.
  KVCacheType type() const { return type_; }                    ///< What each value is held as.
  std::size_t kv_heads() const { return kv_heads_; }            ///< Heads of keys and values in a row.
  /// Tokens held by sequence s, which is also the position its next token takes.
  std::size_t position(std::size_t sequence = 0) const { return positions_.at(sequence); }
  /// Tokens sequence s can still take.
  std::size_t remaining(std::size_t sequence = 0) const { return max_len_ - position(sequence); }
  /// Whether steps advance sequence s: every sequence is, until drop(s).
  bool active(std::size_t sequence) const { return active_.at(sequence) != 0; }

  /// Every sequence starts again, empty and active (the buffers are kept).
  void reset();
  /// Sequence s starts again, empty and active; the others are untouched.
  void restart(std::size_t sequence);
  /// Sequence s is finished: steps skip it, and its row of their logits is NaN, until restart(s).
  void drop(std::size_t sequence);

  // ---- for the decoding pass (nn/cache_pass.h) ----

  /// Sequence s's keys in a layer: blocks of kernels::key_block positions, each (width,
  /// key_block), up to max_len positions (kernels::cached_attention_forward reads them). Element
  /// is float for a cache of type f32, std::uint16_t (half bits) for f16.
  template <class Element> const Element* keys(std::size_t layer, std::size_t sequence) const {
    return held<Element>(keys_) + (layer * sequences() + sequence) * key_positions_ * width_;
  }
  /// Sequence s's values in a layer: per KV head g, its rows 0..max_len-1 (max_len, width /
  /// kv_heads) at g * max_len * width / kv_heads (kernels::AttentionShape::kv_capacity = max_len).
  template <class Element> const Element* values(std::size_t layer, std::size_t sequence) const {
    return held<Element>(values_) + (layer * sequences() + sequence) * max_len_ * width_;
  }
  /// Writes the keys and values k and v (count, width) of sequence s's positions
  /// position..position+count-1 in a layer.
  void write(std::size_t layer, std::size_t sequence, std::size_t position, std::size_t count, const float* k,
             const float* v);
  /// Records that sequence s now holds n more tokens.
  void advance(std::size_t sequence, std::size_t n) { positions_[sequence] += n; }
  /// The model this cache was made for (its address) and handles to its parameters, whose
  /// versions tell whether the weights changed since rows were written.
  void bind(const void* model, std::vector<Var> params);
  const void* model() const { return model_; }  ///< The model bound by bind(), or null.
  /// The sum of the bound parameters' versions: it changes whenever a weight is updated in place.
  std::uint64_t weights_version() const;
  /// The version the held rows were computed under (meaningful while any sequence holds rows).
  std::uint64_t filled_version = 0;
  /// The bytes of packed weights the last pass read (CachePass::packed_bytes): run_cache_passes
  /// runs few tokens of a model of many such bytes in one pass.
  std::size_t packed_bytes_per_pass = 0;

  /// A bump allocator over buffers that keep their size from pass to pass: the n-th take() of a
  /// pass returns the n-th buffer, grown if needed, so a pass repeating the same ops allocates
  /// only the first time. One per thread, each on a cache line of its own: the threads' takes
  /// would otherwise keep stealing one line from each other.
  class alignas(64) Scratch {
   public:
    void rewind() { next_ = 0; }  ///< Starts a pass: the next take() returns the first buffer.
    /// The next buffer, grown to at least `floats` floats (its contents are left over).
    float* take(std::size_t floats);

   private:
    std::vector<AlignedVector<float>> buffers_;  // on cache lines, as the kernels' rows want
    std::size_t next_ = 0;
  };
  /// Per thread of a pass: its Scratch. Grown by the pass, kept by the cache.
  std::vector<Scratch> scratch;
  /// A step's runs (one per active sequence).
  std::vector<TokenRun> step_runs;
  /// @{ A step's logits (sequences, vocab), and the active rows' logits before NaN rows are put
  /// in for the dropped sequences.
  std::vector<float> step_logits, active_logits;
  /// @}

 private:
  // The buffer's values as Element, which must be what the cache holds.
  template <class Element> const Element* held(const HugePageVector<std::byte>& buffer) const {
    static_assert(std::is_same_v<Element, float> || std::is_same_v<Element, std::uint16_t>);
    if ((type_ == KVCacheType::f32) != std::is_same_v<Element, float>)
      throw std::logic_error("KVCache: the cache's values read as another type than they are held");
    return reinterpret_cast<const Element*>(buffer.data());
  }

  std::size_t layers_, max_len_, width_, kv_heads_;
  KVCacheType type_;
  std::size_t key_positions_;  // max_len rounded up to whole key blocks
  // values_ (layers, sequences, kv_heads, max_len, width / kv_heads); keys_ (layers, sequences,
  // blocks, width, key_block); of floats or of halves.
  // Declared before the other buffers: their sizes are checked before anything is allocated.
  HugePageVector<std::byte> values_, keys_;  // float rows on cache lines (half rows: on 32 bytes or less)
  static constexpr std::size_t stretch = 64;  // write()'s values of a key row rounded at a time
  std::vector<std::size_t> positions_;
  std::vector<char> active_;
  const void* model_ = nullptr;
  std::vector<Var> params_;
};

}  // namespace tapegrad::nn
