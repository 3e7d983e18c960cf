// The training loop of train_char, its checkpoints (model + AdamW state + metadata) and resume.
#include "common/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <array>
#include <bit>
#include <map>

#include "common/batches.h"
#include "common/corpus.h"
#include "common/metrics.h"
#include "common/output_lock.h"
#include "common/program.h"
#include "common/progress.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "distributed/data_parallel.h"
#include "io/safetensors.h"
#include "nn/architecture.h"
#include "nn/checkpoint.h"
#include "nn/checkpoint_metadata.h"
#include "nn/language_model.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/schedule.h"

namespace tapegrad::examples {

namespace {

// Independent random streams from one --seed (Rng's splitmix64 seeding decorrelates them):
// the model's initialisation uses the seed itself.
constexpr std::uint64_t kBatchStream = 1, kValidationStream = 2;
std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t stream) { return seed ^ (stream * 0x9e3779b97f4a7c15ULL); }

std::string str(float v) { return fmt::format("{}", v); }
template <class T>
std::string str(T v) requires std::integral<T> {
  return std::to_string(v);
}

/// The hyperparameters a resume compares with its command line: metadata "train.<key>" -> value
/// as text; the key is the flag's name with _ for - (beta1 and beta2 are fixed, not flags).
std::map<std::string, std::string> hyperparameters(const TrainOptions& o, std::int64_t decay_steps) {
  return {{"seq", str(o.seq)},
          {"batch", str(o.batch)},
          {"seed", str(o.seed)},
          {"lr", str(o.lr)},
          {"min_lr", str(o.min_lr)},
          {"warmup", str(o.warmup_steps())},
          {"decay_steps", str(decay_steps)},
          {"weight_decay", str(o.weight_decay)},
          {"clip", str(o.clip)},
          {"beta1", str(o.beta1)},
          {"beta2", str(o.beta2)}};
}

void check_flag(const char* flag, const std::optional<std::size_t>& given, std::size_t saved, const std::string& path) {
  if (given && *given != saved)
    throw UsageError(
        fmt::format("--{} {} disagrees with --resume {}, whose model has {} {} (the shape comes from the "
                    "checkpoint; drop the flag)",
                    flag, *given, path, flag, saved));
}

/// A new model of o.model's --arch (default "rotary", any registered name) and sizes.
nn::LanguageModel new_model(const TrainOptions& o, std::size_t vocab) {
  const nn::ModelShape shape{.vocab = vocab,
                             .d_model = o.model.d_model.value_or(64),
                             .n_heads = o.model.heads.value_or(4),
                             .n_blocks = o.model.blocks.value_or(2),
                             .max_len = o.model.max_len.value_or(256),
                             .d_ff = o.model.d_ff,
                             .dropout = o.model.dropout.value_or(0.0f),
                             .remat = o.remat,
                             .seed = o.seed};
  try {
    return nn::find_architecture(o.model.arch.value_or("rotary"), "--arch").make(shape);
  } catch (const std::invalid_argument& e) {  // an unknown --arch, or sizes the architecture refuses
    throw UsageError(e.what());
  }
}

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

  Run(const TrainOptions& options, std::int64_t decay, Corpus&& text, nn::LanguageModel&& m)
      : o(options),
        decay_steps(decay),
        corpus(std::move(text)),
        model(std::move(m)),
        params(model.params()),
        optimizer(params, {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .weight_decay = o.weight_decay}),
        batch_rng(stream_seed(o.seed, kBatchStream)) {}

  /// What stays at o.out when the run stops without saving, for the message.
  std::string kept() const {
    if (saved_step >= 0) return fmt::format("the checkpoint of step {}, {}, is kept", saved_step, o.out);
    if (!o.resume.empty()) return fmt::format("the checkpoint it resumed from, {}, is kept", o.resume);
    return "no checkpoint was written";
  }

