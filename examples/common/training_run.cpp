// A run's set-up (a new model or a resumed one; rank 0 reads, the other ranks receive), its
// checkpoints and its restore.
#include "common/training_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>

#include "common/program.h"
#include "common/rank_agreement.h"
#include "io/safetensors.h"
#include "nn/architecture.h"
#include "nn/checkpoint.h"
#include "nn/checkpoint_metadata.h"

namespace tapegrad::examples {

namespace {

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

/// What the other ranks need to build rank 0's model besides its arch: d_model, heads, blocks,
/// max_len, d_ff, the dropout's bits and the seed (the root of the dropout streams).
constexpr int kShapeFields = 7;
std::array<std::uint64_t, kShapeFields> shape_fields(const nn::LanguageModel& model) {
  const nn::ModelShape s = nn::find_architecture(model.arch()).shape(model);
  return {s.d_model, s.n_heads, s.n_blocks, s.max_len, s.d_ff.value_or(0), std::bit_cast<std::uint32_t>(s.dropout),
          s.seed};
}

}  // namespace

std::string Run::kept() const {
  if (saved_step >= 0) return fmt::format("the checkpoint of step {}, {}, is kept", saved_step, o.out);
  if (!o.resume.empty()) return fmt::format("the checkpoint it resumed from, {}, is kept", o.resume);
  return "no checkpoint was written";
}

void Run::save(const optim::OptimizerState& state) {
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

std::vector<std::string> Run::restore(const nn::LoadedModelCheckpoint& ckpt) {
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

}  // namespace tapegrad::examples
