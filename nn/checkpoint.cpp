// Checkpoints of any registered architecture on top of io/safetensors: the metadata comes from
// the architecture, the parameter checks are shared by all.
#include "nn/checkpoint.h"

#include <fmt/format.h>

#include <cmath>
#include <set>
#include <stdexcept>

#include "nn/checkpoint_metadata.h"
#include "nn/lora.h"

namespace tapegrad::nn {

namespace {

// Checks the file's tensors against the model's parameters and moves them in; the "optim."
// tensors go to extra. Every value must be finite: NaN or inf can only come from damage or
// forgery (train never saves a diverged model), and would surface later as a NaN loss or a
// failed draw that names no file.
void load_parameters(std::map<std::string, Tensor>& tensors, ParameterList params,
                     std::map<std::string, Tensor>& extra) {
  std::size_t total = 0, expected = 0;
  for (const auto& [name, tensor] : tensors) total += tensor.size();
  for (const auto& p : params) expected += p.var.value().size();
  if (expected > total)
    throw std::runtime_error(
        fmt::format("the metadata describes {} parameters but the file holds {} values", expected, total));
  for (const auto& [name, tensor] : tensors)
    for (std::size_t i = 0; i < tensor.size(); ++i)
      if (!std::isfinite(tensor[i]))
        throw std::runtime_error(fmt::format("tensor '{}' holds {} at element {} (weights and optimizer state must be "
                                             "finite numbers)",
                                             name, tensor[i], i));
  std::set<std::string> seen;
  for (auto& p : params) {
    auto it = tensors.find(p.name);
    if (it == tensors.end()) throw std::runtime_error(fmt::format("tensor '{}' is missing", p.name));
    if (it->second.shape() != p.var.shape())
      throw std::runtime_error(fmt::format("tensor '{}' has shape {} but the metadata implies {}", p.name,
                                           to_string(it->second.shape()), to_string(p.var.shape())));
    p.var.mutable_value() = std::move(it->second);
    seen.insert(p.name);
  }
  for (auto& [name, tensor] : tensors) {
    if (seen.count(name)) continue;
    if (name.rfind("optim.", 0) != 0)
      throw std::runtime_error(fmt::format("tensor '{}' is not a parameter of this model", name));
    extra.emplace(name, std::move(tensor));
  }
}

// Gives the tensors of a file written by an earlier version their current names: every piece
// between dots that arch.former_names lists, in parameters and "optim." tensors alike.
void rename_former_names(std::map<std::string, Tensor>& tensors, const Architecture& arch) {
  if (arch.former_names.empty()) return;
  std::map<std::string, Tensor> renamed;
  for (auto& [name, tensor] : tensors) {
    std::string current = name;
    for (const auto& [former, now] : arch.former_names) {
      const std::string piece = "." + former + ".", replacement = "." + now + ".";
      for (std::size_t at = current.find(piece); at != std::string::npos; at = current.find(piece, at + replacement.size() - 1))
        current.replace(at, piece.size(), replacement);
    }
    if (!renamed.emplace(current, std::move(tensor)).second)
      throw std::runtime_error(fmt::format("two tensors read as '{}' (one of them under a former name)", current));
  }
  tensors = std::move(renamed);
}

}  // namespace

void write_checkpoint_file(const std::string& path, const ParameterList& params, std::size_t vocab,
                           const tokenizers::Tokenizer& tokenizer, std::map<std::string, std::string> metadata,
                           const CheckpointExtras& extras) {
  // A published model's embedding may have more rows than its tokenizer has tokens (padding).
  const bool fits = tokenizer.kind() == "char" ? tokenizer.vocab_size() == vocab : tokenizer.vocab_size() <= vocab;
  if (!fits)
    throw std::invalid_argument(fmt::format("{}: the tokenizer has {} {} but the model's vocab is {}", path,
                                            tokenizer.vocab_size(),
                                            tokenizer.kind() == "char" ? "characters" : "tokens", vocab));
  for (auto& [key, value] : tokenizer.to_metadata()) metadata[key] = std::move(value);
  metadata["format_version"] = kCheckpointFormatVersion;
  for (const auto& [key, value] : extras.metadata) {
    if (metadata.count(key)) throw std::invalid_argument(fmt::format("{}: metadata key '{}' is reserved", path, key));
    metadata[key] = value;
  }
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const auto& p : params) tensors.emplace_back(p.name, &p.var.value());
  for (const auto& [name, tensor] : extras.tensors) {
    if (name.rfind("optim.", 0) != 0)
      throw std::invalid_argument(fmt::format("{}: extra tensor '{}' must be named optim.*", path, name));
    tensors.emplace_back(name, tensor);
  }
  write_safetensors(path, tensors, metadata);
}