  /// Writes the checkpoint of the current step to o.out atomically; a failure names the step and
  /// what is kept (the file at o.out is then untouched: core/safetensors).
  void save(const optim::OptimizerState& state) {
    nn::CheckpointExtras extras;
    for (const auto& t : state.tensors) extras.tensors.emplace_back(t.name, &t.value);
    for (const auto& [key, value] : hyperparameters(o, decay_steps)) extras.metadata["train." + key] = value;
    extras.metadata["train.steps"] = str(o.steps);
    extras.metadata["step"] = str(step);
    extras.metadata["optimizer_steps"] = str(state.step);
    extras.metadata["rng_state"] = batch_rng.state();
    // Windows start at random offsets drawn from rng_state; data_position counts the windows drawn.
    extras.metadata["data_position"] = str(std::int64_t(step) * std::int64_t(o.batch));
    extras.metadata["data_fingerprint"] = fmt::format("fnv1a64:{:016x}", corpus.fingerprint);
    extras.metadata["data_chars"] = str(corpus.ids.size());
    // Test seam: past the header (a few kilobytes), into the tensors.
    if (o.fail_save_at && *o.fail_save_at == step) detail::safetensors_fail_after_bytes = 4096;
    try {
      nn::save_model_checkpoint(o.out, model, corpus.tokenizer, extras);
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("cannot save the checkpoint of step {}: {}; {}", step, e.what(), kept()));
    }
    saved_step = step;
  }

  /// Restores the optimizer, the batch stream and the step from a training checkpoint; returns
  /// notes on the hyperparameters that differ from the checkpoint's.
  std::vector<std::string> restore(const nn::LoadedModelCheckpoint& ckpt) {
    const auto& meta = ckpt.metadata;
    try {
      if (!meta.count("step"))
        throw std::runtime_error(
            "it is not a training checkpoint (no 'step' in its metadata); train from scratch "
            "without --resume");
      step = nn::metadata_count(meta, "step");
      batch_rng.set_state(nn::metadata_text(meta, "rng_state"));
      optim::OptimizerState state{{}, nn::metadata_count(meta, "optimizer_steps")};
      for (const auto& [name, tensor] : ckpt.extra_tensors) state.tensors.push_back({name, tensor});
      optimizer.load_state(state);
      const std::string fingerprint = fmt::format("fnv1a64:{:016x}", corpus.fingerprint);
      auto saved_fingerprint = meta.find("data_fingerprint");
      if (saved_fingerprint == meta.end() || saved_fingerprint->second != fingerprint)
        throw std::runtime_error(fmt::format(
            "it was trained on another text than {} (fingerprint {} here, {} there); "
            "resume with the same --data",
            corpus.path, fingerprint, saved_fingerprint == meta.end() ? "none" : saved_fingerprint->second));
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("--resume {}: {}", o.resume, e.what()));
    }
    std::vector<std::string> notes;
    for (const auto& [key, value] : hyperparameters(o, decay_steps)) {
      auto it = meta.find("train." + key);
      std::string flag = key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      if (it != meta.end() && it->second != value)
        notes.push_back(
            fmt::format("note: --{} {} differs from the checkpoint's {}; continuing with {} (the result "
                        "will differ from an uninterrupted run)",
                        flag, value, it->second, value));
    }
    return notes;
  }
};

std::atomic<bool> g_agreed_failure{false};

/// Marks the error about to be thrown as raised on every rank alike (failure_is_agreed()).
template <class F>
decltype(auto) agreed(F&& body) {
  try {
    return body();
  } catch (...) {
    g_agreed_failure = true;
    throw;
  }
}

/// Runs body on rank 0 only; its failure is sent to every rank, which all throw it (agreed).
template <class F>
void on_leader(distributed::Communicator& comm, F&& body) {
  if (comm.size() == 1) return body();
  int status = 0;  // 0: done; 2: a UsageError; 1: another error
  std::string message;
  if (comm.rank() == 0) {
    try {
      body();
    } catch (const UsageError& e) {
      status = 2, message = e.what();
    } catch (const std::exception& e) {
      status = 1, message = e.what();
    }
  }
  distributed::broadcast_values(comm, std::span(&status, 1));
  if (status == 0) return;
  distributed::broadcast_string(comm, message);
  g_agreed_failure = true;
  if (status == 2) throw UsageError(message);
  throw std::runtime_error(message);
}

/// Rank 0's run (after its setup) to every other rank: the parameters, the optimizer state, the
/// step and the batch stream.
void broadcast_state(distributed::Communicator& comm, Run& run) {
  for (NamedParameter& p : run.params) {
    Tensor& value = p.var.mutable_value();
    distributed::broadcast_values(comm, std::span(value.data(), value.size()));
  }
  optim::OptimizerState state = run.optimizer.state();
  for (auto& t : state.tensors) distributed::broadcast_values(comm, std::span(t.value.data(), t.value.size()));
  distributed::broadcast_values(comm, std::span(&state.step, 1));
  if (comm.rank() != 0) run.optimizer.load_state(state);
  distributed::broadcast_values(comm, std::span(&run.step, 1));
  std::string rng = run.batch_rng.state();
  distributed::broadcast_string(comm, rng);
  run.batch_rng.set_state(rng);
}

