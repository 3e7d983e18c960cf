// One training run: its state (corpus, model, AdamW, batch stream, step), its checkpoints (save,
// restore), and how it starts: rank 0 reads the inputs and builds the run, the other ranks receive it.
// Shared by the files of the trainer (trainer.cpp runs the loop); not an interface of its own.
#pragma once

#include <fmt/format.h>

#include <concepts>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "training/corpus.h"
#include "training/metrics.h"
#include "training/output_lock.h"
#include "training/trainer.h"
#include "core/random.h"
#include "distributed/communicator.h"
#include "nn/checkpoint.h"
#include "nn/language_model.h"
#include "optim/adamw.h"

namespace tapegrad::examples {

// Independent random streams from one --seed (Rng's splitmix64 seeding decorrelates them):
// the model's initialisation uses the seed itself.
constexpr std::uint64_t kBatchStream = 1, kValidationStream = 2;
inline std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t stream) {
  return seed ^ (stream * 0x9e3779b97f4a7c15ULL);
}

/// A value as a flag or a metadata entry shows it.
inline std::string str(float v) { return fmt::format("{}", v); }
template <class T>
inline std::string str(T v) requires std::integral<T> {
  return std::to_string(v);
}

/// The hyperparameters a resume compares with its command line: metadata "train.<key>" -> value
/// as text; the key is the flag's name with _ for - (beta1 and beta2 are fixed, not flags).
std::map<std::string, std::string> hyperparameters(const TrainOptions& o, std::int64_t decay_steps);

/// The live state of one run.
struct Run {
  const TrainOptions& o;
  std::int64_t decay_steps;
  Corpus corpus;
  nn::LanguageModel model;
  ParameterList params;
  optim::AdamW optimizer;
  Rng batch_rng;
  std::int64_t step = 0;         // steps completed
  std::int64_t saved_step = -1;  // the step of the checkpoint at o.out written by this run
  std::optional<std::string> chat_template;  // the --init or --resume file's (rank 0), saved and exported

  Run(const TrainOptions& options, std::int64_t decay, Corpus&& text, nn::LanguageModel&& m)
      : o(options),
        decay_steps(decay),
        corpus(std::move(text)),
        model(std::move(m)),
        params(trainable(model.params())),  // a LoRA run's frozen base is no optimizer's
        optimizer(params, {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .weight_decay = o.weight_decay}),
        batch_rng(stream_seed(o.seed, kBatchStream)) {}

  /// What stays at o.out when the run stops without saving, for the message.
  std::string kept() const;
  /// Writes the checkpoint of the current step to o.out atomically; a failure names the step and
  /// what is kept (the file at o.out is then untouched: core/safetensors).
  void save(const optim::OptimizerState& state);
  /// Restores the optimizer, the batch stream and the step from a training checkpoint; returns
  /// notes on the hyperparameters that differ from the checkpoint's.
  std::vector<std::string> restore(const nn::LoadedModelCheckpoint& ckpt);
};

/// Throws a UsageError (on every rank alike) for a bad flag or a --batch that does not split into
/// equal parts over the ranks and micro-batches.
void check_options(const TrainOptions& o, std::size_t ranks);

/// What the set-up leaves for the training loop: the run, and the notes it logs.
struct Setup {
  std::optional<Run> run;
  std::vector<std::string> notes;    // the --init model; hyperparameters that differ from --resume's
  std::vector<std::string> removed;  // temporary files of killed writers, removed
  std::optional<OutputLock> lock;    // on o.out, for the whole run (rank 0)
};

/// Rank 0: reads --data and --resume or --init and checks them against the flags, builds the run
/// (a new model, one from --init, or resumed), then creates the output folder, takes the lock and
/// removes stale temporary files.
/// Inputs are checked first, so that a bad one leaves no trace (not even a folder).
void prepare_leader_run(const TrainOptions& o, std::int64_t decay_steps, const MetricsLog& metrics, Setup& setup);

/// With several ranks: rank 0 sends its corpus (tokenizer and ids), its model's config and its
/// state; the other ranks build the same run from them (they need no copy of --data, --resume or
/// --init).
void share_leader_run(const TrainOptions& o, std::int64_t decay_steps, distributed::Communicator& comm, Setup& setup);

}  // namespace tapegrad::examples
