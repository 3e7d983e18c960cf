// Learning-rate schedules: argument checks and the warmup-cosine formula.
#include "optim/schedule.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <stdexcept>

namespace tapegrad::optim {

namespace {
void check_lr(const char* what, float value) {
  if (!(std::isfinite(value) && value >= 0.0f))
    throw std::invalid_argument(fmt::format("LrSchedule: {} must be finite and >= 0, got {}", what, value));
}
}  // namespace

LrSchedule LrSchedule::constant(float lr) {
  check_lr("lr", lr);
  return LrSchedule(true, lr, 0, 0, lr);
}

LrSchedule LrSchedule::warmup_cosine(float lr, std::int64_t warmup_steps, std::int64_t decay_steps, float min_lr) {
  check_lr("lr", lr);
  check_lr("min_lr", min_lr);
  if (warmup_steps < 0 || decay_steps < warmup_steps)
    throw std::invalid_argument(fmt::format("LrSchedule: need 0 <= warmup_steps <= decay_steps, got warmup_steps {} "
                                            "and decay_steps {}",
                                            warmup_steps, decay_steps));
  return LrSchedule(false, lr, warmup_steps, decay_steps, min_lr);
}

float LrSchedule::at(std::int64_t step) const {
  if (step < 0) throw std::invalid_argument(fmt::format("LrSchedule::at: step must be >= 0, got {}", step));
  if (constant_) return lr_;
  const double lr = lr_, min_lr = min_lr_;
  if (step < warmup_steps_) return float(lr * double(step + 1) / double(warmup_steps_ + 1));
  if (step >= decay_steps_) return min_lr_;
  const double ratio = double(step - warmup_steps_) / double(decay_steps_ - warmup_steps_);
  return float(min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)));
}

}  // namespace tapegrad::optim
