// The training loop (steps, validation, metrics, saves, the stop on a signal) and train() itself.
#include "training/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <limits>

#include "training/batches.h"
#include "training/metrics.h"
#include "training/model_export.h"
#include "training/progress.h"
#include "training/rank_agreement.h"
#include "training/training_run.h"
#include "core/kernels.h"
#include "core/ops.h"
#include "distributed/data_parallel.h"
#include "nn/lora.h"
#include "optim/clip.h"
#include "optim/schedule.h"

namespace tapegrad::examples {

namespace {

[[noreturn]] void diverged(const char* what, double value, const Run& run, MetricsLog& metrics, bool leader) {
  mark_failure_agreed();  // the loss and the gradient norm are the same on every rank
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

}  // namespace

const std::atomic<int>& install_stop_handlers() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);  // mpirun forwards SIGUSR1 to every rank: a way to stop a run
  return g_stop_signal;
}

int interrupting_signal() { return g_interrupting_signal; }

TrainOutcome train(const TrainOptions& o, const std::atomic<int>& stop_signal) {
  distributed::SingleProcess one;
  return train(o, stop_signal, one);
}

namespace {

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
    log(fmt::format("data: {}: {} {}, vocabulary of {}; train {} (first 90%), validation {}", o_.data,
                    data.ids.size(), data.unit(), data.tokenizer->vocab_size(), data.train().size(),
                    data.validation().size()));
    log(fmt::format("model: {}", run_.model.describe()));
    log(fmt::format("parameters: {}", run_.model.num_params()));
    log(fmt::format("training: {} steps of {} x {} tokens; AdamW lr {} (warmup {}, cosine to {} at step {}), "
                    "betas {}/{}, weight decay {}, clip {}; {} threads",
                    o_.steps, o_.batch, o_.seq, o_.lr, o_.warmup_steps(), o_.min_lr, decay_steps_, o_.beta1,
                    o_.beta2, o_.weight_decay, o_.clip > 0 ? str(o_.clip) : std::string("off"), num_threads()));
    if (o_.precision == Precision::bf16)
      log("precision: bf16 matrix products (inputs rounded to bfloat16, float32 accumulation); weights, gradients "
          "and AdamW state float32");
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
    if (o_.resume.empty() && o_.init.empty() && o_.seq < max_len)
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
    if (o_.steps == 0) {
      log("--steps 0: no training (the --init model goes to the --export-* files as it is)");
      return TrainOutcome::finished;
    }
    if (run_.step == o_.steps) {
      log(fmt::format("nothing to do: the checkpoint is already at step {} of --steps {}", run_.step, o_.steps));
      return TrainOutcome::finished;
    }
    wall_before_ = metrics_.last_wall_s();
    // Every product of the run, validation's included; opened here, it also covers remat's re-run
    // forwards in backward (core/precision.h).
    PrecisionScope precision(o_.precision);
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
  /// The loss in bits, per what an id stands for.
  std::string bits_per_id() const { return run_.corpus.unit() == "characters" ? "bits/char" : "bits/token"; }
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
    log(fmt::format("step {}/{}: {}val loss {:.4f} ({:.3f} {})", run_.step, o_.steps, train_part, val,
                    val / std::log(2.0), bits_per_id()));
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
      // The model's loss(): its head fused with the cross-entropy (Note [Loss pass]), so that the
      // (rows x T, vocab) logits and their gradient are never held whole (400 MB at SmolLM2's
      // vocabulary and B 4 x T 256). The logits whole only where the test seam poisons them.
      Var part_loss;
      if (o_.inject_nan_batch_at && *o_.inject_nan_batch_at == run_.step + 1 && part == 0) {
        Var logits = run_.model.forward(inputs, rows_, o_.seq);  // (rows, T, vocab)
        Tensor poison(logits.shape());  // zeros but the first logit of the batch
        poison[0] = std::numeric_limits<float>::quiet_NaN();
        part_loss = cross_entropy(add(logits, Var(std::move(poison))), targets);
      } else {
        part_loss = run_.model.loss(inputs, targets, rows_, o_.seq);
      }
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
    // Clipping folded into AdamW's pass; a non-finite norm takes no step.
    const float norm = optim::clip_grad_norm_and_step(run_.optimizer, clip_);
    if (!std::isfinite(norm)) diverged("gradient norm", norm, run_, metrics_, leader_);
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
    if (o_.merge) nn::merge_lora(run_.model);  // the checkpoint keeps the adapters apart; an export gets them folded in
    write_metrics();
    const double elapsed = progress_.elapsed_s();
    const double tokens = double(steps_run_) * double(o_.batch * o_.seq);
    log(fmt::format("done: step {} in {} ({:.0f} tokens in {:.2f} s, {:.0f} tokens/s on average); final val loss "
                    "{:.4f} ({:.3f} {})",
                    run_.step, format_duration(elapsed), tokens, elapsed, tokens / elapsed, val, val / std::log(2.0),
                    bits_per_id()));
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
                     fmt::format("train: {}", o.out));
  Setup setup;
  on_leader(comm, [&] {
    prepare_leader_run(o, decay_steps, metrics, setup);
    check_final_model_exportable(o, *setup.run);
  });
  if (comm.size() > 1) share_leader_run(o, decay_steps, comm, setup);
  TrainingLoop loop(o, decay_steps, comm, *setup.run, metrics);
  loop.log_setup(setup);
  const TrainOutcome outcome = loop.run(stop_signal);
  if (outcome == TrainOutcome::finished) on_leader(comm, [&] { export_final_model(o, *setup.run); });
  return outcome;
}

}  // namespace tapegrad::examples