[[noreturn]] void diverged(const char* what, double value, const Run& run, MetricsLog& metrics, bool leader) {
  g_agreed_failure = true;  // the loss and the gradient norm are the same on every rank
  if (leader) metrics.write();
  // A NaN's sign bit depends on the instruction set that made it and means nothing to a user.
  std::string shown = std::isnan(value) ? std::string("nan") : fmt::format("{}", value);
  throw std::runtime_error(
      fmt::format("the {} is {} at step {}; stopped without saving ({})", what, shown, run.step + 1, run.kept()));
}

std::atomic<int> g_stop_signal{0};
int g_interrupting_signal = 0;  // see interrupting_signal()

extern "C" void on_stop_signal(int signal) {
  if (g_stop_signal.load() != 0) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  g_stop_signal.store(signal);
}

/// What the other ranks need to build rank 0's model besides its arch: d_model, heads, blocks,
/// max_len, d_ff, the dropout's bits and the seed (the root of the dropout streams).
constexpr int kShapeFields = 7;
std::array<std::uint64_t, kShapeFields> shape_fields(const nn::LanguageModel& model) {
  const nn::ModelShape s = nn::find_architecture(model.arch()).shape(model);
  return {s.d_model, s.n_heads, s.n_blocks, s.max_len, s.d_ff.value_or(0), std::bit_cast<std::uint32_t>(s.dropout),
          s.seed};
}

}  // namespace

void TrainOptions::validate() const {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw UsageError(message);
  };
  require(!data.empty(), "no training text: pass --data FILE or set the DATA environment variable");
  require(!out.empty(), "--out must not be empty");
  std::error_code ec;
  require(!std::filesystem::is_directory(out, ec), fmt::format("--out {} is a folder; give a file name", out));
  require(seq >= 1, fmt::format("--seq must be at least 1, got {}", seq));
  require(batch >= 1, fmt::format("--batch must be at least 1, got {}", batch));
  require(micro_batches >= 1, fmt::format("--micro-batches must be at least 1, got {}", micro_batches));
  require(batch % micro_batches == 0,
          fmt::format("--batch {} does not split into --micro-batches {} equal parts; give a --batch divisible by {}",
                      batch, micro_batches, micro_batches));
  require(steps >= 1, fmt::format("--steps must be at least 1, got {}", steps));
  require(!decay_steps || *decay_steps >= 1,
          fmt::format("--decay-steps must be at least 1, got {}", decay_steps.value_or(0)));
  require(warmup_steps() >= 0 && warmup_steps() <= decay(),
          fmt::format("--warmup must be in [0, decay steps {}], got {}", decay(), warmup_steps()));
  require(std::isfinite(lr) && lr > 0, fmt::format("--lr must be a positive number, got {}", lr));
  require(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr,
          fmt::format("--min-lr must be in [0, --lr {}], got {}", lr, min_lr));
  require(std::isfinite(weight_decay) && weight_decay >= 0,
          fmt::format("--weight-decay must be a number >= 0, got {}", weight_decay));
  require(std::isfinite(clip) && clip >= 0, fmt::format("--clip must be a number >= 0 (0: no clipping), got {}", clip));
  require(threads >= 0, fmt::format("--threads must be >= 0 (0: OMP_NUM_THREADS, else all cores), got {}", threads));
  require(eval_every >= 0, fmt::format("--eval-every must be >= 0 (0: only at the end), got {}", eval_every));
  require(eval_batches >= 1, fmt::format("--eval-batches must be at least 1, got {}", eval_batches));
  require(save_every >= 0, fmt::format("--save-every must be >= 0 (0: only at the end), got {}", save_every));
  try {
    if (model.arch) nn::find_architecture(*model.arch, "--arch");
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  for (const auto& [flag, value] : {std::pair{"d-model", model.d_model},
                                    {"heads", model.heads},
                                    {"blocks", model.blocks},
                                    {"max-len", model.max_len},
                                    {"d-ff", model.d_ff}})
    require(!value || *value >= 1, fmt::format("--{} must be at least 1, got {}", flag, value.value_or(0)));
}

std::string output_stem(const std::string& out) {
  constexpr std::string_view ext = ".safetensors";
  if (out.size() > ext.size() && out.compare(out.size() - ext.size(), ext.size(), ext) == 0)
    return out.substr(0, out.size() - ext.size());
  return out;
}

const std::atomic<int>& install_stop_handlers() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);  // mpirun forwards SIGUSR1 to every rank: a way to stop a run
  return g_stop_signal;
}

bool failure_is_agreed() { return g_agreed_failure.load(); }

int interrupting_signal() { return g_interrupting_signal; }

TrainOutcome train(const TrainOptions& o, const std::atomic<int>& stop_signal) {
  distributed::SingleProcess one;
  return train(o, stop_signal, one);
}

