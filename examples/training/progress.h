// Training progress: on a terminal, one live status line on stderr rewritten in place with \r;
// otherwise plain lines on stdout every few steps. Log lines (stdout) clear the live line first.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tapegrad::examples {

class Progress {
 public:
  /// live: rewrite one status line on stderr (a terminal); else print a plain line to stdout
  /// every `every` steps. tokens_per_step = batch * seq_len.
  Progress(bool live, std::int64_t every, std::int64_t start_step, std::int64_t total_steps, double tokens_per_step);
  /// Clears the live line, so that an error printed while unwinding starts on a clean line.
  ~Progress() { clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// After step `step` (completed steps) with its loss, lr and the seconds its compute took.
  void step(std::int64_t step, double loss, double lr, double step_seconds);
  /// A log line on stdout (the live line is cleared first and redrawn by the next step()).
  void log(const std::string& line);
  /// Clears the live line (before the program prints its last lines or an error).
  void clear();

  /// Training tokens per second over recent steps (an exponential moving average of the step
  /// time): what the live line shows as "recent".
  double recent_tokens_per_s() const { return ema_step_s_ > 0 ? tokens_per_step_ / ema_step_s_ : 0.0; }
  /// Seconds since construction.
  double elapsed_s() const;

 private:
  std::string status(std::int64_t step, double loss, double lr) const;

  bool live_;
  std::int64_t every_, start_step_, total_steps_;
  double tokens_per_step_;
  double ema_step_s_ = 0;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

/// "1:05" or "2:03:07".
std::string format_duration(double seconds);

}  // namespace tapegrad::examples
