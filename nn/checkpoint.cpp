// Checkpoint save and load on top of core/safetensors.
#include "nn/checkpoint.h"

#include <fmt/format.h>

#include <stdexcept>

#include "nn/language_model.h"

namespace tapegrad::nn {

void write_checkpoint_file(const std::string& path, const ParameterList& params, std::size_t vocab,
                           const tokenizers::Tokenizer& tokenizer, std::map<std::string, std::string> metadata,
                           const CheckpointExtras& extras) {
  // A published model's embedding may have more rows than its tokenizer has tokens (padding).
  const bool fits = tokenizer.kind() == "char" ? tokenizer.vocab_size() == vocab : tokenizer.vocab_size() <= vocab;
  if (!fits)
    throw std::invalid_argument(fmt::format("save_checkpoint: the tokenizer has {} {} but the model's vocab is {}",
                                            tokenizer.vocab_size(), tokenizer.kind() == "char" ? "characters" : "tokens",
                                            vocab));
  for (auto& [key, value] : tokenizer.to_metadata()) metadata[key] = std::move(value);
  metadata["format_version"] = kCheckpointFormatVersion;
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
  write_checkpoint_file(path, model.params(), model.config().vocab, tokenizer, rotary_decoder_config_metadata(model.config()),
                        extras);
}

LoadedCheckpoint load_checkpoint(const std::string& path, bool remat) {
  LoadedModelCheckpoint loaded = load_model_checkpoint(path, remat);
  RotaryDecoder* model = loaded.model.as<RotaryDecoder>();
  if (!model)
    throw std::runtime_error(fmt::format("{}: arch '{}' is not the rotary decoder; load it with load_model_checkpoint "
                                         "(nn/language_model.h)",
                                         path, loaded.model.arch()));
  return {std::move(*model), loaded.char_tokenizer(), std::move(loaded.extra_tensors), std::move(loaded.metadata)};
}

}  // namespace tapegrad::nn