namespace {

/// Throws a UsageError (on every rank alike) for a bad flag or a --batch that does not split into
/// equal parts over the ranks and micro-batches.
void check_options(const TrainOptions& o, std::size_t ranks) {
  agreed([&] {
    o.validate();
    if (o.batch % (ranks * o.micro_batches) != 0)
      throw UsageError(fmt::format(
          "--batch {} does not split among {} ranks{}: it is the global batch, each rank computes --batch / {} "
          "rows; give a --batch divisible by {}",
          o.batch, ranks, o.micro_batches > 1 ? fmt::format(" x --micro-batches {}", o.micro_batches) : "",
          ranks, ranks * o.micro_batches));
  });
}

/// What the set-up leaves for the training loop: the run, and the notes it logs.
struct Setup {
  std::string text;  // the training text's bytes, for the other ranks
  std::optional<Run> run;
  std::vector<std::string> notes;    // hyperparameters that differ from the resumed checkpoint's
  std::vector<std::string> removed;  // temporary files of killed writers, removed
  std::optional<OutputLock> lock;    // on o.out, for the whole run (rank 0)
};

/// Rank 0: reads --data and --resume and checks them against the flags, builds the run (new or
/// resumed), then creates the output folder, takes the lock and removes stale temporary files.
/// Inputs are checked first, so that a bad one leaves no trace (not even a folder).
void prepare_leader_run(const TrainOptions& o, std::int64_t decay_steps, const MetricsLog& metrics, Setup& setup) {
  setup.text = read_file(o.data);
  Corpus corpus = corpus_from_bytes(o.data, setup.text);
  std::optional<nn::LoadedModelCheckpoint> ckpt;
  std::optional<nn::LanguageModel> fresh;
  if (!o.resume.empty()) {
    ckpt.emplace(nn::load_model_checkpoint(o.resume, o.remat));
    const std::string arch = ckpt->model.arch();
    if (o.model.arch && *o.model.arch != arch)
      throw UsageError(fmt::format("--arch {} disagrees with --resume {}, whose model is {} (drop the flag)",
                                   *o.model.arch, o.resume, arch));
    auto meta_size = [&](const char* key) { return std::size_t(nn::metadata_count(ckpt->metadata, key)); };
    check_flag("d-model", o.model.d_model, meta_size("d_model"), o.resume);
    check_flag("heads", o.model.heads, meta_size("n_heads"), o.resume);
    check_flag("blocks", o.model.blocks, meta_size("n_blocks"), o.resume);
    check_flag("max-len", o.model.max_len, meta_size("max_len"), o.resume);
    check_flag("d-ff", o.model.d_ff, meta_size("d_ff"), o.resume);
    const float saved_dropout = nn::find_architecture(arch).shape(ckpt->model).dropout;
    if (o.model.dropout && *o.model.dropout != saved_dropout)
      throw UsageError(fmt::format("--dropout {} disagrees with --resume {}, whose model has dropout {} (drop the flag)",
                                   *o.model.dropout, o.resume, saved_dropout));
    if (ckpt->char_tokenizer().vocab() != corpus.tokenizer.vocab())
      throw std::runtime_error(
          fmt::format("--resume {}: its vocabulary ({} characters) differs from that of {} ({} "
                      "characters); resume with the same --data",
                      o.resume, ckpt->char_tokenizer().size(), o.data, corpus.tokenizer.size()));
  } else {
    fresh.emplace(new_model(o, corpus.tokenizer.size()));
  }
  const std::size_t max_len = (ckpt ? ckpt->model : *fresh).config().max_len;
  if (o.seq > max_len)
    throw UsageError(fmt::format("--seq {} is longer than the model's max_len {}", o.seq, max_len));
  if (corpus.train().size() < o.seq + 1)
    throw std::runtime_error(
        fmt::format("{}: the training split (the first 90%) has {} characters; --seq {} needs at "
                    "least {} (use a longer text or a smaller --seq)",
                    o.data, corpus.train().size(), o.seq, o.seq + 1));
  if (corpus.validation().size() < 2)
    throw std::runtime_error(
        fmt::format("{}: the validation split (the last 10%) has {} characters; at least 2 are "
                    "needed (use a longer text)",
                    o.data, corpus.validation().size()));

  Run& run = setup.run.emplace(o, decay_steps, std::move(corpus), ckpt ? std::move(ckpt->model) : std::move(*fresh));
  if (ckpt) setup.notes = run.restore(*ckpt);
  ckpt.reset();
  if (run.step > o.steps)
    throw UsageError(
        fmt::format("--steps {} is below the step {} that --resume {} reached", o.steps, run.step, o.resume));

  create_parent_directories(o.out);  // fail now rather than at the first save
  setup.lock.emplace(o.out);         // before any file is written
  for (const std::string& path : {o.out, metrics.csv_path(), metrics.svg_path()})
    for (std::string& file : remove_stale_temporaries(path)) setup.removed.push_back(std::move(file));
}

/// With several ranks: rank 0 sends its text, its model's shape and its state; the other ranks
/// build the same run from them (they need no copy of --data or --resume).
void share_leader_run(const TrainOptions& o, std::int64_t decay_steps, distributed::Communicator& comm, Setup& setup) {
  distributed::broadcast_string(comm, setup.text);
  std::string arch;
  std::array<std::uint64_t, kShapeFields> fields{};
  if (comm.rank() == 0) arch = setup.run->model.arch(), fields = shape_fields(setup.run->model);
  distributed::broadcast_string(comm, arch);
  distributed::broadcast_values(comm, std::span(fields));
  if (comm.rank() != 0) {
    TrainOptions shape = o;  // the model of rank 0, whether new or resumed
    shape.model = {fields[0], fields[1], fields[2], fields[3], fields[4] ? std::optional(fields[4]) : std::nullopt, arch,
                   std::bit_cast<float>(std::uint32_t(fields[5]))};
    shape.seed = fields[6];
    Corpus corpus = corpus_from_bytes(o.data, setup.text);
    nn::LanguageModel model = new_model(shape, corpus.tokenizer.size());
    setup.run.emplace(o, decay_steps, std::move(corpus), std::move(model));
  }
  broadcast_state(comm, *setup.run);
}

/// One training step's figures.
struct StepResult {
  double loss;     // the mean over every part of the global batch
  float lr;        // the lr it used
  double seconds;  // its wall time, from the batch drawn to the update done
  double exchange_seconds;  // of which the gradient exchange between ranks
};

/// The training loop of a prepared run: steps, periodic validation, metrics and saves, the stop
/// on a signal, and the closing lines. Rank 0 alone validates, prints and writes files.
class TrainingLoop {
 public:
  TrainingLoop(const TrainOptions& o, std::int64_t decay_steps, distributed::Communicator& comm, Run& run,
               MetricsLog& metrics)
      : o_(o),
        decay_steps_(decay_steps),
        comm_(comm),
        run_(run),
        metrics_(metrics),
        ranks_(std::size_t(comm.size())),
        leader_(comm.rank() == 0),
        parts_(ranks_ * o.micro_batches),
        rows_(o.batch / parts_),
        schedule_(optim::LrSchedule::warmup_cosine(o.lr, o.warmup_steps(), decay_steps, o.min_lr)),
        clip_(o.clip > 0 ? o.clip : std::numeric_limits<float>::max()),
        progress_(::isatty(::fileno(stderr)) == 1 && leader_, std::max<std::int64_t>(1, o.steps / 20), run.step,
                  o.steps, double(o.batch * o.seq)) {
    if (parts_ > 1) buckets_.emplace(run_.params);  // the sum of the parts' gradients
    if (sharded_)
      run_.optimizer.keep_only(distributed::optimizer_shard(optim::flat_size(run_.params), comm.rank(), comm.size()));
  }

