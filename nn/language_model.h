// LanguageModel: any registered architecture (nn/architecture.h) behind one interface, for the
// programs that train, generate with and evaluate a model chosen by name. Its checkpoints are in
// nn/checkpoint.h.
#pragma once

#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>
#include <span>
#include <type_traits>
#include <typeindex>
#include <vector>

#include "core/tape.h"
#include "nn/kv_cache.h"
#include "nn/module.h"

namespace tapegrad::nn {

/// A model of any architecture (a DecoderModel and a Module), the calls going to the model held.
class LanguageModel {
 public:
  /// What generate needs of any architecture's config (the architecture's own Config type has
  /// the rest: model.as<Gpt2>()->config()).
  struct Config {
    /// @{ The vocabulary size and the longest text (tokens).
    std::size_t vocab = 0, max_len = 0;
    /// @}
  };
  /// 0.2's name of Config.
  using Sizes [[deprecated("use LanguageModel::Config")]] = Config;
  /// Holds model (a RotaryDecoder, a Gpt2, or any class with the DecoderModel interface).
  template <class Model>
    requires(!std::is_same_v<std::remove_cvref_t<Model>, LanguageModel>)
  LanguageModel(Model model) : held_(std::make_unique<Held<Model>>(std::move(model))) {}

  /// The registered name of the held model's architecture ("rotary", "gpt2", ...); throws
  /// std::logic_error if its class is not registered.
  std::string arch() const;
  /// The class of the model held (the key of its Architecture).
  std::type_index model_type() const { return held_->type(); }
  /// ids (B*T, row-major) -> logits (B, T, vocab).
  Var forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const {
    return held_->forward(ids, batch, seq_len);
  }
  /// Mean next-token cross-entropy of forward(inputs) against targets, both (B*T).
  Var loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, std::size_t batch,
           std::size_t seq_len) const {
    return held_->loss(inputs, targets, batch, seq_len);
  }
  ParameterList params() const { return held_->params(); }       ///< The model's parameters with their names.
  std::size_t num_params() const { return held_->num_params(); }  ///< The number of trainable values.
  Config config() const { return held_->config(); }               ///< The vocabulary size and max_len.
  void set_training(bool on) { held_->set_training(on); }         ///< Training or evaluation mode (dropout).
  /// The step the dropout streams of the next forward derive from.
  void set_dropout_step(std::uint64_t step) { held_->set_dropout_step(step); }
  /// The model as fmt prints it ("RotaryDecoder(...)", "Gpt2(...)"), or its arch and size.
  std::string describe() const { return held_->describe(*this); }

  /// Decoding through a KV cache, as each architecture's DecoderModel offers it.
  using Cache = KVCache;
  /// A cache for `sequences` sequences of up to max_len tokens (0: the model's), bound to this
  /// model, its values held as `type` says.
  KVCache make_cache(std::size_t sequences = 1, std::size_t max_len = 0, KVCacheType type = KVCacheType::f32) const {
    return held_->make_cache(sequences, max_len, type);
  }
  /// Appends tokens to one sequence of the cache; returns their logits (T, vocab), or the last
  /// token's (1, vocab).
  Tensor prefill(std::span<const std::int32_t> tokens, KVCache& cache, std::size_t sequence = 0,
                 PrefillLogits which = PrefillLogits::every_token) const {
    return held_->prefill(tokens, cache, sequence, which);
  }
  /// Appends prompts[s] to sequence s in one pass; returns every appended token's logits, or each
  /// non-empty prompt's last token's.
  Tensor prefill(std::span<const std::vector<std::int32_t>> prompts, KVCache& cache,
                 PrefillLogits which = PrefillLogits::every_token) const {
    return held_->prefill(prompts, cache, which);
  }
  /// One token for each sequence; returns the logits (sequences, vocab), dropped sequences' rows NaN.
  std::span<const float> step(std::span<const std::int32_t> tokens, KVCache& cache) const {
    return held_->step(tokens, cache);
  }
  /// step() of a one-sequence cache: the logits (vocab) of its next position.
  std::span<const float> step(std::int32_t token, KVCache& cache) const { return step(std::span(&token, 1), cache); }

  /// The model as a Module (its layers, for what walks them: nn/lora.h).
  Module& module() { return held_->module(); }

  /// The model itself if it is a Model (for what only one architecture has), else null.
  template <class Model> Model* as() {
    auto* held = dynamic_cast<Held<Model>*>(held_.get());
    return held ? &held->model : nullptr;
  }
  /// as(), read-only.
  template <class Model> const Model* as() const { return const_cast<LanguageModel*>(this)->as<Model>(); }

 private:
  // The interface every held model offers (type erasure: Held<Model> forwards to the model).
  struct Base {
    virtual ~Base() = default;
    virtual std::type_index type() const = 0;
    virtual Module& module() = 0;
    virtual Var forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const = 0;
    virtual Var loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, std::size_t batch,
                     std::size_t seq_len) const = 0;
    virtual ParameterList params() const = 0;
    virtual std::size_t num_params() const = 0;
    virtual Config config() const = 0;
    virtual void set_training(bool on) = 0;
    virtual void set_dropout_step(std::uint64_t step) = 0;
    virtual std::string describe(const LanguageModel& self) const = 0;
    virtual KVCache make_cache(std::size_t sequences, std::size_t max_len, KVCacheType type) const = 0;
    virtual Tensor prefill(std::span<const std::int32_t> tokens, KVCache& cache, std::size_t sequence,
                           PrefillLogits which) const = 0;
    virtual Tensor prefill(std::span<const std::vector<std::int32_t>> prompts, KVCache& cache,
                           PrefillLogits which) const = 0;
    virtual std::span<const float> step(std::span<const std::int32_t> tokens, KVCache& cache) const = 0;
  };
  template <class Model>
  struct Held final : Base {
    explicit Held(Model m) : model(std::move(m)) {}
    std::type_index type() const override { return typeid(Model); }
    Module& module() override { return model; }
    Var forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const override {
      return model.forward(ids, batch, seq_len);
    }
    Var loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, std::size_t batch,
             std::size_t seq_len) const override {
      return model.loss(inputs, targets, batch, seq_len);
    }
    ParameterList params() const override { return model.params(); }
    std::size_t num_params() const override { return model.num_params(); }
    Config config() const override { return {model.config().vocab, model.config().max_len}; }
    void set_training(bool on) override { model.train(on); }
    void set_dropout_step(std::uint64_t step) override { model.dropout_step = step; }
    std::string describe(const LanguageModel& self) const override {
      if constexpr (fmt::is_formattable<Model>::value) return fmt::format("{}", model);
      else return fmt::format("{}({} parameters)", self.arch(), model.num_params());
    }
    KVCache make_cache(std::size_t sequences, std::size_t max_len, KVCacheType type) const override {
      return model.make_cache(sequences, max_len, type);
    }
    Tensor prefill(std::span<const std::int32_t> tokens, KVCache& cache, std::size_t sequence,
                   PrefillLogits which) const override {
      return model.prefill(tokens, cache, sequence, which);
    }
    Tensor prefill(std::span<const std::vector<std::int32_t>> prompts, KVCache& cache,
                   PrefillLogits which) const override {
      return model.prefill(prompts, cache, which);
    }
    std::span<const float> step(std::span<const std::int32_t> tokens, KVCache& cache) const override {
      return model.step(tokens, cache);
    }
    Model model;
  };
  std::unique_ptr<Base> held_;
};

}  // namespace tapegrad::nn
