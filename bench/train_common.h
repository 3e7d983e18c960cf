// Shared by bench_train and bench_remat: the benchmark configurations (a)-(d), their
// FLOP counts, and one full training step (forward, backward, clip, AdamW, zero_grad) on a fixed
// batch of seeded random token ids.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/tape.h"
#include "nn/architecture.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace tapegrad::bench {

struct TrainConfig {
  std::string name;  // "a", "b", "c", "d", "a-gpt2"
  std::size_t vocab = 65, d_model = 0, n_heads = 0, n_blocks = 0, seq_len = 0, batch = 0;
  std::string arch = "rotary";  // a registered architecture (nn/architecture.h)
  std::size_t d_ff() const { return 4 * d_model; }
  std::size_t head_dim() const { return d_model / n_heads; }
  std::size_t tokens() const { return batch * seq_len; }
};

/// The benchmark configurations: (a) d64 h4 L2 seq128 batch16, (b) d128 h4 L4 seq64 batch12,
/// (c) d256 h8 L4 seq256 batch8, and the long context (d) d256 h8 L4 seq1024 batch2; vocab 65,
/// max_len = seq, d_ff = 4 d_model. "a-gpt2" is gpt2 at (a)'s size.
inline TrainConfig train_config(const std::string& name) {
  if (name == "a") return {"a", 65, 64, 4, 2, 128, 16};
  if (name == "b") return {"b", 65, 128, 4, 4, 64, 12};
  if (name == "c") return {"c", 65, 256, 8, 4, 256, 8};
  if (name == "d") return {"d", 65, 256, 8, 4, 1024, 2};
  if (name == "a-gpt2") return {"a-gpt2", 65, 64, 4, 2, 128, 16, "gpt2"};
  throw std::invalid_argument("unknown config '" + name + "' (expected a, b, c, d or a-gpt2)");
}

/// Parameters that take part in a matmul: per block Wq, Wk, Wv, Wo (d x d) and W1, W3, W2
/// (d x d_ff; gpt2 has no W3), plus the head (d x vocab; gpt2's is the tied embedding). The
/// embedding lookup is a gather, not a matmul.
inline double matmul_params(const TrainConfig& c) {
  double d = double(c.d_model), ff = double(c.d_ff()), ffn_matrices = c.arch == "gpt2" ? 2 : 3;
  return double(c.n_blocks) * (4 * d * d + ffn_matrices * d * ff) + d * double(c.vocab);
}

/// Attention FLOPs of one step: 3 (forward + backward) x 2 matmuls (q k^T and P v) x 2 (multiply
/// and add) x B x H x T x T x Dh x n_blocks / 2 (the causal half).
inline double attention_flops(const TrainConfig& c) {
  return 3.0 * 2.0 * 2.0 * double(c.batch) * double(c.n_heads) * double(c.seq_len) * double(c.seq_len) *
         double(c.head_dim()) * double(c.n_blocks) / 2.0;
}

/// Model FLOPs of one step: 6 x matmul params x tokens + attention FLOPs.
inline double step_flops(const TrainConfig& c) {
  return 6.0 * matmul_params(c) * double(c.tokens()) + attention_flops(c);
}

inline constexpr std::array<const char*, 5> kPhaseNames = {"forward", "backward", "clip", "adamw", "zero_grad"};

inline const char* kFlopsFormula =
    "6 x matmul_params x B x T + 3 x 2 x 2 x B x H x T x T x Dh x n_blocks / 2; matmul_params = n_blocks x "
    "(4 d^2 + 3 d d_ff) + d x vocab";

/// The optimizer of every benchmark (and of torch_reference.py).
inline optim::AdamWOptions bench_adamw_options() {
  return {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
}
inline constexpr float kClipNorm = 1.0f;

/// Inputs and targets (B*T each): independent uniform ids from Rng(seed).
struct Batch {
  std::vector<std::int32_t> inputs, targets;
};
inline Batch random_batch(const TrainConfig& c, std::uint64_t seed = 1234) {
  Rng rng(seed);
  Batch b;
  for (std::size_t i = 0; i < c.tokens(); ++i) b.inputs.push_back(std::int32_t(rng.below(c.vocab)));
  for (std::size_t i = 0; i < c.tokens(); ++i) b.targets.push_back(std::int32_t(rng.below(c.vocab)));
  return b;
}

/// The config's model, seed 0, built by its registered architecture.
inline nn::LanguageModel make_model(const TrainConfig& c, bool remat) {
  return nn::find_architecture(c.arch).make({.vocab = c.vocab,
                                             .d_model = c.d_model,
                                             .n_heads = c.n_heads,
                                             .n_blocks = c.n_blocks,
                                             .max_len = c.seq_len,
                                             .d_ff = c.d_ff(),
                                             .remat = remat});
}

/// A model (seed 0 initialisation), its AdamW and a fixed batch; step() is one training step.
struct Trainer {
  TrainConfig config;
  nn::LanguageModel model;
  ParameterList params;
  optim::AdamW optimizer;
  Batch batch;
  float last_grad_norm = 0;
  std::size_t last_tape_bytes = 0;
  /// Milliseconds of the last step's phases: forward (loss), backward, clip, AdamW step, zero_grad.
  std::array<double, 5> last_phase_ms{};

  explicit Trainer(const TrainConfig& c, bool remat = false)
      : config(c),
        model(make_model(c, remat)),
        params(model.params()),
        optimizer(params, bench_adamw_options()),
        batch(random_batch(c)) {}

  /// The loss of the current weights on the batch, with no tape.
  float loss() const {
    NoGradScope no_grad;
    return model.loss(batch.inputs, batch.targets, config.batch, config.seq_len).value().item();
  }

  /// Forward, backward, clip_grad_norm(1.0), AdamW step, zero_grad. Returns the loss before the step.
  float step() {
    using Clock = std::chrono::steady_clock;
    auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    float loss_value;
    Clock::time_point t0 = Clock::now(), t1, t2;
    {
      Tape tape;
      Var loss = model.loss(batch.inputs, batch.targets, config.batch, config.seq_len);
      loss_value = loss.value().item();
      last_tape_bytes = tape.bytes();
      t1 = Clock::now();
      tape.backward(loss);
    }
    t2 = Clock::now();
    last_grad_norm = optim::clip_grad_norm(params, kClipNorm);
    Clock::time_point t3 = Clock::now();
    optimizer.step();
    Clock::time_point t4 = Clock::now();
    optimizer.zero_grad();
    Clock::time_point t5 = Clock::now();
    last_phase_ms = {ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t3, t4), ms(t4, t5)};
    return loss_value;
  }
};

}  // namespace tapegrad::bench
