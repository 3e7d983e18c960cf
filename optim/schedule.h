// Learning-rate schedules: constant, or linear warmup then cosine decay (Loshchilov & Hutter 2017,
// SGDR without restarts), with nanoGPT's conventions so runs compare with its logs.
#pragma once

#include <cstdint>

namespace tapegrad::optim {

/// A plain value: at(step) is the lr of step `step` (0-based, the step about to be taken).
/// Warmup-cosine, with lr the peak, W = warmup_steps, D = decay_steps (absolute, counting warmup):
///   step < W:       lr * (step + 1) / (W + 1)   (never 0, so the first step is not wasted; it
///                                               reaches lr * W / (W + 1) and then lr at step W)
///   W <= step < D:  min_lr + (lr - min_lr) * (1 + cos(pi * (step - W) / (D - W))) / 2
///   step >= D:      min_lr
/// computed in double and rounded to float once.
class LrSchedule {
 public:
  /// lr at every step.
  static LrSchedule constant(float lr);
  /// Linear warmup over warmup_steps to lr, cosine decay to min_lr at decay_steps, then min_lr.
  /// Requires lr, min_lr finite and >= 0, 0 <= warmup_steps <= decay_steps.
  static LrSchedule warmup_cosine(float lr, std::int64_t warmup_steps, std::int64_t decay_steps, float min_lr);

  /// The lr of step `step` (>= 0; see the class comment).
  float at(std::int64_t step) const;

  /// The peak lr (a constant schedule's lr; its min_lr is the same and it has no steps).
  float peak_lr() const { return lr_; }
  float min_lr() const { return min_lr_; }                     ///< The lr after the decay.
  std::int64_t warmup_steps() const { return warmup_steps_; }  ///< Steps of linear warmup.
  std::int64_t decay_steps() const { return decay_steps_; }    ///< The step where the decay ends.
  bool is_constant() const { return constant_; }               ///< Made by constant().

 private:
  LrSchedule(bool constant, float lr, std::int64_t warmup_steps, std::int64_t decay_steps, float min_lr)
      : constant_(constant), lr_(lr), min_lr_(min_lr), warmup_steps_(warmup_steps), decay_steps_(decay_steps) {}

  bool constant_;
  float lr_;
  float min_lr_;
  std::int64_t warmup_steps_;
  std::int64_t decay_steps_;
};

}  // namespace tapegrad::optim
