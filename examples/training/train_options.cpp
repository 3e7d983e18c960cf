// The trainer's options: their validation (one UsageError naming the flag), the hyperparameters a
// resume compares, and the output files' stem.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "cli/program.h"
#include "training/rank_agreement.h"
#include "training/training_run.h"
#include "nn/architecture.h"
#include "nn/export.h"

namespace tapegrad::examples {

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
          {"beta2", str(o.beta2)},
          {"precision", std::string(precision_name(o.precision))}};
}

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
  // --steps 0 with --init converts a model (to the --export-* formats) without training it.
  require(steps >= 1 || (steps == 0 && !init.empty()),
          fmt::format("--steps must be at least 1 (0 only with --init, to convert a model), got {}", steps));
  try {
    nn::parse_gguf_export_type(export_type);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--export-type: {}", e.what()));
  }
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
  require(!lora || *lora >= 1, "--lora must be at least 1 (the adapters' rank)");
  require(!lora || !init.empty() || !resume.empty(), "--lora adapts a model: give --init (or --resume a LoRA run)");
  require(std::isfinite(lora_alpha) && lora_alpha > 0,
          fmt::format("--lora-alpha must be a positive number, got {}", lora_alpha));
  require(!merge || lora || !resume.empty(), "--merge folds LoRA adapters into the weights: give --lora");
  require(init.empty() || resume.empty(),
          "give --init or --resume, not both: --init starts a run from a model, --resume continues a run from its "
          "checkpoint (which holds the model)");
  require(init.empty() || !model.arch,
          fmt::format("--arch cannot be given with --init: the architecture comes from {}", init));
  for (const auto& [flag, value] : {std::pair{"d-model", model.d_model},
                                    {"heads", model.heads},
                                    {"blocks", model.blocks},
                                    {"max-len", model.max_len},
                                    {"d-ff", model.d_ff}}) {
    require(!value || *value >= 1, fmt::format("--{} must be at least 1, got {}", flag, value.value_or(0)));
    require(!value || init.empty(),
            fmt::format("--{} cannot be given with --init: the model's shape comes from {}", flag, init));
  }
}

std::string output_stem(const std::string& out) {
  constexpr std::string_view ext = ".safetensors";
  if (out.size() > ext.size() && out.compare(out.size() - ext.size(), ext.size(), ext) == 0)
    return out.substr(0, out.size() - ext.size());
  return out;
}

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

}  // namespace tapegrad::examples