std::optional<std::string> LoadedModelCheckpoint::chat_template() const {
  const auto it = metadata.find(kChatTemplateKey);
  if (it == metadata.end()) return std::nullopt;
  return it->second;
}

const tokenizers::CharTokenizer& LoadedModelCheckpoint::char_tokenizer() const {
  const auto* chars = dynamic_cast<const tokenizers::CharTokenizer*>(tokenizer.get());
  if (!chars)
    throw std::runtime_error(
        fmt::format("the checkpoint's tokenizer is '{}', not a character vocabulary", tokenizer->kind()));
  return *chars;
}

void save_model_checkpoint(const std::string& path, const LanguageModel& model, const tokenizers::Tokenizer& tokenizer,
                           const CheckpointExtras& extras) {
  const Architecture& arch = find_architecture(model.arch());
  Metadata metadata = arch.to_metadata(model);
  metadata["arch"] = arch.name;
  metadata.merge(lora_metadata(model));
  write_checkpoint_file(path, model.params(), model.config().vocab, tokenizer, std::move(metadata), extras);
}

LoadedModelCheckpoint load_model_checkpoint(const std::string& path, bool remat) {
  SafetensorsFile file = read_safetensors(path);
  try {
    const Metadata& meta = file.metadata;
    auto it = meta.find("arch");
    if (it == meta.end())
      throw std::runtime_error("metadata has no 'arch': a checkpoint of tapegrad 0.1, which 0.3 no longer reads; "
                               "load it with tapegrad 0.2 (load_model_checkpoint, or generate/train --resume) and "
                               "save it again (save_model_checkpoint, train), which writes 'arch'");
    const Architecture& arch = find_architecture(it->second, "metadata arch");
    check_format_version(meta, kCheckpointFormatVersion);
    // The sizes come from the file: the model may take no more than its tensors hold (twice, for
    // what building it allocates besides), so forged sizes fail before a large allocation.
    std::size_t file_bytes = 0;
    for (const auto& [name, tensor] : file.tensors) file_bytes += tensor.bytes();
    LanguageModel model = [&] {
      TensorAllocationLimit limit(2 * file_bytes + (1 << 20), "the sizes in the metadata describe a model larger "
                                                              "than the file's tensors");
      return arch.from_metadata(meta, remat);
    }();
    std::shared_ptr<const tokenizers::Tokenizer> tokenizer;
    auto kind = meta.find("tokenizer");  // absent in the files of the time before BPE: characters
    if (kind == meta.end() || kind->second == "char") {
      auto chars = std::make_shared<const tokenizers::CharTokenizer>(
          tokenizers::CharTokenizer::from_vocab(metadata_text(meta, "vocab")));
      if (chars->size() != model.config().vocab)
        throw std::runtime_error(fmt::format("the vocabulary has {} characters but vocab_size is {}", chars->size(),
                                             model.config().vocab));
      tokenizer = std::move(chars);
    } else {
      tokenizer = tokenizers::tokenizer_from_metadata(meta);
      if (tokenizer->vocab_size() > model.config().vocab)
        throw std::runtime_error(fmt::format("the tokenizer has {} tokens but vocab_size is {}", tokenizer->vocab_size(),
                                             model.config().vocab));
    }
    add_lora_from_metadata(model, meta);  // a LoRA run's checkpoint: the base and its adapters
    rename_former_names(file.tensors, arch);
    LoadedModelCheckpoint out{std::move(model), std::move(tokenizer), {}, meta};
    load_parameters(file.tensors, out.model.params(), out.extra_tensors);
    return out;
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace tapegrad::nn
