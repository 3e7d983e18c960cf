// CachePass: runs a model description (Note [One description]) for decoding. Its values are rows
// of floats, one per token of the pass; its ops call the kernels directly, with no tape, on the
// parameter tensors as they are at the time of the call; attention appends each token's key and
// value to its sequence in a KVCache and attends over that sequence's rows 0..position.
//
// A pass holds runs of tokens, each appended to one sequence at that sequence's next position:
// a prefill is one run per prompt, a step one run of one token per active sequence. Every row is
// computed the same way whichever rows share its pass (the matmuls are row-stable, the other ops
// work row by row or per sequence), so a sequence decoded in a batch gets the bits it gets alone.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "core/kernels.h"
#include "core/quant/packed_matrix.h"
#include "nn/kv_cache.h"
#include "nn/model_pass.h"

namespace tapegrad::nn {

/// A value of a CachePass: `rows` rows of `cols` floats, row-major, in the pass's scratch.
struct Rows {
  float* data = nullptr;  ///< the first row
  /// @{ The number of rows (the pass's tokens) and of floats per row.
  std::size_t rows = 0, cols = 0;
  /// @}
  float* row(std::size_t r) const { return data + r * cols; }  ///< Row r.
};

/// Runs a model description as kernel calls on rows, through a KVCache (decoding).
class CachePass {
 public:
  using Value = Rows;    ///< What the description's ops take and return.
  using Run = TokenRun;  ///< Tokens appended to one sequence.

  /// A pass over `runs` (checked by check_decode), its buffers taken from `scratch`; its head ops
  /// compute the logits of the rows `logits` names. Given `logits_out` (logit_rows() rows of
  /// `vocab`), the first head op of that shape writes there rather than in the scratch, sparing
  /// the caller a copy of them.
  CachePass(KVCache& cache, std::span<const Run> runs, KVCache::Scratch& scratch,
            PrefillLogits logits = PrefillLogits::every_token, float* logits_out = nullptr, std::size_t vocab = 0);

  // The ops of ModelPass (nn/model_pass.h), as kernel calls on rows.
  Rows embed(const Embedding& table);                        ///< The tokens' rows of the table.
  Rows positions(const Embedding& table);                    ///< The rows of the tokens' positions.
  Rows add(const Rows& a, const Rows& b);                    ///< a + b.
  Rows dropout(const Rows& x, const Dropout&) { return x; }  ///< x: decoding is evaluation.
  Rows rms_norm(const Rows& x, const RMSNorm& norm);         ///< RMSNorm of each row.
  Rows layer_norm(const Rows& x, const LayerNorm& norm);     ///< LayerNorm of each row.
  Rows linear(const Rows& x, const Linear& layer);           ///< x W (+ b).
  Rows head(const Rows& x, const Linear& layer);          ///< The logits x W (+ b).
  Rows tied_head(const Rows& x, const Embedding& table);  ///< The logits x E^T, E (V, D).
  /// RoPE on each row at its token's position, heads as contiguous column chunks.
  Rows rope(const Rows& x, const std::shared_ptr<const kernels::RopeTable<float>>& table, std::size_t n_heads);
  /// Causal attention over each token's sequence: its k and v rows are appended to the cache (the
  /// k-th attention of a pass uses the cache's layer k, of width n_kv_heads * Dh), then q
  /// attends to rows 0..position.
  Rows attention(const Rows& q, const Rows& k, const Rows& v, AttentionHeads heads, const Dropout&);
  Rows residual(const Rows& x, const Rows& h, const Linear& out, const Dropout&);  ///< x + h W (+ b).
  /// residual(): a block's last op (only training tells the two apart).
  Rows output_residual(const Rows& x, const Rows& h, const Linear& out, const Dropout& drop) {
    return residual(x, h, out, drop);
  }
  Rows swiglu(const Rows& gate, const Rows& up);  ///< silu(gate) * up.
  Rows gelu_tanh(const Rows& x);                  ///< GELU, tanh approximation.
  /// A block: its description runs on this pass (remat and dropout seeds concern training only).
  template <class Describe>
  Rows block(const Rows& x, bool /*remat*/, std::uint64_t /*dropout_seed*/, Describe&& describe) {
    return describe(*this, x);
  }

