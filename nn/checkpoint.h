// Model checkpoints in safetensors (docs/checkpoints.md) for any registered architecture: the
// parameters under their module names; the architecture ("arch"), its config, the tokenizer and
// "format_version" in "__metadata__", so that a checkpoint is all that generation needs.
// Training checkpoints add "optim." tensors and more metadata.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "nn/architecture.h"
#include "nn/language_model.h"
#include "tokenizers/char_tokenizer.h"
#include "tokenizers/tokenizer.h"

namespace tapegrad::nn {

/// The "format_version" this build writes and reads.
inline constexpr const char* kCheckpointFormatVersion = "1";

/// 0.2's architecture of a file with no "arch" key (a file of 0.1); since 0.3 such a file is
/// refused: tapegrad 0.2 loads it and save_model_checkpoint writes it again with "arch".
[[deprecated("a checkpoint without \"arch\" is refused since 0.3")]] inline constexpr const char* kArchWithoutKey =
    "rotary";

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

/// Reads and checks a checkpoint of any registered architecture, by the file's "arch" (a file of
/// 0.1, without it, is refused with how to convert it): the file layout (io/safetensors), the
/// metadata (every key present, integers in range, a vocabulary that fits vocab_size), every
/// parameter present with its exact shape, no unknown tensor, and every value finite. Errors name
/// the file and the problem.
LoadedModelCheckpoint load_model_checkpoint(const std::string& path, bool remat = false);

}  // namespace tapegrad::nn