  /// The data, the model, the schedule and any note, before the first step.
  void log_setup(const Setup& setup) {
    const Corpus& data = run_.corpus;
    log(fmt::format("data: {}: {} characters, vocabulary of {}; train {} (first 90%), validation {}", o_.data,
                    data.ids.size(), data.tokenizer.size(), data.train().size(), data.validation().size()));
    log(fmt::format("model: {}", run_.model.describe()));
    log(fmt::format("parameters: {}", run_.model.num_params()));
    log(fmt::format("training: {} steps of {} x {} tokens; AdamW lr {} (warmup {}, cosine to {} at step {}), "
                    "betas {}/{}, weight decay {}, clip {}; {} threads",
                    o_.steps, o_.batch, o_.seq, o_.lr, o_.warmup_steps(), o_.min_lr, decay_steps_, o_.beta1,
                    o_.beta2, o_.weight_decay, o_.clip > 0 ? str(o_.clip) : std::string("off"), num_threads()));
    if (parts_ > 1)
      log(fmt::format("data-parallel: {}; each step sums {} gradients of {} windows ({} rank{} x {} micro-batch{}) "
                      "in a fixed order, in {} buckets",
                      comm_.description(), parts_, rows_, ranks_, ranks_ > 1 ? "s" : "", o_.micro_batches,
                      o_.micro_batches > 1 ? "es" : "", buckets_->bucket_count()));
    if (ranks_ > 1)
      log(fmt::format("data-parallel: each bucket's exchange starts as soon as backward has finished its gradients"));
    if (sharded_)
      log(fmt::format("sharded optimizer state (--shard-optimizer): rank 0 keeps {:.2f} MB of AdamW state, of {:.2f} MB "
                      "unsharded; the parameters are gathered after every step",
                      double(run_.optimizer.state_bytes()) / 1e6,
                      double(2 * optim::flat_size(run_.params) * sizeof(float)) / 1e6));
    else if (o_.shard_optimizer)
      log("note: --shard-optimizer does nothing in a single process (one rank holds all the state)");
    const std::size_t max_len = run_.model.config().max_len;
    if (o_.resume.empty() && o_.seq < max_len)
      log(fmt::format("note: windows of --seq {} never train positions {} to {} of max_len {}: text generated "
                      "past {} characters will degrade (use --max-len {} to match)",
                      o_.seq, o_.seq, max_len - 1, max_len, o_.seq, o_.seq));
    for (const std::string& note : setup.notes) log(note);
    for (const std::string& file : setup.removed)
      log(fmt::format("note: removed {}, left by a run that was killed while writing", file));
    if (!o_.resume.empty()) {
      if (leader_ && !metrics_.load_until(run_.step))
        log(fmt::format("note: {} is missing or not from this run; it restarts at step {}", metrics_.csv_path(),
                        run_.step));
      log(fmt::format("resumed from {} at step {}", o_.resume, run_.step));
    }
  }

