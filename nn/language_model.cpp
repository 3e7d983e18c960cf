// LanguageModel dispatch and the gpt2 checkpoint format.
#include "nn/language_model.h"

#include <fmt/format.h>

#include <cmath>
#include <set>
#include <stdexcept>

#include "core/safetensors.h"
#include "nn/checkpoint_metadata.h"

namespace tapegrad::nn {

namespace {

LoadedModelCheckpoint load_gpt2(SafetensorsFile file, bool remat) {
  const auto& meta = file.metadata;
  check_format_version(meta, kCheckpointFormatVersion);
  Gpt2Config config;
  read_model_sizes(meta, config);
  config.norm_eps = float(metadata_positive(meta, "norm_eps"));
  config.dropout = meta.count("dropout") ? float(metadata_probability(meta, "dropout")) : 0.0f;
  config.remat = remat;
  CharTokenizer tokenizer = CharTokenizer::from_vocab(metadata_text(meta, "vocab"));
  if (tokenizer.size() != config.vocab)
    throw std::runtime_error(
        fmt::format("the vocabulary has {} characters but vocab_size is {}", tokenizer.size(), config.vocab));
  config.validate();
  // Shapes against the metadata before building the model (whose size it sets).
  std::size_t total = 0;
  for (const auto& [name, tensor] : file.tensors) total += tensor.size();
  std::size_t D = config.d_model, F = config.ffn_dim();
  std::size_t expected = (config.vocab + config.max_len) * D + config.n_blocks * (4 * D + 4 * (D * D + D) + 2 * D * F + F + D) + 2 * D;
  if (expected > total)
    throw std::runtime_error(
        fmt::format("the metadata describes {} parameters but the file holds {} values", expected, total));
  for (const auto& [name, tensor] : file.tensors)
    for (std::size_t i = 0; i < tensor.size(); ++i)
      if (!std::isfinite(tensor[i]))
        throw std::runtime_error(fmt::format("tensor '{}' holds {} at element {} (weights and optimizer state must be "
                                             "finite numbers)",
                                             name, tensor[i], i));
  Gpt2 model(config);
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
  LoadedModelCheckpoint out{LanguageModel(std::move(model)), std::move(tokenizer), {}, meta};
  for (auto& [name, tensor] : file.tensors) {
    if (seen.count(name)) continue;
    if (name.rfind("optim.", 0) != 0)
      throw std::runtime_error(fmt::format("tensor '{}' is not a parameter of this model", name));
    out.extra_tensors.emplace(name, std::move(tensor));
  }
  return out;
}

}  // namespace

std::string LanguageModel::arch() const { return rotary() ? "rotary" : "gpt2"; }

Var LanguageModel::forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const {
  return std::visit([&](const auto& m) { return m.forward(ids, batch, seq_len); }, model_);
}

Var LanguageModel::loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets,
                        std::size_t batch, std::size_t seq_len) const {
  return std::visit([&](const auto& m) { return m.loss(inputs, targets, batch, seq_len); }, model_);
}

ParameterList LanguageModel::params() const {
  return std::visit([](const auto& m) { return m.params(); }, model_);
}

std::size_t LanguageModel::num_params() const {
  return std::visit([](const auto& m) { return m.num_params(); }, model_);
}

LanguageModel::Sizes LanguageModel::config() const {
  return std::visit([](const auto& m) { return Sizes{m.config().vocab, m.config().max_len}; }, model_);
}

void LanguageModel::set_training(bool on) {
  std::visit([on](auto& m) { m.train(on); }, model_);
}

void LanguageModel::set_dropout_step(std::uint64_t step) {
  std::visit([step](auto& m) { m.dropout_step = step; }, model_);
}

KVCache LanguageModel::make_cache(std::size_t sequences) const {
  return std::visit([&](const auto& m) { return m.make_cache(sequences); }, model_);
}

Tensor LanguageModel::prefill(std::span<const std::int32_t> tokens, KVCache& cache, std::size_t sequence) const {
  return std::visit([&](const auto& m) { return m.prefill(tokens, cache, sequence); }, model_);
}

Tensor LanguageModel::prefill(std::span<const std::vector<std::int32_t>> prompts, KVCache& cache) const {
  return std::visit([&](const auto& m) { return m.prefill(prompts, cache); }, model_);
}

std::span<const float> LanguageModel::step(std::span<const std::int32_t> tokens, KVCache& cache) const {
  return std::visit([&](const auto& m) { return m.step(tokens, cache); }, model_);
}

std::span<const float> LanguageModel::step(std::int32_t token, KVCache& cache) const {
  return std::visit([&](const auto& m) { return m.step(token, cache); }, model_);
}

std::string LanguageModel::describe() const {
  return std::visit([](const auto& m) { return fmt::format("{}", m); }, model_);
}

void save_model_checkpoint(const std::string& path, const LanguageModel& model, const CharTokenizer& tokenizer,
                           const CheckpointExtras& extras) {
  if (const RotaryDecoder* rotary = model.rotary()) {
    CheckpointExtras with_arch = extras;
    with_arch.metadata["arch"] = "rotary";
    save_checkpoint(path, *rotary, tokenizer, with_arch);
    return;
  }
  const Gpt2Config& c = model.gpt2()->config();
  std::map<std::string, std::string> metadata = {{"arch", "gpt2"},
                                                 {"vocab_size", std::to_string(c.vocab)},
                                                 {"d_model", std::to_string(c.d_model)},
                                                 {"n_heads", std::to_string(c.n_heads)},
                                                 {"n_blocks", std::to_string(c.n_blocks)},
                                                 {"max_len", std::to_string(c.max_len)},
                                                 {"d_ff", std::to_string(c.ffn_dim())},
                                                 {"norm_eps", fmt::format("{}", c.norm_eps)},
                                                 {"dropout", fmt::format("{}", c.dropout)},
                                                 {"vocab", tokenizer.vocab()},
                                                 {"format_version", kCheckpointFormatVersion}};
  write_checkpoint_file(path, model.params(), c.vocab, tokenizer, std::move(metadata), extras);
}

LoadedModelCheckpoint load_model_checkpoint(const std::string& path, bool remat) {
  SafetensorsFile file = read_safetensors(path);
  auto it = file.metadata.find("arch");
  const std::string arch = it == file.metadata.end() ? "rotary" : it->second;
  if (arch == "rotary") {  // load_checkpoint reads the file again: the rotary reader is unchanged
    LoadedCheckpoint c = load_checkpoint(path, remat);
    return {LanguageModel(std::move(c.model)), std::move(c.tokenizer), std::move(c.extra_tensors), std::move(c.metadata)};
  }
  if (arch != "gpt2")
    throw std::runtime_error(fmt::format("{}: metadata arch = '{}' is not an architecture this build knows (rotary, gpt2)",
                                         path, arch));
  try {
    return load_gpt2(std::move(file), remat);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace tapegrad::nn
