// A run's set-up (a new model, one to start from with --init, or a resumed one; rank 0 reads, the
// other ranks receive), its checkpoints and its restore.
#include "training/training_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "cli/program.h"
#include "training/rank_agreement.h"
#include "io/safetensors.h"
#include "nn/architecture.h"
#include "nn/checkpoint.h"
#include "nn/checkpoint_metadata.h"
#include "nn/lora.h"
#include "nn/pretrained.h"
#include "tokenizers/tokenizer.h"

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
  for (NamedParameter& p : run.model.params()) {  // frozen ones too: run.params holds the trainable
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

/// A map of text to every rank, as rank 0 has it.
void broadcast_metadata(distributed::Communicator& comm, nn::Metadata& metadata) {
  std::uint64_t count = metadata.size();
  distributed::broadcast_values(comm, std::span(&count, 1));
  std::vector<std::pair<std::string, std::string>> entries(metadata.begin(), metadata.end());
  entries.resize(count);
  for (auto& [key, value] : entries) {
    distributed::broadcast_string(comm, key);
    distributed::broadcast_string(comm, value);
  }
  metadata = nn::Metadata(entries.begin(), entries.end());
}

/// --resume's model against the shape flags given (each must agree with the checkpoint).
void check_resume_flags(const TrainOptions& o, const nn::LoadedModelCheckpoint& ckpt) {
  const std::string arch = ckpt.model.arch();
  if (o.model.arch && *o.model.arch != arch)
    throw UsageError(fmt::format("--arch {} disagrees with --resume {}, whose model is {} (drop the flag)",
                                 *o.model.arch, o.resume, arch));
  auto meta_size = [&](const char* key) { return std::size_t(nn::metadata_count(ckpt.metadata, key)); };
  check_flag("d-model", o.model.d_model, meta_size("d_model"), o.resume);
  check_flag("heads", o.model.heads, meta_size("n_heads"), o.resume);
  check_flag("blocks", o.model.blocks, meta_size("n_blocks"), o.resume);
  check_flag("max-len", o.model.max_len, meta_size("max_len"), o.resume);
  check_flag("d-ff", o.model.d_ff, meta_size("d_ff"), o.resume);
  const float saved_dropout = nn::find_architecture(arch).shape(ckpt.model).dropout;
  if (o.model.dropout && *o.model.dropout != saved_dropout)
    throw UsageError(fmt::format("--dropout {} disagrees with --resume {}, whose model has dropout {} (drop the flag)",
                                 *o.model.dropout, o.resume, saved_dropout));
}

/// model rebuilt from its architecture's metadata with the run's --remat and --dropout, its
/// weights moved over (a published model is read without either).
nn::LanguageModel with_run_options(nn::LanguageModel model, bool remat, std::optional<float> dropout) {
  if (!remat && !dropout) return model;
  const nn::Architecture& arch = nn::find_architecture(model.arch());
  nn::Metadata metadata = arch.to_metadata(model);
  metadata.erase("dropout");
  if (dropout && *dropout > 0) metadata["dropout"] = fmt::format("{}", *dropout);
  nn::LanguageModel rebuilt = arch.from_metadata(metadata, remat);
  ParameterList from = model.params(), to = rebuilt.params();
  for (std::size_t i = 0; i < to.size(); ++i)
    to[i].var.mutable_value() = std::move(from[i].var.mutable_value());  // one copy of the weights at a time
  return rebuilt;
}

/// --lora's adapters on the model (nn/lora.h), A drawn from a stream of --seed; returns the log's note.
std::string add_lora_adapters(const TrainOptions& o, nn::LanguageModel& model) {
  constexpr std::uint64_t kLoraStream = 3;
  nn::LoraOptions lora{.rank = *o.lora, .alpha = o.lora_alpha, .targets = {}, .seed = stream_seed(o.seed, kLoraStream)};
  for (std::size_t begin = 0; begin <= o.lora_targets.size();) {
    const std::size_t end = std::min(o.lora_targets.find(',', begin), o.lora_targets.size());
    lora.targets.push_back(o.lora_targets.substr(begin, end - begin));
    begin = end + 1;
  }
  try {
    nn::add_lora(model, lora);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--lora {} --lora-targets {}: {}", *o.lora, o.lora_targets, e.what()));
  }
  std::size_t trained = 0;
  for (const NamedParameter& p : trainable(model.params())) trained += p.var.value().size();
  return fmt::format("LoRA: rank {}, alpha {} on {} of every block: {} trainable parameters of {} ({:.2f}%), the "
                     "rest frozen",
                     lora.rank, lora.alpha, o.lora_targets, trained, model.num_params(),
                     100.0 * double(trained) / double(model.num_params()));
}

/// A model to start from and its tokenizer.
struct InitModel {
  nn::LanguageModel model;
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;
  std::string description;  // for the log
  std::optional<std::string> chat_template;  // a published file's, or a checkpoint's
};

/// --init: a GGUF file or a Hugging Face folder (nn/pretrained.h), else a tapegrad checkpoint (its
/// model and tokenizer; a training checkpoint's optimizer state and step are not used). Errors
/// name --init and the path.
InitModel load_init(const TrainOptions& o) {
  std::error_code ec;
  if (!std::filesystem::exists(o.init, ec))
    throw std::runtime_error(fmt::format(
        "--init {}: no such file or folder (give a GGUF file, a Hugging Face folder or a checkpoint)", o.init));
  if (nn::is_pretrained_path(o.init)) {
    std::optional<nn::PretrainedModel> pretrained;
    try {
      pretrained.emplace(nn::load_pretrained(o.init, {.remat = o.remat}));
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("--init: {}", e.what()));  // e names the file
    }
    std::shared_ptr<const tokenizers::Tokenizer> tokenizer = std::move(pretrained->tokenizer);
    // Built with --remat by the load; only --dropout rebuilds it.
    nn::LanguageModel model = o.model.dropout ? with_run_options(std::move(pretrained->model), o.remat, o.model.dropout)
                                              : std::move(pretrained->model);
    std::string description = fmt::format("init: {} ({}, float32 weights; its {} tokenizer of {} tokens)", o.init,
                                          pretrained->format == "gguf" ? "a GGUF file" : "a Hugging Face folder",
                                          tokenizer->kind(), tokenizer->vocab_size());
    return {std::move(model), std::move(tokenizer), std::move(description), std::move(pretrained->chat_template)};
  }
  std::optional<nn::LoadedModelCheckpoint> ckpt;
  try {
    ckpt.emplace(nn::load_model_checkpoint(o.init));
  } catch (const std::exception& e) {
    throw std::runtime_error(
        fmt::format("--init: {} is not a GGUF file (no GGUF magic) and does not read as a checkpoint: {}", o.init,
                    e.what()));
  }
  nn::LanguageModel model = with_run_options(std::move(ckpt->model), o.remat, o.model.dropout);
  std::string description =
      fmt::format("init: {} (a checkpoint{}; its {} tokenizer of {} tokens; a new optimizer from step 0)", o.init,
                  ckpt->metadata.count("step") ? fmt::format(" of step {}", ckpt->metadata.at("step")) : "",
                  ckpt->tokenizer->kind(), ckpt->tokenizer->vocab_size());
  return {std::move(model), std::move(ckpt->tokenizer), std::move(description), ckpt->chat_template()};
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
  extras.metadata[corpus.unit() == "characters" ? "data_chars" : "data_tokens"] = str(corpus.ids.size());
  if (chat_template) extras.metadata[nn::kChatTemplateKey] = *chat_template;
  // Test seam: past the header (a few kilobytes), into the tensors.
  if (o.fail_save_at && *o.fail_save_at == step) detail::safetensors_fail_after_bytes = 4096;
  try {
    nn::save_model_checkpoint(o.out, model, *corpus.tokenizer, extras);
    // The adapters alone as PEFT writes them, beside the checkpoint (which holds the base too).
    if (nn::lora_of(model) && nn::has_peft_layout(model))
      nn::save_peft_adapter(output_stem(o.out) + ".lora", model, o.init.empty() ? o.resume : o.init);
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

void prepare_leader_run(const TrainOptions& o, std::int64_t decay_steps, const MetricsLog& metrics, Setup& setup) {
  const std::string text = read_file(o.data);
  std::optional<nn::LoadedModelCheckpoint> ckpt;
  std::optional<nn::LanguageModel> model;
  std::optional<Corpus> corpus;
  std::optional<std::string> chat_template;
  if (!o.resume.empty()) {
    ckpt.emplace(nn::load_model_checkpoint(o.resume, o.remat));
    check_resume_flags(o, *ckpt);
    corpus.emplace(ckpt->tokenizer->kind() == "char" ? corpus_of_characters(o.data, text)
                                                      : corpus_of_tokens(o.data, text, ckpt->tokenizer));
    if (auto* chars = dynamic_cast<const tokenizers::CharTokenizer*>(corpus->tokenizer.get());
        chars && chars->vocab() != ckpt->char_tokenizer().vocab())
      throw std::runtime_error(
          fmt::format("--resume {}: its vocabulary ({} characters) differs from that of {} ({} "
                      "characters); resume with the same --data",
                      o.resume, ckpt->char_tokenizer().size(), o.data, chars->size()));
    model.emplace(std::move(ckpt->model));
    chat_template = ckpt->chat_template();
    if (const auto saved = nn::lora_of(*model); o.lora && (!saved || saved->rank != *o.lora))
      throw UsageError(fmt::format("--lora {} disagrees with --resume {}, {} (drop the flag)", *o.lora, o.resume,
                                   saved ? fmt::format("whose adapters have rank {}", saved->rank)
                                         : std::string("which has no adapters")));
  } else if (!o.init.empty()) {
    InitModel init = load_init(o);
    corpus.emplace(corpus_of_tokens(o.data, text, std::move(init.tokenizer)));
    model.emplace(std::move(init.model));
    setup.notes.push_back(std::move(init.description));
    if (o.lora) setup.notes.push_back(add_lora_adapters(o, *model));
    chat_template = std::move(init.chat_template);
  } else {
    corpus.emplace(corpus_of_characters(o.data, text));
    model.emplace(new_model(o, corpus->tokenizer->vocab_size()));
  }
  const std::size_t max_len = model->config().max_len;
  if (o.seq > max_len)
    throw UsageError(fmt::format("--seq {} is longer than the model's max_len {}", o.seq, max_len));
  if (corpus->train().size() < o.seq + 1)
    throw std::runtime_error(
        fmt::format("{}: the training split (the first 90%) has {} {}; --seq {} needs at "
                    "least {} (use a longer text or a smaller --seq)",
                    o.data, corpus->train().size(), corpus->unit(), o.seq, o.seq + 1));
  if (corpus->validation().size() < 2)
    throw std::runtime_error(
        fmt::format("{}: the validation split (the last 10%) has {} {}; at least 2 are "
                    "needed (use a longer text)",
                    o.data, corpus->validation().size(), corpus->unit()));

  Run& run = setup.run.emplace(o, decay_steps, std::move(*corpus), std::move(*model));
  run.chat_template = std::move(chat_template);
  if (ckpt) {
    std::vector<std::string> notes = run.restore(*ckpt);
    setup.notes.insert(setup.notes.end(), notes.begin(), notes.end());
  }
  ckpt.reset();
  if (run.step > o.steps)
    throw UsageError(
        fmt::format("--steps {} is below the step {} that --resume {} reached", o.steps, run.step, o.resume));

  create_parent_directories(o.out);  // fail now rather than at the first save
  setup.lock.emplace(o.out);         // before any file is written
  for (const std::string& path : {o.out, metrics.csv_path(), metrics.svg_path()})
    for (std::string& file : remove_stale_temporaries(path)) setup.removed.push_back(std::move(file));
}

void share_leader_run(const TrainOptions& o, std::int64_t decay_steps, distributed::Communicator& comm, Setup& setup) {
  const bool leader = comm.rank() == 0;
  // The corpus: its tokenizer (as a checkpoint records it), its ids and its fingerprint.
  nn::Metadata tokenizer;
  std::vector<std::int32_t> ids;
  std::uint64_t fingerprint = 0;
  if (leader) {
    const Corpus& corpus = setup.run->corpus;
    tokenizer = corpus.tokenizer->to_metadata(), ids = corpus.ids, fingerprint = corpus.fingerprint;
  }
  broadcast_metadata(comm, tokenizer);
  std::uint64_t count = ids.size();
  distributed::broadcast_values(comm, std::span(&count, 1));
  ids.resize(count);
  distributed::broadcast_values(comm, std::span(ids));
  distributed::broadcast_values(comm, std::span(&fingerprint, 1));
  // The model. A new one is built from the same flags on every rank (its seed, the root of the
  // dropout streams, is --seed alike). One read from a file (--resume, --init) is rebuilt from its
  // architecture's metadata, the one config interchange, so that the other ranks need no copy of
  // the file: rank 0 reads and sends; its seed is 0 on every rank, as load_model_checkpoint and
  // load_pretrained leave it. The weights follow in broadcast_state.
  const bool from_file = !o.resume.empty() || !o.init.empty();
  std::string arch;
  nn::Metadata config;
  if (leader && from_file)
    arch = setup.run->model.arch(), config = nn::find_architecture(arch).to_metadata(setup.run->model);
  distributed::broadcast_string(comm, arch);
  broadcast_metadata(comm, config);
  nn::Metadata adapters;  // --lora's, added alike on every rank before the weights arrive
  if (leader) adapters = nn::lora_metadata(setup.run->model);
  broadcast_metadata(comm, adapters);
  if (!leader) {
    Corpus corpus = corpus_of_ids(o.data, tokenizers::tokenizer_from_metadata(tokenizer), std::move(ids), fingerprint);
    nn::LanguageModel model = from_file ? nn::find_architecture(arch).from_metadata(config, o.remat)
                                        : new_model(o, corpus.tokenizer->vocab_size());
    nn::add_lora_from_metadata(model, adapters);
    setup.run.emplace(o, decay_steps, std::move(corpus), std::move(model));
  }
  broadcast_state(comm, *setup.run);
}

}  // namespace tapegrad::examples
