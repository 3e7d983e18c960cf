// Checkpoint save and load on top of core/safetensors.
#include "nn/checkpoint.h"

#include <fmt/format.h>

#include <cmath>
#include <set>
#include <stdexcept>

#include "nn/checkpoint_metadata.h"

namespace tapegrad::nn {

namespace {

std::map<std::string, std::string> model_metadata(const DecoderConfig& c, const CharTokenizer& tokenizer) {
  return {{"vocab_size", std::to_string(c.vocab)},
          {"d_model", std::to_string(c.d_model)},
          {"n_heads", std::to_string(c.n_heads)},
          {"n_blocks", std::to_string(c.n_blocks)},
          {"max_len", std::to_string(c.max_len)},
          {"d_ff", std::to_string(c.ffn_dim())},
          {"norm_eps", fmt::format("{}", c.norm_eps)},
          {"rope_theta", fmt::format("{}", c.rope_theta)},
          {"vocab", tokenizer.vocab()},
          {"format_version", kCheckpointFormatVersion}};
}

}  // namespace

void write_checkpoint_file(const std::string& path, const ParameterList& params, std::size_t vocab,
                           const CharTokenizer& tokenizer, std::map<std::string, std::string> metadata,
                           const CheckpointExtras& extras) {
  if (tokenizer.size() != vocab)
    throw std::invalid_argument(fmt::format("save_checkpoint: the tokenizer has {} characters but the model's vocab is {}",
                                            tokenizer.size(), vocab));
  for (const auto& [key, value] : extras.metadata) {
    if (metadata.count(key)) throw std::invalid_argument(fmt::format("save_checkpoint: metadata key '{}' is reserved", key));
    metadata[key] = value;
  }
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const auto& p : params) tensors.emplace_back(p.name, &p.var.value());
  for (const auto& [name, tensor] : extras.tensors) {
    if (name.rfind("optim.", 0) != 0)
      throw std::invalid_argument(fmt::format("save_checkpoint: extra tensor '{}' must be named optim.*", name));
    tensors.emplace_back(name, tensor);
  }
  write_safetensors(path, tensors, metadata);
}

void save_checkpoint(const std::string& path, const RotaryDecoder& model, const CharTokenizer& tokenizer,
                     const CheckpointExtras& extras) {
  std::map<std::string, std::string> metadata = model_metadata(model.config(), tokenizer);
  if (model.config().dropout > 0) metadata["dropout"] = fmt::format("{}", model.config().dropout);  // absent: 0
  write_checkpoint_file(path, model.params(), model.config().vocab, tokenizer, std::move(metadata), extras);
}

LoadedCheckpoint load_checkpoint(const std::string& path, bool remat) {
  SafetensorsFile file = read_safetensors(path);
  try {
    const auto& meta = file.metadata;
    if (meta.count("arch") && meta.at("arch") != "rotary")
      throw std::runtime_error(fmt::format("arch '{}' is not the rotary decoder; load it with load_model_checkpoint "
                                           "(nn/language_model.h)",
                                           meta.at("arch")));
    check_format_version(meta, kCheckpointFormatVersion);
    DecoderConfig config;
    read_model_sizes(meta, config);
    config.norm_eps = float(metadata_positive(meta, "norm_eps"));
    config.rope_theta = metadata_positive(meta, "rope_theta");
    config.remat = remat;
    if (meta.count("dropout")) config.dropout = float(metadata_probability(meta, "dropout"));
    CharTokenizer tokenizer = CharTokenizer::from_vocab(metadata_text(meta, "vocab"));
    if (tokenizer.size() != config.vocab)
      throw std::runtime_error(fmt::format("the vocabulary has {} characters but vocab_size is {}", tokenizer.size(),
                                           config.vocab));
    config.validate();
    // Check every shape against the metadata before building the model (whose size it sets).
    std::size_t total = 0;
    for (const auto& [name, tensor] : file.tensors) total += tensor.size();
    std::size_t D = config.d_model, F = config.ffn_dim(), V = config.vocab;
    std::size_t expected_params = V * D + config.n_blocks * (2 * D + 4 * D * D + 3 * D * F) + D + D * V + V;
    if (expected_params > total)
      throw std::runtime_error(fmt::format("the metadata describes {} parameters but the file holds {} values",
                                           expected_params, total));
    // NaN or inf can only come from damage or forgery (train_char never saves a diverged model),
    // and would surface later as a NaN loss or a failed draw that names no file.
    for (const auto& [name, tensor] : file.tensors)
      for (std::size_t i = 0; i < tensor.size(); ++i)
        if (!std::isfinite(tensor[i]))
          throw std::runtime_error(fmt::format("tensor '{}' holds {} at element {} (weights and optimizer state "
                                               "must be finite numbers)",
                                               name, tensor[i], i));
    RotaryDecoder model(config);
    std::set<std::string> seen;
    for (auto& p : model.params()) {
      auto it = file.tensors.find(p.name);
      if (it == file.tensors.end()) throw std::runtime_error(fmt::format("tensor '{}' is missing", p.name));
      if (it->second.shape() != p.var.shape())
        throw std::runtime_error(fmt::format("tensor '{}' has shape {} but the metadata implies {}", p.name,
                                             to_string(it->second.shape()), to_string(p.var.shape())));
      p.var.mutable_value() = std::move(it->second);
      seen.insert(p.name);
    }
    LoadedCheckpoint out{std::move(model), std::move(tokenizer), {}, meta};
    for (auto& [name, tensor] : file.tensors) {
      if (seen.count(name)) continue;
      if (name.rfind("optim.", 0) != 0)
        throw std::runtime_error(fmt::format("tensor '{}' is not a parameter of this model", name));
      out.extra_tensors.emplace(name, std::move(tensor));
    }
    return out;
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace tapegrad::nn
