// The server's metrics and their Prometheus text.
#include "serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace tapegrad::serve {

Histogram::Histogram(std::vector<double> upper_bounds) : bounds(std::move(upper_bounds)), counts(bounds.size()) {}

void Histogram::observe(double value) {
  for (std::size_t i = 0; i < bounds.size(); ++i)
    if (value <= bounds[i]) ++counts[i];
  sum += value;
  ++count;
}

namespace {

// 1, 2, 4, ... up to the first power of two >= sequences.
std::vector<double> powers_of_two(std::size_t sequences) {
  std::vector<double> bounds;
  for (std::size_t b = 1;; b *= 2) {
    bounds.push_back(double(b));
    if (b >= sequences) break;
  }
  return bounds;
}

void append_histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  for (std::size_t i = 0; i < h.bounds.size(); ++i)
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.bounds[i], h.counts[i]);
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, h.count, name, h.sum, name,
                     h.count);
}

void append_value(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

}  // namespace

Metrics::Metrics(std::size_t sequences)
    : sequences_per_step_(powers_of_two(sequences)),
      time_to_first_token_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}),
      time_per_token_({0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}) {}

void Metrics::request_done(int status) {
  std::lock_guard lock(mutex_);
  ++requests_[status];
}

void Metrics::tokens(std::size_t prompt, std::size_t completion) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += prompt;
  completion_tokens_ += completion;
}

void Metrics::request_cancelled() {
  std::lock_guard lock(mutex_);
  ++cancelled_;
}

void Metrics::set_queue(std::size_t running, std::size_t waiting) {
  std::lock_guard lock(mutex_);
  running_ = running, waiting_ = waiting;
}

void Metrics::step(std::size_t sequences) {
  std::lock_guard lock(mutex_);
  ++steps_;
  sequences_per_step_.observe(double(sequences));
}

void Metrics::first_token(double seconds) {
  std::lock_guard lock(mutex_);
  time_to_first_token_.observe(seconds);
}

void Metrics::token_interval(double seconds) {
  std::lock_guard lock(mutex_);
  time_per_token_.observe(seconds);
}

void Metrics::weights(const std::string& fingerprint, bool reloaded) {
  std::lock_guard lock(mutex_);
  reloads_ += reloaded;
  fingerprint_ = fingerprint;
}

void Metrics::reload_failed() {
  std::lock_guard lock(mutex_);
  ++reload_failures_;
}

std::uint64_t Metrics::requests_with_status(int status) const {
  std::lock_guard lock(mutex_);
  auto it = requests_.find(status);
  return it == requests_.end() ? 0 : it->second;
}

std::uint64_t Metrics::cancelled() const {
  std::lock_guard lock(mutex_);
  return cancelled_;
}

std::uint64_t Metrics::reload_failures() const {
  std::lock_guard lock(mutex_);
  return reload_failures_;
}

std::string Metrics::prometheus_text() const {
  std::lock_guard lock(mutex_);
  std::string out;
  out += "# HELP tapegrad_requests_total Completion requests answered, by HTTP status.\n"
         "# TYPE tapegrad_requests_total counter\n";
  for (const auto& [status, count] : requests_)
    out += fmt::format("tapegrad_requests_total{{status=\"{}\"}} {}\n", status, count);
  append_value(out, "tapegrad_requests_cancelled_total", "counter",
               "Requests whose client went away before they finished.", double(cancelled_));
  append_value(out, "tapegrad_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
               double(prompt_tokens_));
  append_value(out, "tapegrad_completion_tokens_total", "counter", "Tokens generated.", double(completion_tokens_));
  append_value(out, "tapegrad_requests_running", "gauge", "Requests decoding now.", double(running_));
  append_value(out, "tapegrad_requests_waiting", "gauge", "Requests waiting for a free sequence.", double(waiting_));
  append_value(out, "tapegrad_decode_steps_total", "counter", "Decoding passes (one token for each running sequence).",
               double(steps_));
  append_histogram(out, "tapegrad_sequences_per_step", "Sequences advanced by one decoding pass.",
                   sequences_per_step_);
  append_histogram(out, "tapegrad_time_to_first_token_seconds", "From a request's arrival to its first token.",
                   time_to_first_token_);
  append_histogram(out, "tapegrad_time_per_token_seconds", "Between two consecutive tokens of one sample.",
                   time_per_token_);
  append_value(out, "tapegrad_checkpoint_reloads_total", "counter", "Checkpoint files loaded after a change.",
               double(reloads_));
  append_value(out, "tapegrad_checkpoint_reload_failures_total", "counter",
               "Changed checkpoint files that failed to load (the previous weights kept serving).",
               double(reload_failures_));
  out += fmt::format(
      "# HELP tapegrad_weights_info The weights new requests use.\n# TYPE tapegrad_weights_info gauge\n"
      "tapegrad_weights_info{{system_fingerprint=\"{}\"}} 1\n",
      fingerprint_);
  return out;
}

}  // namespace tapegrad::serve
