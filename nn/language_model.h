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

class LanguageModel {
 public:
  struct Sizes {
    std::size_t vocab = 0, max_len = 0;
  };
  LanguageModel(RotaryDecoder model) : model_(std::move(model)) {}
  LanguageModel(Gpt2 model) : model_(std::move(model)) {}

  /// "rotary" or "gpt2".
  std::string arch() const;
  Var forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const;
  Var loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, std::size_t batch,
           std::size_t seq_len) const;
  ParameterList params() const;
  std::size_t num_params() const;
  Sizes config() const;
  /// Training or evaluation mode (dropout), and the step the dropout streams derive from.
  void set_training(bool on);
  void set_dropout_step(std::uint64_t step);
  /// "RotaryDecoder(...)" or "Gpt2(...)".
  std::string describe() const;

  /// Decoding through a KV cache, as each architecture's DecoderModel offers it.
  using Cache = KVCache;
  KVCache make_cache(std::size_t sequences = 1) const;
  Tensor prefill(std::span<const std::int32_t> tokens, KVCache& cache, std::size_t sequence = 0) const;
  Tensor prefill(std::span<const std::vector<std::int32_t>> prompts, KVCache& cache) const;
  std::span<const float> step(std::span<const std::int32_t> tokens, KVCache& cache) const;
  std::span<const float> step(std::int32_t token, KVCache& cache) const;

  /// The model itself, for what only one architecture has.
  RotaryDecoder* rotary() { return std::get_if<RotaryDecoder>(&model_); }
  const RotaryDecoder* rotary() const { return std::get_if<RotaryDecoder>(&model_); }
  Gpt2* gpt2() { return std::get_if<Gpt2>(&model_); }
  const Gpt2* gpt2() const { return std::get_if<Gpt2>(&model_); }

 private:
  std::variant<RotaryDecoder, Gpt2> model_;
};

/// save_checkpoint for either architecture: the rotary decoder's file is unchanged (plus
/// arch = "rotary"); a gpt2 file has the tensor names of Gpt2::params(), arch = "gpt2", its sizes,
/// norm_eps, dropout, and the vocabulary.
void save_model_checkpoint(const std::string& path, const LanguageModel& model, const CharTokenizer& tokenizer,
                           const CheckpointExtras& extras = {});

struct LoadedModelCheckpoint {
  LanguageModel model;
  CharTokenizer tokenizer;
  std::map<std::string, Tensor> extra_tensors;  // the "optim." tensors
  std::map<std::string, std::string> metadata;
};

/// load_checkpoint for either architecture, by the file's "arch" (absent: "rotary"), with the
/// same checks: every parameter present with its exact shape, no unknown tensor, finite values,
/// metadata in range. Errors name the file and the problem.
LoadedModelCheckpoint load_model_checkpoint(const std::string& path, bool remat = false);

}  // namespace tapegrad::nn