  /// Runs the steps left; returns interrupted when a stop signal arrived between two steps.
  TrainOutcome run(const std::atomic<int>& stop_signal) {
    if (run_.step == o_.steps) {
      log(fmt::format("nothing to do: the checkpoint is already at step {} of --steps {}", run_.step, o_.steps));
      return TrainOutcome::finished;
    }
    wall_before_ = metrics_.last_wall_s();
    if (o_.resume.empty() && o_.eval_every > 0) validate_now();
    stop_ = ranks_ > 1 ? 0 : stop_signal.load();  // with several ranks: agreed after every step
    while (run_.step < o_.steps) {
      if (ranks_ == 1) stop_ = stop_signal.load();
      if (stop_ != 0) return stop_on_signal();
      record(train_step(stop_signal));
      if (run_.step < o_.steps) validate_or_save_on_schedule();
    }
    finish();
    return TrainOutcome::finished;
  }

 private:
  void log(const std::string& line) {
    if (leader_) progress_.log(line);
  }
  void write_metrics() {
    if (leader_) metrics_.write();
  }
  /// Seconds since the run began, across resumes (the metrics' wall_s).
  double wall() const { return wall_before_ + progress_.elapsed_s(); }

  /// The validation loss (rank 0; the others return 0 and go on to the next collective), logged
  /// with the mean training loss since the last validation.
  double validate_now() {
    if (!leader_) return 0.0;
    run_.model.set_training(false);  // no dropout in validation
    const double val = sampled_loss(run_.model, run_.corpus.validation(), o_.batch, o_.seq, o_.eval_batches,
                                    stream_seed(o_.seed, kValidationStream));
    run_.model.set_training(true);
    metrics_.set_val_loss(run_.step, val, wall());
    const std::string train_part = train_count_ > 0 ? fmt::format("train loss {:.4f} (mean of {} steps), ",
                                                                  train_sum_ / double(train_count_), train_count_)
                                                    : std::string();
    log(fmt::format("step {}/{}: {}val loss {:.4f} ({:.3f} bits/char)", run_.step, o_.steps, train_part, val,
                    val / std::log(2.0)));
    write_metrics();
    return val;
  }

  /// Every rank checks that the replicas agree (and gathers a sharded optimizer state), then
  /// rank 0 writes; a failure reaches every rank.
  void save() {
    if (ranks_ > 1) agreed([&] { distributed::check_same_parameters(comm_, run_.params, fmt::format("step {}", run_.step)); });
    std::optional<optim::OptimizerState> gathered;
    if (sharded_) gathered = distributed::gathered_state(comm_, run_.optimizer);
    on_leader(comm_, [&] { run_.save(gathered ? *gathered : run_.optimizer.state()); });
  }

  /// Saves the current step and says how to continue.
  TrainOutcome stop_on_signal() {
    save();
    write_metrics();
    log(fmt::format("interrupted by signal {} at step {}/{}: saved {}; continue with --resume {}", stop_, run_.step,
                    o_.steps, o_.out, o_.out));
    comm_.barrier();  // no rank ends (and has the launcher end the others) before rank 0 is done
    g_interrupting_signal = stop_;
    return TrainOutcome::interrupted;
  }

