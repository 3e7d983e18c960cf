// The progress line and log lines of train.
#include "training/progress.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>

namespace tapegrad::examples {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<long long>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

Progress::Progress(bool live, std::int64_t every, std::int64_t start_step, std::int64_t total_steps,
                   double tokens_per_step)
    : live_(live),
      every_(every),
      start_step_(start_step),
      total_steps_(total_steps),
      tokens_per_step_(tokens_per_step),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string Progress::status(std::int64_t step, double loss, double lr) const {
  // ETA from the wall time per step of this run so far (evaluations and saves included).
  const double done = double(step - start_step_), elapsed = elapsed_s();
  const double eta = done > 0 ? elapsed / done * double(total_steps_ - step) : NAN;
  const double rate = recent_tokens_per_s();
  const std::string tokens = rate >= 1e4 ? fmt::format("{:.1f}k", rate / 1e3) : fmt::format("{:.0f}", rate);
  return fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | {} tok/s recent | elapsed {} | ETA {}", step, total_steps_, loss,
                     lr, tokens, format_duration(elapsed), format_duration(eta));
}

void Progress::step(std::int64_t step, double loss, double lr, double step_seconds) {
  // An exponential moving average of the step time (the first step sets it).
  ema_step_s_ = ema_step_s_ > 0 ? 0.9 * ema_step_s_ + 0.1 * step_seconds : step_seconds;
  if (live_) {
    auto now = std::chrono::steady_clock::now();
    if (step != total_steps_ && now - last_draw_ < std::chrono::milliseconds(100)) return;  // ~10 redraws a second
    last_draw_ = now;
    fmt::print(stderr, "\r\033[K{}", status(step, loss, lr));
    std::fflush(stderr);
    drawn_ = true;
  } else if (step % every_ == 0 || step == total_steps_) {
    log(status(step, loss, lr));
  }
}

void Progress::clear() {
  if (!drawn_) return;
  fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

void Progress::log(const std::string& line) {
  clear();
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

}  // namespace tapegrad::examples
