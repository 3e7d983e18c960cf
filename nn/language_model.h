// LanguageModel: one of the architectures the programs train, generate with and evaluate,
// chosen by name ("rotary": nn/rotary_decoder.h; "gpt2": nn/gpt2.h) and recorded in the
// checkpoint's "arch" metadata (a file without it is "rotary").
#pragma once

#include <map>
#include <string>
#include <variant>

#include "nn/checkpoint.h"
#include "nn/gpt2.h"
#include "nn/rotary_decoder.h"

namespace tapegrad::nn {

/// A RotaryDecoder or a Gpt2 behind one interface (the calls go to the model held).
class LanguageModel {
 public:
  /// What generate needs of config().
  struct Sizes {
    /// @{ The vocabulary size and the longest text (tokens).
    std::size_t vocab = 0, max_len = 0;
    /// @}
  };
  LanguageModel(RotaryDecoder model) : model_(std::move(model)) {}  ///< Holds a rotary decoder.
  LanguageModel(Gpt2 model) : model_(std::move(model)) {}           ///< Holds a GPT-2.

  /// "rotary" or "gpt2".
  std::string arch() const;
  /// ids (B*T, row-major) -> logits (B, T, vocab).
  Var forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const;
  /// Mean next-token cross-entropy of forward(inputs) against targets, both (B*T).
  Var loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, std::size_t batch,
           std::size_t seq_len) const;
  ParameterList params() const;      ///< The model's parameters with their names.
  std::size_t num_params() const;    ///< The number of trainable values.
  Sizes config() const;              ///< The vocabulary size and max_len.
  void set_training(bool on);        ///< Training or evaluation mode (dropout).
  /// The step the dropout streams of the next forward derive from.
  void set_dropout_step(std::uint64_t step);
  /// "RotaryDecoder(...)" or "Gpt2(...)".
  std::string describe() const;

  /// Decoding through a KV cache, as each architecture's DecoderModel offers it.
  using Cache = KVCache;
  /// A cache for `sequences` sequences, bound to this model.
  KVCache make_cache(std::size_t sequences = 1) const;
  /// Appends tokens to one sequence of the cache; returns their logits (T, vocab).
  Tensor prefill(std::span<const std::int32_t> tokens, KVCache& cache, std::size_t sequence = 0) const;
  /// Appends prompts[s] to sequence s in one pass; returns every appended token's logits.
  Tensor prefill(std::span<const std::vector<std::int32_t>> prompts, KVCache& cache) const;
  /// One token for each sequence; returns the logits (sequences, vocab), dropped sequences' rows NaN.
  std::span<const float> step(std::span<const std::int32_t> tokens, KVCache& cache) const;
  /// step() of a one-sequence cache: the logits (vocab) of its next position.
  std::span<const float> step(std::int32_t token, KVCache& cache) const;

  /// The model itself, for what only one architecture has (null if it is the other).
  RotaryDecoder* rotary() { return std::get_if<RotaryDecoder>(&model_); }
  const RotaryDecoder* rotary() const { return std::get_if<RotaryDecoder>(&model_); }  ///< rotary(), read-only.
  Gpt2* gpt2() { return std::get_if<Gpt2>(&model_); }                                  ///< The Gpt2, or null.
  const Gpt2* gpt2() const { return std::get_if<Gpt2>(&model_); }                      ///< gpt2(), read-only.

 private:
  std::variant<RotaryDecoder, Gpt2> model_;
};

/// save_checkpoint for either architecture: the rotary decoder's file is unchanged (plus
/// arch = "rotary"); a gpt2 file has the tensor names of Gpt2::params(), arch = "gpt2", its sizes,
/// norm_eps, dropout, and the vocabulary.
void save_model_checkpoint(const std::string& path, const LanguageModel& model, const CharTokenizer& tokenizer,
                           const CheckpointExtras& extras = {});

/// What load_model_checkpoint returns.
struct LoadedModelCheckpoint {
  LanguageModel model;                          ///< the model, its weights loaded
  CharTokenizer tokenizer;                      ///< the file's vocabulary
  std::map<std::string, Tensor> extra_tensors;  ///< the "optim." tensors
  std::map<std::string, std::string> metadata;  ///< the file's metadata, every key
};

/// load_checkpoint for either architecture, by the file's "arch" (absent: "rotary"), with the
/// same checks: every parameter present with its exact shape, no unknown tensor, finite values,
/// metadata in range. Errors name the file and the problem.
LoadedModelCheckpoint load_model_checkpoint(const std::string& path, bool remat = false);

}  // namespace tapegrad::nn
