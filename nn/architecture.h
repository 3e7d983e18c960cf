// The architectures a LanguageModel can hold, by name: each one gives its factory, its config to
// and from checkpoint metadata, and its shape for the programs' flags. The built-in ones
// ("rotary", "gpt2") are listed once, in architecture.cpp; a program adds its own with
// register_architecture (docs/architecture.md, "Adding an architecture").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include "nn/checkpoint_metadata.h"
#include "nn/language_model.h"

namespace tapegrad::nn {

/// The sizes and options that train_char's flags and the benchmarks give any architecture; one
/// that has no use for a field ignores it.
struct ModelShape {
  /// @{ Vocabulary size, model width, attention heads, blocks, and the longest text (tokens).
  std::size_t vocab = 0, d_model = 0, n_heads = 0, n_blocks = 0, max_len = 0;
  /// @}
  std::optional<std::size_t> d_ff;  ///< the feed-forward hidden size; default: the architecture's
  float dropout = 0;                ///< in training
  bool remat = false;               ///< rematerialise each block in backward (Note [Remat])
  std::uint64_t seed = 0;           ///< initialisation, and the root of the dropout streams
};

/// One architecture, type-erased: what the checkpoints and the programs need of it.
struct Architecture {
  std::string name;            ///< the checkpoint's "arch" and train_char's --arch
  std::type_index model_type;  ///< the class a LanguageModel of it holds
  /// A new model (initialised from shape.seed); throws std::invalid_argument for impossible sizes.
  std::function<LanguageModel(const ModelShape& shape)> make;
  /// A new model from a checkpoint's metadata (its weights still initial), or std::runtime_error
  /// naming the key; remat is not stored in files.
  std::function<LanguageModel(const Metadata& metadata, bool remat)> from_metadata;
  /// The config of model as the metadata from_metadata reads (save_model_checkpoint adds arch,
  /// vocab and format_version).
  std::function<Metadata(const LanguageModel& model)> to_metadata;
  /// The model's sizes and options in the programs' terms (what a data-parallel run sends).
  std::function<ModelShape(const LanguageModel& model)> shape;
  /// Parameter names that files of earlier versions hold, renamed as load_model_checkpoint reads
  /// them: (former, current) pieces between dots, e.g. ("ln1", "attn_norm") makes
  /// "blocks.0.ln1.weight" and "optim.blocks.0.ln1.weight.m" read as "blocks.0.attn_norm...".
  std::vector<std::pair<std::string, std::string>> former_names = {};
};

/// Adds an architecture; throws std::invalid_argument if its name or model type is taken.
/// Call it before any model of it is saved or loaded (e.g. from a static initializer).
void register_architecture(Architecture architecture);

/// The architecture called name; otherwise throws std::invalid_argument "<what> '<name>' is not a
/// registered architecture (registered: rotary, gpt2, ...)", what saying where the name came from.
const Architecture& find_architecture(const std::string& name, const std::string& what = "arch");

/// The architecture of a model type, or null if none is registered for it.
const Architecture* find_architecture(std::type_index model_type);

/// The registered names, built-in first, in registration order.
std::vector<std::string> architecture_names();

/// The config of a DecoderModel whose config has the fields of ModelShape (and a d_ff), from a shape.
template <class Config>
Config config_from_shape(const ModelShape& s) {
  Config c;
  c.vocab = s.vocab, c.d_model = s.d_model, c.n_heads = s.n_heads, c.n_blocks = s.n_blocks, c.max_len = s.max_len;
  c.d_ff = s.d_ff, c.dropout = s.dropout, c.remat = s.remat, c.seed = s.seed;
  return c;
}

/// The shape of such a config (d_ff as the model uses it).
template <class Config>
ModelShape shape_of_config(const Config& c) {
  return {c.vocab, c.d_model, c.n_heads, c.n_blocks, c.max_len, c.ffn_dim(), c.dropout, c.remat, c.seed};
}

/// The Architecture of a DecoderModel `Model` built from its config type: it needs only the config
/// to and from metadata (the shape conversions default to the ones above).
template <class Model, class Config = std::remove_cvref_t<decltype(std::declval<const Model&>().config())>>
Architecture make_architecture(std::string name, Config (*from_metadata)(const Metadata&),
                               Metadata (*to_metadata)(const Config&),
                               Config (*from_shape)(const ModelShape&) = &config_from_shape<Config>,
                               ModelShape (*to_shape)(const Config&) = &shape_of_config<Config>) {
  auto config_of = [](const LanguageModel& model) -> const Config& { return model.as<Model>()->config(); };
  return {std::move(name),
          typeid(Model),
          [from_shape](const ModelShape& shape) { return LanguageModel(Model(from_shape(shape))); },
          [from_metadata](const Metadata& metadata, bool remat) {
            Config config = from_metadata(metadata);
            config.remat = remat;
            return LanguageModel(Model(config));
          },
          [to_metadata, config_of](const LanguageModel& model) { return to_metadata(config_of(model)); },
          [to_shape, config_of](const LanguageModel& model) { return to_shape(config_of(model)); }};
}

}  // namespace tapegrad::nn
