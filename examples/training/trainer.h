// The training run behind train (and train_char): random-window batches, AdamW
// with warmup and cosine decay, clipping, periodic validation, metrics, atomic checkpoints that
// resume bit-identically, a clean stop on a signal, and a refusal to save a diverged model.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "core/precision.h"
#include "distributed/communicator.h"

namespace tapegrad::examples {

/// Model shape flags; nullopt when the command line did not give one (defaults for a new model,
/// the checkpoint's value on --resume, where a given value must agree with the checkpoint).
struct ModelFlags {
  std::optional<std::size_t> d_model, heads, blocks, max_len, d_ff;
  std::optional<std::string> arch;  // a registered architecture (nn/architecture.h); default "rotary"
  std::optional<float> dropout;     // default 0
};

struct TrainOptions {
  std::string data;  // the training text (UTF-8)
  std::string out = "out/char.safetensors";
  std::string metrics;  // default: <out without .safetensors>.metrics.csv
  std::string resume;   // a training checkpoint to continue from
  // A model to start from (a GGUF file, a Hugging Face folder or a tapegrad checkpoint): its weights,
  // its tokenizer for --data, a fresh optimizer; its shape comes from the file, so no shape flag.
  std::string init;
  // LoRA (nn/lora.h, docs/fine-tuning.md): adapters of rank lora on the lora_targets projections of
  // every block, scaled by lora_alpha / lora, the model frozen; merge folds them into the weights
  // when the run finishes (the checkpoint keeps them apart), for what is exported.
  std::optional<std::size_t> lora;
  float lora_alpha = 8;              // PEFT's default
  std::string lora_targets = "q,v";  // PEFT's default for Llama
  bool merge = false;
  // Written from the final model when the run finishes (a Llama with a BPE tokenizer, nn/export.h):
  // a Hugging Face folder and a GGUF file whose matrices are export_type ("f32", "bf16", "q8_0").
  std::string export_hf, export_gguf, export_type = "f32";
  ModelFlags model;
  std::size_t seq = 128, batch = 16;  // batch: global, the sum over all ranks of a data-parallel run
  std::size_t micro_batches = 1;      // each rank's rows in this many parts, gradients summed in order
  std::int64_t steps = 1000;
  std::optional<std::int64_t> decay_steps;                             // default: steps
  float lr = 1e-3f, min_lr = 1e-4f, weight_decay = 0.1f, clip = 1.0f;  // clip 0: no clipping
  float beta1 = 0.9f, beta2 = 0.95f;   // nanoGPT's betas (0.95: steadier with small batches)
  std::optional<std::int64_t> warmup;  // default: 100, capped at a tenth of the decay steps
  std::uint64_t seed = 0;
  bool remat = false;
  Precision precision = Precision::f32;  // bf16: the matrix products' inputs rounded (core/precision.h)
  bool shard_optimizer = false;  // ZeRO-1: each rank keeps and updates 1/N of the AdamW state
  int threads = 0;                // 0: OMP_NUM_THREADS, else all cores
  std::int64_t eval_every = 100;  // 0: validate only at the end
  std::size_t eval_batches = 20;
  std::int64_t save_every = 500;              // 0: save only at the end (and on a signal)
  // Test seams, set only by the tests through train's TAPEGRAD_TEST_* environment variables
  // (docs/testing.md), each for one step:
  std::optional<std::int64_t> inject_nan_at;        // a NaN in the head bias before this step
  std::optional<std::int64_t> inject_nan_batch_at;  // a NaN in this step's batch (its first logit)
  std::optional<std::int64_t> fail_save_at;         // the save after this step fails like a full disk
  std::optional<std::int64_t> perturb_last_rank_at;  // after this step the last rank's weights drift

  /// Throws UsageError naming the first bad value (the model shape is checked when it is built).
  void validate() const;
  std::int64_t decay() const { return decay_steps.value_or(steps); }
  std::int64_t warmup_steps() const { return warmup.value_or(std::min<std::int64_t>(100, decay() / 10)); }
};

enum class TrainOutcome { finished, interrupted };

/// Runs (or resumes) training. Returns interrupted when stop_signal became non-zero between two
/// steps (a checkpoint of the current step is saved first). A non-finite loss or gradient norm,
/// or a save that fails, throws std::runtime_error naming the step and the checkpoint that is
/// kept, without touching it. Holds an OutputLock on options.out for the whole run, so a second
/// run writing the same checkpoint throws before touching any file.
/// Progress and log lines go to stdout (the live line to stderr on a terminal).
TrainOutcome train(const TrainOptions& options, const std::atomic<int>& stop_signal);
/// The same, data-parallel over comm: every rank draws the same global batch
/// and computes its batch / size rows; gradients are summed in rank order (distributed/data_parallel.h),
/// so the result equals one process with --micro-batches size. Rank 0 alone reads --data,
/// --resume and --init (and sends the encoded text, the model's config and its state), validates,
/// writes the files and holds the lock; the loss check and signal stops are agreed, so every rank
/// stops at the same step.
TrainOutcome train(const TrainOptions& options, const std::atomic<int>& stop_signal, distributed::Communicator& comm);

/// Whether the error train() threw was raised on every rank alike (a bad flag, a failure rank 0
/// reported to all, a diverged loss): then only rank 0 need print it, and MPI can end normally;
/// otherwise the caller ends every rank with Communicator::abort.
bool failure_is_agreed();

/// The signal that ended the last train() that returned interrupted (under mpirun, the one the
/// ranks agreed on, which this rank may not have received itself).
int interrupting_signal();

/// Installs SIGINT, SIGTERM and SIGUSR1 handlers that store the signal number in the returned flag; a
/// second signal while the first is handled ends the process at once (the default action).
const std::atomic<int>& install_stop_handlers();

/// "out/char.safetensors" -> "out/char" (the stem beside which the metrics files go).
std::string output_stem(const std::string& out);

}  // namespace tapegrad::examples
