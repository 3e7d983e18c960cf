// Model checkpoints in safetensors (docs/checkpoints.md) for any registered architecture: the
// parameters under their module names; the architecture ("arch"), its config, the tokenizer and
// "format_version" in "__metadata__", so that a checkpoint is all that generation needs.
// Training checkpoints add "optim." tensors and more metadata.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "nn/architecture.h"
#include "nn/language_model.h"
#include "nn/models/rotary_decoder.h"
#include "tokenizers/char_tokenizer.h"
#include "tokenizers/tokenizer.h"

namespace tapegrad::nn {

/// The "format_version" this build writes and reads.
inline constexpr const char* kCheckpointFormatVersion = "1";

/// The architecture of a file with no "arch" key: the rotary decoder, the one architecture
/// before "arch" was written (train_char before gpt2, and save_checkpoint up to 0.1.0).
inline constexpr const char* kArchWithoutKey = "rotary";

/// Extra content a training checkpoint carries besides the model.
struct CheckpointExtras {
  std::vector<std::pair<std::string, const Tensor*>> tensors;  ///< names must start with "optim."
  std::map<std::string, std::string> metadata;                 ///< e.g. step, rng_state, data_position
};

/// What every model checkpoint writer shares: checks that the tokenizer's ids fit the model's
/// `vocab` (a character vocabulary: exactly), adds the tokenizer's metadata (tokenizer.h:
/// "tokenizer" and "vocab" or "tokenizer.json"), "format_version" and the extras' metadata to
/// `metadata` (whose keys are reserved) and their "optim." tensors to `params`, and writes it all
/// atomically to path.
void write_checkpoint_file(const std::string& path, const ParameterList& params, std::size_t vocab,
                           const tokenizers::Tokenizer& tokenizer, std::map<std::string, std::string> metadata,
                           const CheckpointExtras& extras);

/// Writes any registered model, its tokenizer and extras atomically (temporary file, fsync,
/// rename): the tensor names of model.params(), and the metadata of its architecture's
/// to_metadata plus arch, the tokenizer's own (a character vocabulary or a byte-level BPE) and
/// format_version.
void save_model_checkpoint(const std::string& path, const LanguageModel& model, const tokenizers::Tokenizer& tokenizer,
                           const CheckpointExtras& extras = {});

/// The metadata key of a checkpoint's chat template (a CheckpointExtras key; optional).
inline constexpr const char* kChatTemplateKey = "chat_template";

/// What load_model_checkpoint returns.
struct LoadedModelCheckpoint {
  LanguageModel model;                                     ///< the model, its weights loaded
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;  ///< the file's tokenizer
  std::map<std::string, Tensor> extra_tensors;             ///< the "optim." tensors
  std::map<std::string, std::string> metadata;             ///< the file's metadata, every key
  /// The chat template's Jinja source kept under kChatTemplateKey (train keeps the --init file's,
  /// so a model fine-tuned from a chat model still chats), or nothing.
  std::optional<std::string> chat_template() const;
  /// The tokenizer as a character vocabulary (what train writes from a text); throws
  /// std::runtime_error naming its kind when it is another.
  const tokenizers::CharTokenizer& char_tokenizer() const;
};

/// Reads and checks a checkpoint of any registered architecture, by the file's "arch" (absent:
/// kArchWithoutKey): the file layout (io/safetensors), the metadata (every key present, integers
/// in range, a vocabulary that fits vocab_size), every parameter present with its exact shape, no
/// unknown tensor, and every value finite. Errors name the file and the problem.
LoadedModelCheckpoint load_model_checkpoint(const std::string& path, bool remat = false);

/// A rotary decoder checkpoint as load_checkpoint read it.
struct [[deprecated("use LoadedModelCheckpoint (load_model_checkpoint)")]] LoadedCheckpoint {
  RotaryDecoder model;                                 ///< the model, its weights loaded
  tokenizers::CharTokenizer tokenizer;                 ///< the vocabulary it was trained with
  std::map<std::string, Tensor> extra_tensors;         ///< the "optim." tensors
  std::map<std::string, std::string> metadata;         ///< everything in "__metadata__"
};

/// The file save_model_checkpoint writes of a rotary decoder (arch = "rotary" included).
[[deprecated("use save_model_checkpoint(path, LanguageModel(model), tokenizer, extras)")]] inline void save_checkpoint(
    const std::string& path, const RotaryDecoder& model, const tokenizers::CharTokenizer& tokenizer,
    const CheckpointExtras& extras = {}) {
  Metadata metadata = rotary_decoder_config_metadata(model.config());
  metadata["arch"] = find_architecture(typeid(RotaryDecoder))->name;
  write_checkpoint_file(path, model.params(), model.config().vocab, tokenizer, std::move(metadata), extras);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
/// load_model_checkpoint of a rotary decoder with a character vocabulary; a file of another
/// architecture is refused.
[[deprecated("use load_model_checkpoint (and .model.as<RotaryDecoder>())")]] inline LoadedCheckpoint load_checkpoint(
    const std::string& path, bool remat = false) {
  LoadedModelCheckpoint loaded = load_model_checkpoint(path, remat);
  RotaryDecoder* model = loaded.model.as<RotaryDecoder>();
  if (!model)
    throw std::runtime_error(path + ": arch '" + loaded.model.arch() +
                             "' is not the rotary decoder; load it with load_model_checkpoint");
  return {std::move(*model), loaded.char_tokenizer(), std::move(loaded.extra_tensors), std::move(loaded.metadata)};
}
#pragma GCC diagnostic pop

}  // namespace tapegrad::nn
