// train (also built as train_char, its name from before): trains a model of a registered architecture
// on a text file. Flags become a TrainOptions; the run itself lives in examples/training/trainer.
#include <fmt/ranges.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/program.h"
#include "training/trainer.h"
#include "distributed/communicator.h"
#include "nn/architecture.h"

using namespace tapegrad::examples;

int main(int argc, char** argv) {
  CLI::App app{
      "Trains a transformer language model on a UTF-8 text file: a new one on the text's characters, or a "
      "published model or checkpoint (--init) on its own tokenizer's ids.\n"
      "Progress goes to stdout (a live line on stderr when it is a terminal); Ctrl-C saves a checkpoint "
      "and exits with status 130; --resume continues bit-identically.",
      std::filesystem::path(argc > 0 ? argv[0] : "train").filename().string()};  // train or train_char
  TrainOptions o;
  std::size_t d_model = 64, heads = 4, blocks = 2, max_len = 256, d_ff = 0;
  std::int64_t decay_steps = 0, warmup = 100;
  std::size_t lora_rank = 8;
  std::string arch = "rotary";
  float dropout = 0;
  app.add_option("--data", o.data, "Training text, UTF-8 (default: the DATA environment variable)")->envname("DATA");
  app.add_option("--out", o.out, "Checkpoint written atomically (periodically, at the end, on Ctrl-C)")
      ->capture_default_str();
  app.add_option("--arch", arch,
                 fmt::format("Architecture, one of: {} (docs/architecture.md); a resume takes the checkpoint's",
                             fmt::join(tapegrad::nn::architecture_names(), ", ")))
      ->capture_default_str();
  app.add_option("--dropout", dropout, "Dropout probability in training (embeddings, attention, residual branches)")
      ->check(CLI::Range(0.0f, 0.99f))
      ->capture_default_str();
  app.add_option("--d-model", d_model, "Model width")->check(non_negative())->capture_default_str();
  app.add_option("--heads", heads, "Attention heads")->check(non_negative())->capture_default_str();
  app.add_option("--blocks", blocks, "Decoder blocks")->check(non_negative())->capture_default_str();
  app.add_option("--max-len", max_len, "Longest context the model accepts")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--d-ff", d_ff, "SwiGLU hidden width (default: 4 * d-model)")->check(non_negative());
  app.add_option("--seq", o.seq, "Tokens per training window")->check(non_negative())->capture_default_str();
  app.add_option("--batch", o.batch, "Windows per step (over all ranks under mpirun; divisible by their number)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--micro-batches", o.micro_batches,
                 "Split each rank's windows into M equal parts whose gradients are summed in order (the "
                 "arithmetic of M ranks)")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Optimizer steps in total (a resumed run continues to this step)")
      ->capture_default_str();
  app.add_option("--decay-steps", decay_steps, "Step at which the cosine decay reaches --min-lr (default: --steps)");
  app.add_option("--lr", o.lr, "Peak learning rate")->capture_default_str();
  app.add_option("--warmup", warmup, "Linear warmup steps (default: 100, capped at a tenth of the decay steps)");
  app.add_option("--min-lr", o.min_lr, "Learning rate at the end of the decay")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay, on matrices only")
      ->capture_default_str();
  app.add_option("--clip", o.clip, "Clip the global gradient norm to this (0: no clipping)")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the initialisation, the batches and the validation windows")
      ->check(non_negative())
      ->capture_default_str();
  app.add_flag("--remat", o.remat, "Recompute each block in backward (less memory, same result)");
  std::string precision = "f32";
  app.add_option("--precision", precision,
                 "Matrix products: f32, or bf16 (inputs rounded to bfloat16, float32 accumulation; weights and "
                 "AdamW state stay float32)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_flag("--shard-optimizer", o.shard_optimizer,
               "Under mpirun: each rank keeps and updates 1/N of the AdamW state (ZeRO-1; same result)");
  app.add_option("--threads", o.threads, "Threads (0: OMP_NUM_THREADS, else all cores)")->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "Validation loss every N steps (0: only at the end)")
      ->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "Batches of validation windows per evaluation")
      ->check(non_negative())
      ->capture_default_str();
  app.add_option("--save-every", o.save_every, "Checkpoint every N steps (0: only at the end)")->capture_default_str();
  app.add_option("--resume", o.resume, "Continue from a training checkpoint (its model shape, these training flags)");
  app.add_option("--init", o.init,
                 "Start from a model: a GGUF file (dequantized to float32), a Hugging Face folder or a checkpoint; "
                 "--data is encoded by its tokenizer, the shape flags do not apply");
  app.add_option("--lora", lora_rank,
                 "Train LoRA adapters of this rank on --init's projections, the model frozen; the checkpoint holds "
                 "both, <out>.lora/ the adapters in PEFT's files (docs/fine-tuning.md)");
  app.add_option("--lora-alpha", o.lora_alpha, "LoRA's alpha: the adapters' output is scaled by alpha / rank")
      ->capture_default_str();
  app.add_option("--lora-targets", o.lora_targets, "The projections LoRA adapts, of q,k,v,o,gate,up,down")
      ->capture_default_str();
  app.add_flag("--merge", o.merge, "When the run finishes, fold the LoRA adapters into the weights that are exported");
  app.add_option("--export-hf", o.export_hf,
                 "When the run finishes: the model as a Hugging Face folder (model.safetensors, config.json, "
                 "tokenizer files); a Llama or a GPT-2");
  app.add_option("--export-gguf", o.export_gguf,
                 "When the run finishes: the model as a GGUF file with its tokenizer and chat "
                 "template; a Llama or a GPT-2. With --init and --steps 0, train converts a model");
  app.add_option("--export-type", o.export_type, "--export-gguf's matrices: f32, bf16 or q8_0 (vectors stay f32)")
      ->capture_default_str();
  app.add_option("--metrics", o.metrics,
                 "Metrics CSV (default: beside --out, <out>.metrics.csv; the loss curve "
                 "goes to <out>.loss.svg)");

  std::unique_ptr<tapegrad::distributed::Communicator> comm;  // MPI is finalized when it goes
  bool failed_alone = false;
  const int status = run_program(app, argc, argv, [&] {
    o.precision = tapegrad::parse_precision(precision);
    auto given = [&](const char* flag, std::size_t value) {
      return app.count(flag) ? std::optional(value) : std::nullopt;
    };
    o.model = {given("--d-model", d_model), given("--heads", heads), given("--blocks", blocks),
               given("--max-len", max_len), given("--d-ff", d_ff),
               app.count("--arch") ? std::optional(arch) : std::nullopt,
               app.count("--dropout") ? std::optional(dropout) : std::nullopt};
    if (app.count("--decay-steps")) o.decay_steps = decay_steps;
    if (app.count("--warmup")) o.warmup = warmup;
    if (app.count("--lora")) o.lora = lora_rank;
    // Test seams (docs/testing.md), set only by tests/examples: a NaN in the model or in a batch before
    // step N, and a save after step N that fails like a full disk.
    auto seam = [](const char* name) {
      const char* step = std::getenv(name);
      return step ? std::optional<std::int64_t>(std::atoll(step)) : std::nullopt;
    };
    o.inject_nan_at = seam("TAPEGRAD_TEST_INJECT_NAN_AT_STEP");
    o.inject_nan_batch_at = seam("TAPEGRAD_TEST_INJECT_NAN_BATCH_AT_STEP");
    o.fail_save_at = seam("TAPEGRAD_TEST_FAIL_SAVE_AT_STEP");
    o.perturb_last_rank_at = seam("TAPEGRAD_TEST_PERTURB_LAST_RANK_AT_STEP");  // under mpirun
    // Under mpirun or srun, one rank of a data-parallel run; else a single process.
    comm = tapegrad::distributed::make_communicator(argc, argv);
    const auto& stop_signal = install_stop_handlers();
    try {
      return train(o, stop_signal, *comm) == TrainOutcome::interrupted ? 128 + interrupting_signal() : 0;
    } catch (const UsageError&) {
      if (comm->rank() != 0 && failure_is_agreed()) return 2;  // rank 0 prints it
      failed_alone = !failure_is_agreed();
      throw;
    } catch (const std::exception&) {
      if (comm->rank() != 0 && failure_is_agreed()) return 1;
      failed_alone = !failure_is_agreed();
      throw;
    }
  });
  // An error on this rank alone: the others would wait for it in their next collective.
  if (failed_alone && comm->size() > 1) comm->abort(status);
  return status;
}