  /// This rank's parts of the batch, forward and backward one after another, their gradients
  /// summed in order (with several ranks, the last part's backward starts the exchange); returns
  /// the sum of their losses.
  double forward_backward_parts(const Batch& batch) {
    double loss = 0;
    for (std::size_t m = 0; m < o_.micro_batches; ++m) {
      const std::size_t part = std::size_t(comm_.rank()) * o_.micro_batches + m, tokens = rows_ * o_.seq;
      const std::span<const std::int32_t> inputs = std::span(batch.inputs).subspan(part * tokens, tokens);
      const std::span<const std::int32_t> targets = std::span(batch.targets).subspan(part * tokens, tokens);
      Tape tape;
      Var logits = run_.model.forward(inputs, rows_, o_.seq);  // (rows, T, vocab)
      if (o_.inject_nan_batch_at && *o_.inject_nan_batch_at == run_.step + 1 && part == 0) {
        Tensor poison(logits.shape());  // zeros but the first logit of the batch
        poison[0] = std::numeric_limits<float>::quiet_NaN();
        logits = add(logits, Var(std::move(poison)));
      }
      Var part_loss = cross_entropy(logits, targets);  // the model's loss(), with room for the seam
      loss += part_loss.value().item();
      const bool overlap = ranks_ > 1 && m + 1 == o_.micro_batches;
      BackwardObserver* exchange = overlap ? &buckets_->exchange_during_backward(comm_) : nullptr;
      if (std::isfinite(loss)) tape.backward(part_loss, exchange);
      if (buckets_) {
        if (!overlap) buckets_->accumulate();  // gradients of part 0 copied, the others added in order
        run_.optimizer.zero_grad();
      }
    }
    return loss;
  }

  /// With several ranks, one exchange agrees on the loss (so a NaN on one rank stops all) and on
  /// a stop signal; returns the sum of every rank's loss.
  double agree_on_loss_and_stop(double loss, const std::atomic<int>& stop_signal) {
    if (ranks_ == 1) return loss;
    struct Report {
      double loss;
      std::int64_t stop;
    };
    const std::vector<Report> reports = distributed::allgather_value(comm_, Report{loss, stop_signal.load()});
    double sum = 0;
    for (const Report& r : reports) sum += r.loss, stop_ = std::max<int>(stop_, int(r.stop));
    return sum;
  }

  /// One AdamW step on the global batch: draw it, run this rank's parts, agree on the loss, sum
  /// the gradients over the parts, clip and update. Throws (saving nothing) on a non-finite loss
  /// or gradient norm.
  StepResult train_step(const std::atomic<int>& stop_signal) {
    const float lr = schedule_.at(run_.step);
    run_.optimizer.set_lr(lr);
    // The global batch, drawn alike on every rank (rng_state and data_position do not depend on
    // the number of ranks); this rank computes parts rank * micro_batches + m, rows each.
    const Batch batch = sample_batch(run_.corpus.train(), o_.batch, o_.seq, run_.batch_rng);
    const auto started = std::chrono::steady_clock::now();
    if (o_.inject_nan_at && *o_.inject_nan_at == run_.step + 1) {
      // A NaN that reaches every logit: the last parameter, which feeds the logits directly in
      // the built-in architectures (rotary's head bias, gpt2's final norm bias before its tied head).
      run_.params.back().var.mutable_value()[0] = std::numeric_limits<float>::quiet_NaN();
    }
    // The masks of a step depend on it alone: resume is exact, and every part (rank or
    // micro-batch) draws the same masks for its rows whatever the split.
    run_.model.set_dropout_step(std::uint64_t(run_.step));
    double loss = forward_backward_parts(batch);
    // The exchange completes before the next collective (the loss), whatever the loss: every
    // rank calls the collectives in the same order.
    double exchange_seconds = buckets_ ? buckets_->reduce(comm_, parts_) : 0.0;
    loss = agree_on_loss_and_stop(loss, stop_signal) / double(parts_);
    if (!std::isfinite(loss)) diverged("loss", loss, run_, metrics_, leader_);
    const float norm = optim::clip_grad_norm(run_.params, clip_);
    if (!std::isfinite(norm)) diverged("gradient norm", norm, run_, metrics_, leader_);
    run_.optimizer.step();
    run_.optimizer.zero_grad();
    if (sharded_) {  // each rank updated its shard: share them
      const auto gather_started = std::chrono::steady_clock::now();
      distributed::allgather_parameters(comm_, run_.params);
      exchange_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - gather_started).count();
    }
    ++run_.step;
    if (o_.perturb_last_rank_at && *o_.perturb_last_rank_at == run_.step && ranks_ > 1 &&
        comm_.rank() + 1 == comm_.size())
      run_.params.back().var.mutable_value()[0] += 1.0f;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return {loss, lr, seconds, exchange_seconds};
  }

