// Model checkpoints in safetensors (docs/checkpoints.md): the parameters under their module
// names, and the hyperparameters and the character vocabulary in "__metadata__", so that a checkpoint is
// all that generation needs. Training checkpoints add "optim." tensors and more metadata.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "nn/models/rotary_decoder.h"
#include "nn/tokenizer.h"
#include "tokenizers/tokenizer.h"

namespace tapegrad::nn {

/// The "format_version" this build writes and reads.
inline constexpr const char* kCheckpointFormatVersion = "1";

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

/// Writes the model, its vocabulary and extras atomically to path (temporary file, fsync, rename),
/// with no "arch" key (save_model_checkpoint writes arch = "rotary"; both read alike).
void save_checkpoint(const std::string& path, const RotaryDecoder& model, const CharTokenizer& tokenizer,
                     const CheckpointExtras& extras = {});

/// A rotary decoder checkpoint as load_checkpoint read it.
struct LoadedCheckpoint {
  RotaryDecoder model;                                 ///< the model, its weights loaded
  CharTokenizer tokenizer;                             ///< the vocabulary it was trained with
  std::map<std::string, Tensor> extra_tensors;         ///< the "optim." tensors
  std::map<std::string, std::string> metadata;         ///< everything in "__metadata__"
};

/// Reads and checks everything: the file layout (core/safetensors), the metadata (every key
/// present, integers in range, a vocabulary of vocab_size characters), every parameter present
/// with its exact shape, no unknown tensor, and every value finite. Errors name the file and the
/// problem. load_model_checkpoint (nn/language_model.h) does the reading; a file of another
/// architecture is refused.
LoadedCheckpoint load_checkpoint(const std::string& path, bool remat = false);

}  // namespace tapegrad::nn