  std::size_t rows() const { return rows_; }  ///< The pass's tokens, every run's added up.
  /// The rows of logits its head ops return: rows(), or one per run.
  std::size_t logit_rows() const { return logits_ == PrefillLogits::every_token ? rows_ : runs_.size(); }
  /// Attention layers the pass has used so far.
  std::size_t layers_used() const { return layer_; }
  /// The bytes of packed weights the pass's products have read so far.
  std::size_t packed_bytes() const { return packed_bytes_; }
  /// Computes what linear() and rope() have deferred; every other op does it first. Call it
  /// before reading a value the description returns.
  void run_deferred();
  /// The least attention work (query rows x keys x query width) of one sequence that attention()
  /// splits by heads over the kernel threads when the pass runs alone.
  static constexpr std::size_t min_split_attention = std::size_t(1) << 15;

 private:
  // An op's output: every op takes it before reading any input, and taking runs the deferred
  // work, so no op can read a deferred output unfilled (only linear and rope, which may defer
  // theirs, take without running it).
  Rows take(std::size_t cols);
  Rows take(std::size_t rows, std::size_t cols);
  Rows take_deferrable(std::size_t rows, std::size_t cols);
  Rows head_input(const Rows& x);                  // the rows the head ops compute logits for
  Rows take_logits(std::size_t rows, std::size_t cols);  // logits_out_ the first time, then scratch
  void product_into(Rows& y, const Rows& x, const Linear& layer);  // y = x W (+ b) (+ adapter), for x's rows
  // packed_matmul, its weights counted in packed_bytes_
  void packed_product(float* y, const float* x, std::size_t rows, const quant::PackedMatrix& w, bool accumulate);
  void check_cols(const char* op, const Rows& x, std::size_t cols) const;
  template <class Element>
  void attend(float* y, const float* q, const Element* keys, const Element* values,
              const kernels::AttentionShape& shape, float* scratch);
  // y += scale (x A) B: a layer's LoRA adapter (nn/linear.h).
  void add_adapter(Rows& y, const Rows& x, const LoraAdapter& adapter);

  // Packed products of one input (q, k and v; gate and up) wait to run as one packed_matmuls,
  // whose threads then meet once rather than once a product (each output is still computed whole
  // by one thread: the same bits); RoPE of a waiting output waits with it.
  struct DeferredRope {
    Rows y, x;
    const kernels::RopeTable<float>* table;
    std::size_t n_heads;
  };
  static constexpr std::size_t max_deferred = 4;
  bool defer_product(const Rows& y, const Rows& x, const Linear& layer);
  bool is_deferred_output(const Rows& x) const;
  void rope_now(const Rows& y, const Rows& x, const kernels::RopeTable<float>& table, std::size_t n_heads);
  const float* deferred_input_ = nullptr;
  std::array<quant::PackedProduct, max_deferred> deferred_products_{};
  std::array<DeferredRope, max_deferred> deferred_ropes_{};
  std::size_t products_deferred_ = 0, ropes_deferred_ = 0;

  KVCache& cache_;
  std::span<const Run> runs_;
  KVCache::Scratch& scratch_;
  PrefillLogits logits_;
  float* logits_out_;
  std::size_t vocab_;
  std::size_t rows_ = 0, layer_ = 0;
  std::size_t packed_bytes_ = 0;
};
static_assert(ModelPass<CachePass>);

/// What a model's decoding call asks for: runs of tokens, and where their logits go.
struct DecodeRequest {
  std::span<const CachePass::Run> runs;  ///< checked by check_decode
  std::size_t vocab = 0;                 ///< the model's vocabulary size
  float* logits = nullptr;               ///< (total tokens or runs, vocab), the runs' rows in order
  PrefillLogits which = PrefillLogits::every_token;  ///< every token's logits, or each run's last
};

/// Refuses (with a message naming the values) a request the cache cannot take: a cache made by
/// another model or for other sizes, an unknown or dropped sequence, a sequence twice, a token
/// outside the vocabulary, a run past the cache's max_len (at most the model's), rows held from
/// older weights. Then sets each run's
/// position to its sequence's and records the weights version.
void check_decode(std::span<CachePass::Run> runs, KVCache& cache, const void* model, std::size_t layers,
                  std::size_t max_len, std::size_t width, std::size_t vocab);

/// Runs `describe` (a model's description on a CachePass, returning logits rows) over the runs:
/// split across the kernel threads by sequence when there are several, one pass per thread, unless
/// the last pass read more than 16 MB of packed weights a token of this request (the cache's
/// packed_bytes_per_pass): then in one pass whose kernels split their own work. The caller has checked the tokens, positions and
/// weights version; this advances the positions.
void run_cache_passes(KVCache& cache, const DecodeRequest& request, const std::function<Rows(CachePass&)>& describe);

}  // namespace tapegrad::nn