  /// The step's row of metrics, its share of the closing figures, and the progress line.
  void record(const StepResult& step) {
    metrics_.add({run_.step, step.loss, std::nullopt, step.lr, double(o_.batch * o_.seq) / step.seconds, wall()});
    exchange_seconds_ += step.exchange_seconds, step_seconds_ += step.seconds, ++steps_run_;
    train_sum_ += step.loss;
    ++train_count_;
    if (leader_) progress_.step(run_.step, step.loss, step.lr, step.seconds);
  }

  /// Between two steps: validation every --eval-every steps (else the metrics files every
  /// twentieth of the run), a checkpoint every --save-every steps.
  void validate_or_save_on_schedule() {
    const std::int64_t write_every = std::max<std::int64_t>(1, o_.steps / 20);
    if (o_.eval_every > 0 && run_.step % o_.eval_every == 0) {
      validate_now();
      train_sum_ = 0, train_count_ = 0;
    } else if (run_.step % write_every == 0) {
      write_metrics();
    }
    if (o_.save_every > 0 && run_.step % o_.save_every == 0) {
      save();
      log(fmt::format("step {}/{}: saved {}", run_.step, o_.steps, o_.out));
    }
  }

  /// The final validation and checkpoint, and the closing lines: the run's wall time and its
  /// average throughput (the tokens this run trained on / that wall time).
  void finish() {
    const double val = validate_now();
    save();
    write_metrics();
    const double elapsed = progress_.elapsed_s();
    const double tokens = double(steps_run_) * double(o_.batch * o_.seq);
    log(fmt::format("done: step {} in {} ({:.0f} tokens in {:.2f} s, {:.0f} tokens/s on average); final val loss "
                    "{:.4f} ({:.3f} bits/char)",
                    run_.step, format_duration(elapsed), tokens, elapsed, tokens / elapsed, val, val / std::log(2.0)));
    log(fmt::format("saved {}; metrics {} and {}", o_.out, metrics_.csv_path(), metrics_.svg_path()));
    if (ranks_ > 1 && steps_run_ > 0)
      log(fmt::format("gradient exchange: {:.3f} ms per step, {:.1f}% of the step time (what backward did not hide, "
                      "and the parameter gather of --shard-optimizer)",
                      1e3 * exchange_seconds_ / double(steps_run_), 100.0 * exchange_seconds_ / step_seconds_));
    comm_.barrier();
  }

  const TrainOptions& o_;
  const std::int64_t decay_steps_;
  distributed::Communicator& comm_;
  Run& run_;
  MetricsLog& metrics_;
  const std::size_t ranks_;
  const bool leader_;
  const std::size_t parts_, rows_;  // parts of the global batch (ranks x micro-batches), rows in each
  const bool sharded_ = o_.shard_optimizer && ranks_ > 1;  // ZeRO-1: this rank keeps a shard of the AdamW state
  std::optional<distributed::GradientBuckets> buckets_;  // the sum of the parts' gradients, when there are several
  const optim::LrSchedule schedule_;
  const float clip_;
  Progress progress_;
  double wall_before_ = 0;             // the metrics' wall time when this run began (a resume's)
  int stop_ = 0;                       // the stop signal, agreed between ranks
  double train_sum_ = 0;               // training losses since the last validation
  std::int64_t train_count_ = 0;
  double exchange_seconds_ = 0, step_seconds_ = 0;  // this run's, for the closing lines
  std::int64_t steps_run_ = 0;
};

}  // namespace

TrainOutcome train(const TrainOptions& o, const std::atomic<int>& stop_signal, distributed::Communicator& comm) {
  check_options(o, std::size_t(comm.size()));
  set_num_threads(o.threads);
  const std::int64_t decay_steps = o.decay();
  const std::string stem = output_stem(o.out);
  MetricsLog metrics(o.metrics.empty() ? stem + ".metrics.csv" : o.metrics, stem + ".loss.svg",
                     fmt::format("train_char: {}", o.out));
  Setup setup;
  on_leader(comm, [&] { prepare_leader_run(o, decay_steps, metrics, setup); });
  if (comm.size() > 1) share_leader_run(o, decay_steps, comm, setup);
  setup.text = std::string();
  TrainingLoop loop(o, decay_steps, comm, *setup.run, metrics);
  loop.log_setup(setup);
  return loop.run(stop_signal);
}

}  // namespace tapegrad::examples
