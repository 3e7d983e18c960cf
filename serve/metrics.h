// The server's counters, gauges and histograms, and their Prometheus text format
// (https://prometheus.io/docs/instrumenting/exposition_formats/). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tapegrad::serve {

/// A Prometheus histogram: counts of observations at or below each upper bound, their sum and count.
struct Histogram {
  std::vector<double> bounds;         ///< the buckets' upper bounds, increasing (+Inf is implied)
  std::vector<std::uint64_t> counts;  ///< per bound: the observations <= it (cumulative)
  double sum = 0;                     ///< the sum of the observations
  std::uint64_t count = 0;            ///< the number of observations
  explicit Histogram(std::vector<double> upper_bounds);  ///< Empty buckets with these upper bounds.
  void observe(double value);  ///< Counts one observation.
};

/// What /metrics reports.
class Metrics {
 public:
  /// sequences: the most sequences a step can hold (the buckets of sequences per step).
  explicit Metrics(std::size_t sequences);

  void request_done(int status);             ///< A request was answered with this HTTP status.
  void tokens(std::size_t prompt, std::size_t completion);  ///< Tokens of a finished request.
  void request_cancelled();                  ///< A client went away before its request finished.
  void set_queue(std::size_t running, std::size_t waiting);  ///< Requests decoding and waiting now.
  void step(std::size_t sequences);          ///< One decoding pass over this many sequences.
  void first_token(double seconds);          ///< A request's time from arrival to its first token.
  void token_interval(double seconds);       ///< Time between two tokens of one sample.
  /// The weights new requests get; reloaded: loaded after the checkpoint file changed.
  void weights(const std::string& fingerprint, bool reloaded = false);
  void reload_failed();  ///< A changed checkpoint file failed to load.

  /// @{ What the tests read.
  std::uint64_t requests_with_status(int status) const;
  std::uint64_t cancelled() const;
  std::uint64_t reload_failures() const;
  /// @}
  /// Everything in Prometheus text format (version 0.0.4).
  std::string prometheus_text() const;

 private:
  mutable std::mutex mutex_;
  std::map<int, std::uint64_t> requests_;
  std::uint64_t prompt_tokens_ = 0, completion_tokens_ = 0, cancelled_ = 0, steps_ = 0;
  std::uint64_t reloads_ = 0, reload_failures_ = 0;
  std::size_t running_ = 0, waiting_ = 0;
  std::string fingerprint_;
  Histogram sequences_per_step_, time_to_first_token_, time_per_token_;
};

}  // namespace tapegrad::serve
