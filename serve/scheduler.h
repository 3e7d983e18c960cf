// The decoding loop of the server: one thread owns the model and a cache of S sequences, admits
// waiting requests into free sequences at step boundaries, prefills long prompts in chunks while
// the running sequences keep stepping, frees a sequence as soon as its sample finishes or its
// client goes away, and picks up a replaced checkpoint file between steps (continuous batching,
// as in Orca, Yu et al. 2022, and vLLM).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "nn/language_model.h"
#include "serve/metrics.h"
#include "serve/request.h"
#include "serve/weights.h"

namespace tapegrad::serve {

/// One request's progress: written by the decoding loop, read by the HTTP handler that waits
/// for it. The fields below `mutex` are guarded by it.
struct Job {
  /// One sample's text so far (whole UTF-8 characters only) and how it ended.
  struct Choice {
    std::string text;                  ///< the prompt first if echo, then the released characters
    std::size_t tokens = 0;            ///< tokens generated
    /// "stop" (a stop string or an end id) or "length" once finished
    std::optional<std::string> finish_reason;
  };
  /// A job of request.n choices, arriving now.
  Job(CompletionRequest request, std::vector<std::int32_t> prompt_ids, std::uint64_t seed);

  const CompletionRequest request;  ///< as parsed
  /// The prompt's ids, encoded again at admission by the weights that decode it (read them once done).
  std::vector<std::int32_t> prompt_ids;
  const std::uint64_t seed;                    ///< sample i draws with seed + i
  const std::chrono::steady_clock::time_point arrival;  ///< when it was submitted (time to first token)
  std::atomic<bool> cancelled{false};          ///< set when its client has gone (HangupWatch, or its stream)

  std::mutex mutex;                   ///< guards the fields below
  std::condition_variable changed;    ///< notified when done and (streams) at every token
  std::condition_variable ended;      ///< notified once, when done is set
  std::vector<Choice> choices;         ///< request.n of them
  std::string fingerprint;             ///< the weights it decodes with, once admitted
  bool done = false;                   ///< every choice finished, or error set, or cancelled
  std::optional<ApiError> error;       ///< why it could not finish
};

/// How the decoding loop runs.
struct SchedulerOptions {
  std::size_t parallel = 8;        ///< S: the sequences decoded together
  std::size_t queue = 64;          ///< the requests that may wait for free sequences
  std::size_t max_tokens = 0;      ///< the cap on a request's max_tokens (0: the context)
  /// The tokens a sequence's cache holds, prompt and reply (0: the model's max_len up to
  /// kDefaultContext); more than the model's max_len fails the load.
  std::size_t ctx = 0;
  std::size_t prefill_chunk = 64;  ///< prompt tokens a sequence prefills per step
  nn::KVCacheType cache_type = nn::KVCacheType::f32;  ///< what the cache holds each key and value as
  /// Whether the file is watched and reloaded when it changes (a checkpoint that training
  /// rewrites); a published model is loaded once.
  bool watch = true;
  std::chrono::milliseconds poll{100};  ///< how often the checkpoint file is checked for a change
  /// The CPUs the loop's thread, and the kernel threads it starts, run on (serve/cpus.h); empty:
  /// wherever the process may.
  std::vector<int> cpus;
  /// Reads the checkpoint, at start and whenever the file changes (called on the loop's thread):
  /// tests hold the first load here.
  std::function<std::shared_ptr<const Weights>(const std::string& path)> load = [](const std::string& path) {
    return load_weights(path);
  };
  /// Called on the loop's thread before each decoding pass (while any sequence runs), after the
  /// step boundary's reload, cancellations and admissions: tests hold the loop here.
  std::function<void()> before_step;
};

/// The default context of a sequence: real models have thousands of positions, and a cache of
/// every one of them for every sequence would take gigabytes.
inline constexpr std::size_t kDefaultContext = 2048;

/// The decoding loop and its queue.
class Scheduler {
 public:
  /// Checks that the file (or folder) exists (throws if not) and starts the loop's thread, which
  /// loads it with options.load first: until then requests get not_ready().
  Scheduler(std::string path, SchedulerOptions options, Metrics& metrics);
  ~Scheduler();  ///< stop().
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Queues a request, or refuses it: 400 (its checks against the current model), 503 with
  /// code "loading", "queue_full" (the queue holds options.queue requests) or "draining".
  std::variant<std::shared_ptr<Job>, ApiError> submit(const CompletionRequest& request);
  /// Renders a chat request with the current weights' chat template and submits it; a 400 when
  /// they have none (chat_completion_request).
  std::variant<std::shared_ptr<Job>, ApiError> submit_chat(const ChatRequest& request);

  std::shared_ptr<const Weights> weights() const;  ///< The weights new requests get (null while loading).
  /// Waits for the first load to end: returns its weights, or throws its error (the loop then
  /// stops and every request gets not_ready()).
  std::shared_ptr<const Weights> wait_loaded();
  /// wait_loaded() for at most `limit`: null if the first load is still going on then.
  std::shared_ptr<const Weights> wait_loaded_for(std::chrono::milliseconds limit);
  /// Why requests cannot be served while there are no weights: 503 "loading" during the first load
  /// (retry shortly), 500 "load_failed" naming the error once it failed (retrying will not help).
  ApiError not_ready() const;
  const SchedulerOptions& options() const { return options_; }  ///< As constructed.
  /// The tokens a sequence of these weights holds: options.ctx, or the model's max_len up to
  /// kDefaultContext.
  std::size_t context(const Weights& weights) const;
  /// Stops admitting new requests (they get 503 "draining"); the queued and running ones go on.
  void drain();
  bool draining() const { return draining_; }  ///< Whether drain() or stop() was called.
  /// Stops the loop (and admitting): unfinished jobs end at once with a 503 error.
  void stop();
  /// Nothing running or waiting.
  bool idle() const;
  /// @{ Requests decoding now (their sequences), and waiting.
  std::size_t running() const;
  std::size_t waiting() const;
  /// @}

 private:
  struct Slot;
  struct Generation;
  ModelLimits limits(const Weights& weights) const;
  std::shared_ptr<const Weights> load() const;
  void loop();
  void reload_if_changed();
  void admit();
  void finish_cancelled();
  void advance(Generation& generation);
  void emit(Generation& generation, std::size_t sequence, std::span<const float> logits);
  void finish(Generation& generation, std::size_t sequence, const char* reason);
  void end_job(Job& job, std::optional<ApiError> error);
  void fail_generation(Generation& generation, const std::string& message);

  const std::string path_;
  const SchedulerOptions options_;
  Metrics& metrics_;

  mutable std::mutex mutex_;  // guards the fields up to thread_
  std::condition_variable wake_, loaded_;
  std::deque<std::shared_ptr<Job>> waiting_;
  std::shared_ptr<const Weights> current_;  // null until the first load
  std::exception_ptr load_error_;           // why the first load failed
  std::size_t used_ = 0;  // sequences in use, over every generation
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::thread thread_;

  // The loop thread's own state.
  std::list<Generation> generations_;  // the newest last: the current weights
  struct FileSignature {
    std::uint64_t inode = 0, size = 0;
    std::int64_t mtime_ns = 0;
    bool operator==(const FileSignature&) const = default;
  };
  std::optional<FileSignature> signature_;
  std::chrono::steady_clock::time_point last_poll_;
};

}  // namespace tapegrad::serve
